"""OpenAI chat and text completions over the engine: convert, generate (whole or streamed), format."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from llamadecide.engine import Engine, GenerationResult, SamplingParams, TokenEvent, json_grammar
from llamadecide.errors import InvalidRequestError, UnsupportedError
from llamadecide.server.protocol.chat import ChatCompletionRequest, CompletionRequest, SamplingFields
from llamadecide.server.scheduler import EngineScheduler, shutting_down

log = logging.getLogger(__name__)
_END = object()


@dataclass
class Generated:
    text: str = ""
    tokens: list[TokenEvent] = field(default_factory=list)
    result: GenerationResult | None = None


def _message_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind == "text":
            texts.append(str(part.get("text", "")))
        elif kind in ("image_url", "input_image", "input_audio", "file"):
            raise UnsupportedError(
                f"{kind} content is not supported: this server runs a text-only model", param=f"{where}[{j}]"
            )
        else:
            raise InvalidRequestError(f"unknown content part type {kind!r}", param=f"{where}[{j}]")
    return "".join(texts)


class ChatServing:
    def __init__(self, engine: Engine, scheduler: EngineScheduler, *, model_name: str, max_tokens: int) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.model_name = model_name
        self.max_tokens = max_tokens

    # -- convert ----------------------------------------------------------------------------

    def _unknown_fields(self, request: SamplingFields) -> None:
        if request.model_extra:
            log.info("ignoring unknown request fields: %s", ", ".join(sorted(request.model_extra)))

    def _params(
        self,
        request: SamplingFields,
        prompt_len: int,
        *,
        max_tokens: int | None,
        logprobs: bool,
        top_logprobs: int,
        grammar: str | None,
    ) -> SamplingParams:
        if request.n != 1:
            raise UnsupportedError("only n=1 is supported", param="n")
        if max_tokens is not None and max_tokens > self.max_tokens:
            raise InvalidRequestError(f"max_tokens may be at most {self.max_tokens}", param="max_tokens")
        room = self.engine.n_ctx - prompt_len
        if room < 1:
            raise InvalidRequestError(
                f"the prompt has {prompt_len} tokens and fills the {self.engine.n_ctx}-token context", param="messages"
            )
        stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
        if len(stop) > 16:
            raise InvalidRequestError("at most 16 stop sequences", param="stop")
        bias: dict[int, float] = {}
        for key, value in (request.logit_bias or {}).items():
            if not key.lstrip("-").isdigit() or not 0 <= int(key) < self.engine.n_vocab:
                raise InvalidRequestError(f"logit_bias key {key!r} is not a token id of this model", param="logit_bias")
            bias[int(key)] = float(value)
        return SamplingParams(
            max_tokens=min(max_tokens or self.max_tokens, room),
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            min_p=request.min_p,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            seed=request.seed,
            stop=stop,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            grammar=grammar,
            logit_bias=bias,
        )

    def prepare_chat(self, request: ChatCompletionRequest) -> tuple[list[int], SamplingParams]:
        self._unknown_fields(request)
        if request.tools:
            raise UnsupportedError("tool calling is not supported", param="tools")
        messages = [
            {
                "role": "system" if m.role == "developer" else m.role,
                "content": _message_text(m.content, f"messages[{i}].content"),
            }
            for i, m in enumerate(request.messages)
        ]
        prompt = self.engine.tokenize_prompt(self.engine.render_chat(messages))
        grammar = None
        if request.response_format and request.response_format.type == "json_object":
            grammar = json_grammar()
        elif request.response_format and request.response_format.type == "json_schema":
            spec = request.response_format.json_schema or {}
            grammar = json_grammar(spec.get("schema", spec))
        params = self._params(
            request,
            len(prompt),
            max_tokens=request.max_completion_tokens or request.max_tokens,
            logprobs=request.logprobs,
            top_logprobs=request.top_logprobs or 0,
            grammar=grammar,
        )
        return prompt, params

    def prepare_completion(self, request: CompletionRequest) -> tuple[list[int], SamplingParams]:
        self._unknown_fields(request)
        prompts = [request.prompt] if isinstance(request.prompt, str) else request.prompt
        if len(prompts) != 1:
            raise UnsupportedError("exactly one prompt per request is supported", param="prompt")
        if request.echo:
            raise UnsupportedError("echo is not supported", param="echo")
        if not prompts[0]:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        prompt = self.engine.tokenize_prompt(prompts[0])
        top = request.logprobs or 0
        params = self._params(
            request,
            len(prompt),
            max_tokens=request.max_tokens or 16,
            logprobs=request.logprobs is not None,
            top_logprobs=top,
            grammar=None,
        )
        return prompt, params

    # -- run --------------------------------------------------------------------------------

    def _generate(self, prompt: list[int], params: SamplingParams, emit, cancelled: threading.Event) -> Generated:
        out = Generated()
        iterator = self.engine.generate(prompt, params)
        try:
            for item in iterator:
                if isinstance(item, GenerationResult):
                    out.result = item
                    break
                out.tokens.append(item)
                out.text += item.text
                if emit is not None:
                    emit(item)
                if cancelled.is_set():
                    break
        finally:
            iterator.close()
        return out

    async def complete(
        self, prompt: list[int], params: SamplingParams, *, disconnected: Callable[[], Awaitable[bool]] | None = None
    ) -> Generated:
        """The whole generation. A client that goes away stops it within a token (or before it
        starts); so does a shutdown whose drain time ran out (503: the answer would be cut)."""
        job = self.scheduler.new_job()
        generated = await self.scheduler.run(
            self._generate, prompt, params, None, job.cancelled, job=job, disconnected=disconnected
        )
        if job.cancelled.is_set():
            raise shutting_down()
        return generated

    def start_stream(self, prompt: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent | Generated]:
        """Admit the generation now (a full queue is a 503 before the response starts) and return
        its events: tokens as they come, then the Generated summary. Closing the iterator (a client
        that went away) stops generation at the next token and frees the engine."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        job = self.scheduler.new_job()
        cancelled = job.cancelled

        def emit(item: TokenEvent) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def run() -> None:
            try:
                result = self._generate(prompt, params, emit, cancelled)
                if job.timed_out:
                    raise job.timeout_error()
                loop.call_soon_threadsafe(queue.put_nowait, result)
            except BaseException as exc:  # delivered to the consumer, which raises it
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, _END)

        self.scheduler.submit_stream(run, job)

        async def events() -> AsyncIterator[TokenEvent | Generated]:
            try:
                while True:
                    item = await queue.get()
                    if item is _END:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    yield item
            finally:
                cancelled.set()

        return events()

    # -- format -----------------------------------------------------------------------------

    def _logprob_entry(self, event: TokenEvent) -> dict[str, Any]:
        def token(t: int) -> tuple[str, list[int]]:
            text = self.engine.detokenize([t], special=True)
            return text, list(text.encode("utf-8"))

        text, raw = token(event.token)
        top = []
        for t, lp in event.top_logprobs:
            ttext, traw = token(t)
            top.append({"token": ttext, "logprob": lp, "bytes": traw})
        return {"token": text, "logprob": event.logprob, "bytes": raw, "top_logprobs": top}

    @staticmethod
    def _usage(result: GenerationResult | None) -> dict[str, Any]:
        prompt = result.prompt_tokens if result else 0
        completion = result.completion_tokens if result else 0
        cached = result.cached_tokens if result else 0
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def chat_response(self, generated: Generated, params: SamplingParams) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": generated.text},
            "finish_reason": generated.result.finish_reason if generated.result else "stop",
            "logprobs": None,
        }
        if params.logprobs:
            choice["logprobs"] = {"content": [self._logprob_entry(t) for t in generated.tokens if t.token >= 0]}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": self._usage(generated.result),
        }

    def completion_response(self, generated: Generated, params: SamplingParams) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "text": generated.text,
            "logprobs": None,
            "finish_reason": generated.result.finish_reason if generated.result else "stop",
        }
        if params.logprobs:
            entries = [self._logprob_entry(t) for t in generated.tokens if t.token >= 0]
            choice["logprobs"] = {
                "tokens": [e["token"] for e in entries],
                "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": [],
            }
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": self._usage(generated.result),
        }

    async def chat_sse(
        self, events: AsyncIterator[TokenEvent | Generated], params: SamplingParams, include_usage: bool
    ) -> AsyncIterator[bytes]:
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(
            delta: dict, finish: str | None = None, logprobs: Any = None, usage: Any = None, choices: bool = True
        ) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
            body: dict[str, Any] = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model_name,
                "choices": [choice] if choices else [],
            }
            if usage is not None:
                body["usage"] = usage
            return f"data: {json.dumps(body)}\n\n".encode()

        yield chunk({"role": "assistant", "content": ""})
        summary: Generated | None = None
        try:
            async for item in events:
                if isinstance(item, Generated):
                    summary = item
                elif item.text or (params.logprobs and item.token >= 0):
                    logprobs = {"content": [self._logprob_entry(item)]} if params.logprobs and item.token >= 0 else None
                    yield chunk({"content": item.text}, logprobs=logprobs)
        except Exception as exc:  # the stream has started: report in-band, then end it
            from llamadecide.server.errors import error_body

            log.exception("error while streaming")
            yield f"data: {json.dumps(error_body(str(exc), 'server_error'))}\n\n".encode()
        finish = summary.result.finish_reason if summary and summary.result else "stop"
        yield chunk({}, finish=finish)
        if include_usage:
            yield chunk({}, usage=self._usage(summary.result if summary else None), choices=False)
        yield b"data: [DONE]\n\n"
