"""Generation: sampling settings, the llama.cpp sampler chain, the token loop, and turning a
token stream into text with stop strings (no partial UTF-8 characters, no stop string ever emitted)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from llama_cpp import _internals as internals
from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar, json_schema_to_gbnf

from llamadecide.engine.kv_cache import KVCache
from llamadecide.engine.values import GenerationResult, TokenEvent
from llamadecide.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0  # 0: none; n > 0: the n most likely tokens at each step
    logprobs: bool = False
    grammar: str | None = None  # GBNF text (e.g. from a JSON schema)
    logit_bias: dict[int, float] = field(default_factory=dict)


def json_grammar(schema: dict[str, Any] | None = None) -> str:
    """GBNF that admits any JSON object (schema None) or documents matching a JSON schema."""
    if schema is None:
        return JSON_GBNF
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises plain exceptions for unsupported schema features
        raise InvalidRequestError(f"unsupported JSON schema: {exc}", param="response_format.json_schema") from exc


def build_sampler(model: internals.LlamaModel, params: SamplingParams, default_seed: int) -> internals.LlamaSampler:
    sampler = internals.LlamaSampler()
    if params.logit_bias:
        sampler.add_logit_bias(model.n_vocab(), params.logit_bias)
    if params.grammar:
        sampler.add_grammar(model, LlamaGrammar.from_string(params.grammar, verbose=False))
    if params.repeat_penalty != 1.0 or params.presence_penalty or params.frequency_penalty:
        sampler.add_penalties(
            model.n_vocab(), 64, params.repeat_penalty, params.frequency_penalty, params.presence_penalty
        )
    if params.temperature <= 0.0:
        sampler.add_greedy()
        return sampler
    if params.top_k > 0:
        sampler.add_top_k(params.top_k)
    if params.top_p < 1.0:
        sampler.add_top_p(params.top_p, 1)
    if params.min_p > 0.0:
        sampler.add_min_p(params.min_p, 1)
    sampler.add_temp(params.temperature)
    sampler.add_dist(default_seed if params.seed is None else params.seed)
    return sampler


class TextAssembler:
    """Accumulates token bytes and releases text that is complete UTF-8 and cannot be the
    beginning of a stop string."""

    def __init__(self, stop: Sequence[str]) -> None:
        self._stop = [s for s in stop if s]
        self._pending = b""
        self._held = ""
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        self._pending += piece
        try:
            text = self._pending.decode("utf-8")
            self._pending = b""
        except UnicodeDecodeError as exc:
            if exc.start == 0 and len(self._pending) - exc.start < 4:
                return ""  # an incomplete multi-byte character: wait for the next token
            text = self._pending[: exc.start].decode("utf-8")
            self._pending = self._pending[exc.start :]
        self._held += text
        for stop in self._stop:
            at = self._held.find(stop)
            if at >= 0:
                self.stopped = True
                out, self._held = self._held[:at], ""
                return out
        keep = self._holdback()
        out, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
        return out

    def flush(self) -> str:
        out = self._held + self._pending.decode("utf-8", errors="replace")
        self._held, self._pending = "", b""
        return "" if self.stopped else out

    def _holdback(self) -> int:
        """Length of the longest tail of the held text that begins some stop string."""
        best = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(self._held)), 0, -1):
                if self._held.endswith(stop[:n]):
                    best = max(best, n)
                    break
        return best


def generate_tokens(
    kv: KVCache,
    decoder_ctx: internals.LlamaContext,
    model: internals.LlamaModel,
    prompt: list[int],
    params: SamplingParams,
    *,
    default_seed: int,
    is_end: Callable[[int], bool],
) -> Iterator[TokenEvent | GenerationResult]:
    """Stream tokens for a prompt; the last item is a GenerationResult. The prompt but its last
    token is evaluated in the engine's deterministic call shapes (reusable by later scoring), the
    rest one token per call."""
    reused = kv.prefill(prompt[:-1], extra=1 + min(params.max_tokens, kv.n_ctx - len(prompt)))
    kv.decode_next(prompt[-1])
    sampler = build_sampler(model, params, default_seed)
    assembler = TextAssembler(params.stop)
    produced = 0
    finish = "length"
    try:
        while produced < params.max_tokens and kv.free > 0:
            row = kv.decoder.logprobs(-1) if (params.logprobs or params.top_logprobs) else None
            token = sampler.sample(decoder_ctx, -1)
            if is_end(token):
                finish = "stop"
                break
            produced += 1
            text = assembler.feed(model.detokenize([token], special=False))
            top: tuple[tuple[int, float], ...] = ()
            if row is not None and params.top_logprobs:
                best = np.argpartition(-row, params.top_logprobs)[: params.top_logprobs]
                top = tuple((int(t), float(row[t])) for t in best[np.argsort(-row[best])])
            yield TokenEvent(token, text, float(row[token]) if row is not None else None, top)
            if assembler.stopped:
                finish = "stop"
                break
            kv.decode_next(token)
        tail = assembler.flush()
        if tail:
            yield TokenEvent(-1, tail, None, ())
        yield GenerationResult(finish, len(prompt), produced, reused)
    finally:
        sampler.close()
