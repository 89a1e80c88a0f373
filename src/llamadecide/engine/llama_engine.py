"""The llama.cpp engine: the only module that drives `llama_cpp`.

One llama context with a unified KV cache and many sequences. Sequence 0 holds the most recent
prompt prefix, reused across calls by longest common token prefix; the highest sequences hold
pinned prefixes (k-shot demonstrations) that a prompt starting with them copies from (on a unified
cache a copy only tags cells), whatever ran in between. Option continuations are
evaluated together as a token trie: each node is one batch row whose sequence ids are the
continuations passing through it, so a shared prefix is evaluated once and every continuation
sees exactly its own path (llama.cpp masks attention per sequence).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import llama_cpp
import numpy as np
from llama_cpp import _internals as internals
from llama_cpp import _logger as llama_logger

from llamadecide.engine.chat_template import BUILTIN_TEMPLATES, ChatTemplate, builtin_template_for
from llamadecide.engine.generation import SamplingParams, TextAssembler, build_sampler
from llamadecide.engine.model_files import file_sha256, gguf_problem
from llamadecide.engine.trie import build_trie, continuation_paths, plan_groups
from llamadecide.errors import ContextOverflowError, InvalidRequestError, ModelLoadError

log = logging.getLogger(__name__)

_backend_lock = threading.Lock()
_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True


@dataclass(frozen=True)
class EngineConfig:
    model_path: Path
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_gpu_layers: int = 0  # 0: CPU only; -1: every layer on the GPU
    n_seq_max: int = 0  # 0: as many KV sequences as llama.cpp allows
    # KV sequences kept aside to hold pinned prompt prefixes (a question-first layout's question
    # block, k-shot demonstrations) across calls that evaluate other prompts in between; each one
    # fewer option scored in a single group.
    pinned_prefixes: int = 8
    # Most KV cells the pinned prefixes may hold together (0: half the context).
    pinned_cells: int = 0
    seed: int = 0
    flash_attn: bool = False
    use_mmap: bool = True
    # llama.cpp's repacked weight layouts (CPU_REPACK, e.g. for Q4_K) switch between GEMM and GEMV
    # kernels by batch size, so a token's numbers would depend on what else is in its batch. Off by
    # default: no measurable prompt speed-up on the bundled models, and scores stay batch-independent.
    repack: bool = False
    chat_template: str | None = None  # Jinja source, or a built-in name (chatml, gemma), overriding the GGUF's
    verbose: bool = False


@dataclass(frozen=True)
class TokenEvent:
    """One generated token, with its log-probability under the model (before sampling filters)."""

    token: int
    text: str  # text released by this token (may be empty while a character or stop string is pending)
    logprob: float | None
    top_logprobs: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class GenerationResult:
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


def _log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64, copy=False)
    peak = row.max()
    return row - (peak + np.log(np.exp(row - peak).sum()))


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Engine:
    """A loaded GGUF model. Thread-safe: one call drives the llama context at a time."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        path = Path(config.model_path)
        if not path.is_file():
            raise ModelLoadError(f"model file not found: {path}")
        llama_logger.set_verbose(config.verbose)
        _init_backend()
        self._lock = threading.RLock()

        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0x7FFFFFFF if config.n_gpu_layers < 0 else config.n_gpu_layers
        # The library default (-1, "auto") crashes on decode with this build; be explicit.
        model_params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP if config.use_mmap else llama_cpp.LLAMA_LOAD_MODE_NONE
        model_params.use_extra_bufts = config.repack
        problem = gguf_problem(path)
        if problem is not None:
            raise ModelLoadError(problem)
        try:
            self._model = internals.LlamaModel(path_model=str(path), params=model_params, verbose=config.verbose)
        except ValueError as exc:
            raise ModelLoadError(f"cannot load {path}: {exc}") from exc

        n_ctx_train = self._model.n_ctx_train()
        n_ctx = config.n_ctx if config.n_ctx > 0 else n_ctx_train
        max_seq = llama_cpp.llama_max_parallel_sequences()
        n_seq = min(config.n_seq_max or max_seq, max_seq)
        if n_seq < 2:
            raise ModelLoadError("n_seq_max must be at least 2 (one prompt sequence, one option)")
        n_threads = config.n_threads or max(os.cpu_count() or 1, 1)
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = min(config.n_batch, n_ctx)
        ctx_params.n_ubatch = min(config.n_ubatch, ctx_params.n_batch)
        ctx_params.n_seq_max = n_seq
        ctx_params.n_threads = n_threads
        ctx_params.n_threads_batch = config.n_threads_batch or n_threads
        ctx_params.kv_unified = True  # one cache shared by all sequences, so prefixes are shared
        ctx_params.swa_full = True  # sliding-window models keep every position, so prefixes can be trimmed
        ctx_params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if config.flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        ctx_params.no_perf = True
        try:
            self._ctx = internals.LlamaContext(model=self._model, params=ctx_params, verbose=config.verbose)
        except ValueError as exc:
            raise ModelLoadError(f"cannot create a llama context for {path}: {exc}") from exc

        self.model_path = path
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx.ctx)
        self.n_batch = ctx_params.n_batch
        self.n_seq_max = llama_cpp.llama_n_seq_max(self._ctx.ctx)
        self.n_vocab = self._model.n_vocab()
        self.n_threads = n_threads
        self.n_gpu_layers = config.n_gpu_layers
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, self.n_seq_max)
        self._memory = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._cached: list[int] = []  # tokens held by sequence 0
        # Pinned prefixes: token tuple -> the KV sequence holding it (least recently used first).
        self._pins: OrderedDict[tuple[int, ...], int] = OrderedDict()
        self._pin_sequences = list(range(self.n_seq_max - 1, self.n_seq_max - 1 - max(0, min(config.pinned_prefixes,
                                                                                                self.n_seq_max - 2)), -1))
        self._pin_cell_limit = config.pinned_cells if config.pinned_cells > 0 else self.n_ctx // 2
        self.last_reused_tokens = 0  # prompt tokens the last scoring call took from the cache
        # Work done since load: llama_decode calls and the batch rows (tokens) they evaluated.
        self.counters = {"decode_calls": 0, "rows": 0}

        self.metadata = self._model.metadata()
        self.model_name = path.stem  # what clients see; GGUF general.name is often a training-run label
        self.bos_id = self._model.token_bos()
        self.eos_id = self._model.token_eos()
        self._add_bos = bool(self._model.add_bos_token()) and self.bos_id >= 0
        self.chat_template = self._load_template(config.chat_template)
        self.end_of_answer = self._end_of_answer_tokens()
        self._sha256: str | None = None

    # -- identity ---------------------------------------------------------------------------

    @property
    def model_sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = file_sha256(self.model_path)
        return self._sha256

    @property
    def gpu_offload_supported(self) -> bool:
        return bool(llama_cpp.llama_supports_gpu_offload())

    def close(self) -> None:
        with self._lock:
            if self._batch is not None:
                llama_cpp.llama_batch_free(self._batch)
                self._batch = None
            self._ctx.close()
            self._model.close()

    # -- text -------------------------------------------------------------------------------

    def _token_text(self, token: int) -> str:
        return self._model.detokenize([token], special=True).decode("utf-8", errors="replace")

    def _load_template(self, override: str | None) -> ChatTemplate:
        if override:
            source = BUILTIN_TEMPLATES.get(override, override)
            self.chat_template_origin = f"builtin:{override}" if override in BUILTIN_TEMPLATES else "override"
        elif self.metadata.get("tokenizer.chat_template"):
            source = self.metadata["tokenizer.chat_template"]
            self.chat_template_origin = "gguf"
        else:
            name = builtin_template_for(self.metadata.get("general.architecture", ""))
            source = BUILTIN_TEMPLATES[name]
            self.chat_template_origin = f"builtin:{name}"
            log.warning("%s has no chat template (a base model?); using the built-in %r template",
                        self.model_path.name, name)
        bos = self._token_text(self.bos_id) if self.bos_id >= 0 else ""
        eos = self._token_text(self.eos_id) if self.eos_id >= 0 else ""
        template = ChatTemplate(source=source, bos_token=bos, eos_token=eos)
        template.check_generation_prompt()
        return template

    def _end_of_answer_tokens(self) -> list[int]:
        """Tokens the template puts after a reply, up to and including the first end-of-generation
        token: scoring them is what stops a prefix option beating a longer one."""
        suffix = self.tokenize(self.chat_template.answer_suffix())
        for i, token in enumerate(suffix):
            if self.is_end_of_generation(token):
                return suffix[: i + 1]
        if self.eos_id >= 0:
            return [self.eos_id]
        raise ModelLoadError("cannot find the end-of-answer token of this model's chat template")

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Tokens of a piece of text inside a prompt (no BOS added)."""
        return self._model.tokenize(text.encode("utf-8"), add_bos=False, special=special)

    def tokenize_prompt(self, text: str) -> list[int]:
        """Tokens of a whole rendered prompt: BOS added when the model wants one and the
        template did not already write it."""
        tokens = self.tokenize(text)
        if self._add_bos and (not tokens or tokens[0] != self.bos_id):
            tokens.insert(0, self.bos_id)
        return tokens

    def tokenize_answers(self, prompt_text: str, answers: Sequence[str]) -> tuple[list[int], list[list[int]]]:
        """The prompt's tokens, and the tokens of `prompt_text + answer` for each answer, exactly as
        tokenize_prompt would give them, without tokenizing the whole prompt again per answer:
        llama.cpp cuts the text at special tokens before it tokenizes the pieces, so only the text
        after the prompt's last special token can change with the answer. (Tokenizing the whole
        prompt per answer made 255 long options cost seconds before any evaluation.)"""
        prompt = self.tokenize_prompt(prompt_text)
        last = max((i for i, t in enumerate(prompt) if self._is_special(t)), default=-1)
        start = prompt_text.rfind(self._token_text(prompt[last])) if last >= 0 else -1
        if start < 0 or self.tokenize(prompt_text[start:]) != prompt[last:]:
            return prompt, [self.tokenize_prompt(prompt_text + answer) for answer in answers]
        head, tail = prompt[:last], prompt_text[start:]
        return prompt, [head + self.tokenize(tail + answer) for answer in answers]

    def _is_special(self, token: int) -> bool:
        attr = llama_cpp.llama_vocab_get_attr(self._model.vocab, token)
        return bool(attr & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED))

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return self._model.detokenize(list(tokens), special=special).decode("utf-8", errors="replace")

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._model.vocab, token))

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> str:
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    # -- low level --------------------------------------------------------------------------

    def _decode(self, tokens: Sequence[int], positions: Sequence[int], seq_ids: Sequence[Sequence[int]],
                want_logits: Sequence[bool]) -> None:
        batch = self._batch
        n = len(tokens)
        batch.n_tokens = n
        for i in range(n):
            batch.token[i] = tokens[i]
            batch.pos[i] = positions[i]
            ids = seq_ids[i]
            batch.n_seq_id[i] = len(ids)
            row = batch.seq_id[i]
            for j, s in enumerate(ids):
                row[j] = s
            batch.logits[i] = want_logits[i]
        self.counters["decode_calls"] += 1
        self.counters["rows"] += n
        code = llama_cpp.llama_decode(self._ctx.ctx, batch)
        if code != 0:
            # 1: no KV slot; negative: error. Either way the cache state is no longer known.
            self._reset_cache()
            raise RuntimeError(f"llama_decode failed with code {code}")

    def _logprobs_row(self, batch_index: int) -> np.ndarray:
        pointer = llama_cpp.llama_get_logits_ith(self._ctx.ctx, batch_index)
        row = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        return _log_softmax(row)

    def _reset_cache(self) -> None:
        llama_cpp.llama_memory_clear(self._memory, True)
        self._cached = []
        self._pins.clear()

    @property
    def _pinned_cells(self) -> int:
        return sum(len(tokens) for tokens in self._pins)

    def _release_pins(self) -> None:
        for sequence in self._pins.values():
            llama_cpp.llama_memory_seq_rm(self._memory, sequence, -1, -1)
        self._pins.clear()

    def _make_room(self, n_tokens: int) -> None:
        """Pinned prefixes give way to a prompt that would not fit beside them."""
        if self._pins and n_tokens + self._pinned_cells > self.n_ctx:
            self._release_pins()

    @property
    def pinned(self) -> list[tuple[int, ...]]:
        """The pinned prefixes, least recently used first."""
        return list(self._pins)

    def pin_prefix(self, tokens: Sequence[int]) -> bool:
        """Keep `tokens` evaluated in a sequence of its own, so a later prompt that starts with them
        takes their KV from there even after other prompts ran in between (a question-first
        layout's question block, k-shot demonstrations). Least recently used pins give way when the
        sequences or cells set aside for pins are full. Returns whether the prefix is pinned: one
        larger than the cell limit is not, and its prompts are evaluated per call."""
        key = tuple(tokens)
        with self._lock:
            if key in self._pins:
                self._pins.move_to_end(key)
                return True
            if not self._pin_sequences or not key or len(key) > self._pin_cell_limit:
                return False
            while self._pins and (len(self._pins) == len(self._pin_sequences)
                                  or len(key) + self._pinned_cells > self._pin_cell_limit):
                _, sequence = self._pins.popitem(last=False)
                llama_cpp.llama_memory_seq_rm(self._memory, sequence, -1, -1)
            sequence = next(s for s in self._pin_sequences if s not in self._pins.values())
            # Evaluated from position 0 in its own sequence, whatever part of it sequence 0 holds:
            # the same batches every time it is pinned (the KV cells it lands in still depend on
            # what the cache holds, which moves numbers by llama.cpp's layout noise).
            self._fill(key, 0, sequence)
            self._pins[key] = sequence
            return True

    def _prepare_prefix(self, tokens: Sequence[int], *, fill: bool = True) -> int:
        """Make sequence 0 hold exactly `tokens` (with `fill` False: the longest part of them the
        cache already has, the rest left to the caller); returns how many were reused from the
        cache (sequence 0's own tokens, or a pinned prefix's, whichever covers more)."""
        reuse = common_prefix_length(self._cached, tokens)
        pinned, pinned_sequence = max(((common_prefix_length(pin, tokens), s) for pin, s in self._pins.items()),
                                      default=(0, -1))
        if pinned > reuse:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, -1, -1)
            llama_cpp.llama_memory_seq_cp(self._memory, pinned_sequence, 0, 0, pinned)
            self._cached = list(tokens[:pinned])
            reuse = pinned
        if reuse < len(self._cached):
            if not llama_cpp.llama_memory_seq_rm(self._memory, 0, reuse, -1):
                self._reset_cache()
                reuse = 0
            else:
                del self._cached[reuse:]
        if fill:
            self._fill(tokens, reuse, 0)
            self._cached.extend(tokens[reuse:])
        return reuse

    def _fill(self, tokens: Sequence[int], start: int, sequence: int) -> None:
        """Evaluate tokens[start:] into `sequence` at their own positions, in n_batch chunks, no logits."""
        for begin in range(start, len(tokens), self.n_batch):
            chunk = tokens[begin : begin + self.n_batch]
            self._decode(chunk, range(begin, begin + len(chunk)), [(sequence,)] * len(chunk), [False] * len(chunk))

    def _check_fits(self, n_tokens: int, what: str) -> None:
        if n_tokens > self.n_ctx:
            raise ContextOverflowError(
                f"{what} needs {n_tokens} tokens but the context holds {self.n_ctx} "
                "(shorten the input or raise n_ctx)",
                param="input",
            )

    # -- scoring ----------------------------------------------------------------------------

    def score_continuations(self, prefix: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Log-probability of every token of every continuation given `prefix` and the
        continuation's own earlier tokens. The part of the prefix the cache lacks and the
        continuations' trie go in one batch (one llama_decode call when it fits n_batch): the
        prefix's tokens belong to sequence 0 and to every continuation's sequence, each trie node
        to the continuations passing through it."""
        if not prefix:
            raise InvalidRequestError("the prompt is empty")
        if not continuations or any(len(c) == 0 for c in continuations):
            raise InvalidRequestError("every continuation needs at least one token")
        longest = max(len(c) for c in continuations)
        self._check_fits(len(prefix) + longest, "the prompt with its longest answer")
        with self._lock:
            self._make_room(len(prefix) + longest)
            self.last_reused_tokens = self._prepare_prefix(prefix[:-1], fill=False)
            budget = self.n_ctx - (len(prefix) - 1) - self._pinned_cells
            groups = plan_groups(continuations, max_members=self.n_seq_max - 1 - len(self._pin_sequences),
                                 max_nodes=budget)
            results: list[np.ndarray] = [np.empty(0)] * len(continuations)
            for group in groups:
                scored = self._score_group(prefix, [continuations[i] for i in group])
                for i, values in zip(group, scored):
                    results[i] = values
            return results

    def _score_group(self, prefix: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[np.ndarray]:
        nodes = build_trie(prefix[-1], continuations)
        base = len(prefix) - 1
        members = len(continuations)
        for s in range(1, members + 1):
            llama_cpp.llama_memory_seq_cp(self._memory, 0, s, -1, -1)
        # Rows: the prefix tokens sequence 0 lacks (kept there afterwards), then every trie node
        # that has children. A leaf's output is never read and nothing attends to it: not evaluated.
        tail_start = len(self._cached)
        tail = list(prefix[tail_start:-1])
        everyone = [0, *range(1, members + 1)]
        inner = [i for i, n in enumerate(nodes) if n.children]
        tokens = tail + [nodes[i].token for i in inner]
        positions = list(range(tail_start, base)) + [base + nodes[i].depth for i in inner]
        seq_ids = [everyone] * len(tail) + [[m + 1 for m in nodes[i].members] for i in inner]
        wants = [False] * len(tail) + [True] * len(inner)
        child_logprobs: dict[int, dict[int, float]] = {}
        try:
            for start in range(0, len(tokens), self.n_batch):
                end = start + self.n_batch
                self._decode(tokens[start:end], positions[start:end], seq_ids[start:end], wants[start:end])
                for row_index in range(max(start, len(tail)), min(end, len(tokens))):
                    node = nodes[inner[row_index - len(tail)]]
                    row = self._logprobs_row(row_index - start)
                    child_logprobs[inner[row_index - len(tail)]] = {tok: float(row[tok]) for tok in node.children}
                if start < len(tail):
                    self._cached.extend(tail[start:min(end, len(tail))])
        finally:
            for s in range(1, members + 1):
                llama_cpp.llama_memory_seq_rm(self._memory, s, -1, -1)
        paths = continuation_paths(nodes, continuations)
        return [
            np.array([child_logprobs[p][tok] for p, tok in zip(path, tokens)])
            for path, tokens in zip(paths, continuations)
        ]

    def hidden_state(self, prompt: Sequence[int]) -> np.ndarray:
        """The model's final hidden state (after the output norm, before the vocabulary projection)
        at the prompt's last token: the position the answer is predicted from. Reuses the cached
        prefix, so after scoring the same prompt it costs one token's evaluation."""
        if not prompt:
            raise InvalidRequestError("the prompt is empty")
        self._check_fits(len(prompt), "the prompt")
        with self._lock:
            self._make_room(len(prompt))
            self._prepare_prefix(prompt[:-1])
            llama_cpp.llama_set_embeddings(self._ctx.ctx, True)
            try:
                self._decode(prompt[-1:], [len(prompt) - 1], [(0,)], [True])
                pointer = llama_cpp.llama_get_embeddings_ith(self._ctx.ctx, 0)
                if not pointer:
                    raise RuntimeError("llama.cpp returned no hidden state for this model")
                width = llama_cpp.llama_model_n_embd(self._model.model)
                values = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(width,))
                hidden = values.astype(np.float64)
            finally:
                llama_cpp.llama_set_embeddings(self._ctx.ctx, False)
            self._cached.append(prompt[-1])
            return hidden

    def score_naive(self, tokens: Sequence[int], start: int) -> np.ndarray:
        """Reference path: evaluate `tokens` from an empty cache and return the log-probability of
        each token from index `start` on. One full evaluation per call; used to check the batched
        path and as the benchmark's baseline."""
        if not 1 <= start < len(tokens):
            raise InvalidRequestError("start must fall inside the token sequence")
        self._check_fits(len(tokens), "the sequence")
        with self._lock:
            self._reset_cache()
            out: list[float] = []
            try:
                for chunk_start in range(0, len(tokens), self.n_batch):
                    chunk = tokens[chunk_start : chunk_start + self.n_batch]
                    positions = range(chunk_start, chunk_start + len(chunk))
                    wants = [start - 1 <= p < len(tokens) - 1 for p in positions]
                    self._decode(chunk, positions, [(0,)] * len(chunk), wants)
                    for offset, p in enumerate(positions):
                        if wants[offset]:
                            out.append(float(self._logprobs_row(offset)[tokens[p + 1]]))
            finally:
                self._reset_cache()
            return np.array(out)

    def evaluate(self, tokens: Sequence[int]) -> float:
        """Evaluate a prompt from an empty cache, reading the last position's logits, and return
        the seconds it took (the benchmark's prompt-only baseline)."""
        self._check_fits(len(tokens), "the prompt")
        with self._lock:
            self._reset_cache()
            began = time.perf_counter()
            self._prepare_prefix(tokens[:-1])
            self._decode(tokens[-1:], [len(tokens) - 1], [(0,)], [True])
            self._logprobs_row(0)
            elapsed = time.perf_counter() - began
            self._reset_cache()
            return elapsed

    def clear_cache(self) -> None:
        with self._lock:
            self._reset_cache()

    # -- generation -------------------------------------------------------------------------

    def generate(self, prompt: Sequence[int], params: SamplingParams) -> Iterator[TokenEvent | GenerationResult]:
        """Stream tokens for a prompt; the last item is a GenerationResult. The engine stays
        locked while the iterator is open: close it (or exhaust it) to release the engine."""
        if not prompt:
            raise InvalidRequestError("the prompt is empty")
        self._check_fits(len(prompt) + 1, "the prompt")
        return self._generate(list(prompt), params)

    def _generate(self, prompt: list[int], params: SamplingParams) -> Iterator[TokenEvent | GenerationResult]:
        with self._lock:
            self._make_room(len(prompt) + params.max_tokens)
            reused = self._prepare_prefix(prompt[:-1])
            self._decode(prompt[-1:], [len(prompt) - 1], [(0,)], [True])
            self._cached.append(prompt[-1])
            sampler = build_sampler(self._model, params, self.config.seed)
            assembler = TextAssembler(params.stop)
            produced = 0
            finish = "length"
            try:
                while produced < params.max_tokens and len(self._cached) < self.n_ctx:
                    row = self._logprobs_row(-1) if (params.logprobs or params.top_logprobs) else None
                    token = sampler.sample(self._ctx, -1)
                    if self.is_end_of_generation(token):
                        finish = "stop"
                        break
                    produced += 1
                    text = assembler.feed(self._model.detokenize([token], special=False))
                    top: tuple[tuple[int, float], ...] = ()
                    if row is not None and params.top_logprobs:
                        best = np.argpartition(-row, params.top_logprobs)[: params.top_logprobs]
                        top = tuple((int(t), float(row[t])) for t in best[np.argsort(-row[best])])
                    yield TokenEvent(token, text, float(row[token]) if row is not None else None, top)
                    if assembler.stopped:
                        finish = "stop"
                        break
                    self._decode([token], [len(self._cached)], [(0,)], [True])
                    self._cached.append(token)
                tail = assembler.flush()
                if tail:
                    yield TokenEvent(-1, tail, None, ())
                yield GenerationResult(finish, len(prompt), produced, reused)
            finally:
                sampler.close()
