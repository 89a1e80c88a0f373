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
    # The cost model for skipping work: one llama_decode call costs about as much as this many batch
    # rows (the bundled models on CPU: the weights are streamed once per call). A bound on the answers
    # (`score_trie(epsilon=...)`) expands tries of at least this many nodes best-first, over several
    # calls; a hidden state comes from the scoring call itself unless computing every row's output,
    # as llama.cpp then does, would cost more than a call of its own.
    call_cost_rows: int = 64
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


@dataclass(frozen=True)
class TrieScores:
    """What `Engine.score_trie` computed. rows: for every continuation, the log-probability of each
    of its tokens given the prefix and its own earlier tokens; NaN where a lazy evaluation never
    expanded the node that predicts it (the continuation's probability is then at most that of its
    evaluated part). hidden: the hidden state at the prefix's last token, when asked for."""

    rows: list[np.ndarray]
    hidden: np.ndarray | None = None
    lazy: bool = False

    @property
    def complete(self) -> list[bool]:
        return [not np.isnan(row).any() for row in self.rows]


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


def _gather(nodes: Sequence, continuations: Sequence[Sequence[int]],
            expanded: dict[int, dict[int, float]]) -> list[np.ndarray]:
    """Each continuation's token log-probabilities from the expanded nodes (NaN where the node
    predicting a token was not expanded)."""
    out = []
    for path, tokens in zip(continuation_paths(nodes, continuations), continuations):
        out.append(np.array([expanded[p][tok] if p in expanded else np.nan for p, tok in zip(path, tokens)]))
    return out


def _frontier(nodes: Sequence, expanded: dict[int, dict[int, float]]) -> tuple[list[tuple[int, float]], float]:
    """The unexpanded nodes with children whose parent is expanded, with their prefix probability;
    and the total probability of the continuations that are complete (leaves under expanded nodes)."""
    logmass = {0: 0.0}
    frontier: list[tuple[int, float]] = []
    complete = 0.0
    for index, node in enumerate(nodes):  # parents come before children
        if index not in logmass:
            continue
        if index != 0 and not node.children:
            complete += float(np.exp(logmass[index]))
        elif index in expanded:
            for token, child in node.children.items():
                logmass[child] = logmass[index] + expanded[index][token]
        else:
            frontier.append((index, float(np.exp(logmass[index]))))
    return frontier, complete


def _subtree(nodes: Sequence, start: int) -> list[int]:
    found, stack = [], [start]
    while stack:
        index = stack.pop()
        found.append(index)
        stack.extend(nodes[index].children.values())
    return found


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
        # What a row's output (the vocabulary projection) costs, as a share of the whole row.
        n_params = llama_cpp.llama_model_n_params(self._model.model)
        self._output_share = self.n_vocab * llama_cpp.llama_model_n_embd(self._model.model) / max(n_params, 1)
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
        continuation's own earlier tokens, all exact (`score_trie` without a bound)."""
        return self.score_trie(prefix, continuations).rows

    def score_trie(self, prefix: Sequence[int], continuations: Sequence[Sequence[int]], *, hidden: bool = False,
                   epsilon: float = 0.0) -> TrieScores:
        """Score every continuation of `prefix` as a token trie. The part of the prefix the cache
        lacks and the trie go in one batch (one llama_decode call when it fits n_batch): the
        prefix's tokens belong to sequence 0 and to every continuation's sequence, each trie node
        to the continuations passing through it. With `hidden`, the same call also returns the
        hidden state at the prefix's last token (what a fitted head reads).

        With `epsilon` > 0 and a trie of at least `call_cost_rows` nodes, the trie is expanded
        best-first instead (`_score_lazy`): it stops once the continuations left unexpanded can
        hold at most `epsilon` times the probability already found, and their tokens below the
        frontier are NaN."""
        if not prefix:
            raise InvalidRequestError("the prompt is empty")
        if not continuations or any(len(c) == 0 for c in continuations):
            raise InvalidRequestError("every continuation needs at least one token")
        if epsilon < 0:
            raise InvalidRequestError("epsilon must not be negative", param="epsilon")
        longest = max(len(c) for c in continuations)
        self._check_fits(len(prefix) + longest, "the prompt with its longest answer")
        with self._lock:
            self._make_room(len(prefix) + longest)
            self.last_reused_tokens = self._prepare_prefix(prefix[:-1], fill=False)
            budget = self.n_ctx - (len(prefix) - 1) - self._pinned_cells
            groups = plan_groups(continuations, max_members=self.n_seq_max - 1 - len(self._pin_sequences),
                                 max_nodes=budget)
            if epsilon > 0 and len(groups) == 1:
                nodes = build_trie(prefix[-1], continuations)
                if sum(1 for n in nodes if n.children) >= self.config.call_cost_rows:
                    rows, state = self._score_lazy(prefix, continuations, nodes, epsilon, hidden)
                    return TrieScores(rows, state, lazy=True)
            in_call = hidden and self._outputs_cost_less(len(prefix) - 1 - len(self._cached))
            results: list[np.ndarray] = [np.empty(0)] * len(continuations)
            state = None
            for number, group in enumerate(groups):
                scored, group_state = self._score_group(prefix, [continuations[i] for i in group],
                                                        hidden=in_call and number == 0)
                state = group_state if number == 0 else state
                for i, values in zip(group, scored):
                    results[i] = values
            if hidden and state is None:
                state = self.hidden_state(prefix)  # the prefix is cached now: one row
            return TrieScores(results, state)

    def _outputs_cost_less(self, rows: int) -> bool:
        """Whether computing the output of `rows` prompt rows (what reading a hidden state in a
        batch makes llama.cpp do) costs less than a llama_decode call of its own."""
        return rows * self._output_share <= self.config.call_cost_rows

    def _begin_group(self, prefix: Sequence[int], members: int) -> tuple[list[int], list[int], list[list[int]]]:
        """Give every member sequence the prefix sequence 0 holds; return the rows that evaluate the
        rest of the prefix but its last token (kept in sequence 0 afterwards, shared by all
        members): tokens, positions, sequence ids."""
        for s in range(1, members + 1):
            llama_cpp.llama_memory_seq_cp(self._memory, 0, s, -1, -1)
        tail_start = len(self._cached)
        tail = list(prefix[tail_start:-1])
        everyone = [0, *range(1, members + 1)]
        return tail, list(range(tail_start, len(prefix) - 1)), [everyone] * len(tail)

    def _end_group(self, members: int) -> None:
        for s in range(1, members + 1):
            llama_cpp.llama_memory_seq_rm(self._memory, s, -1, -1)

    def _run_rows(self, tokens: Sequence[int], positions: Sequence[int], seq_ids: Sequence[Sequence[int]],
                  wants: Sequence[bool], reads: dict[int, Sequence[int]], *, tail: int = 0,
                  hidden_row: int | None = None) -> tuple[dict[int, dict[int, float]], np.ndarray | None]:
        """Evaluate rows in n_batch chunks. reads: row index -> the tokens whose log-probability to
        read from its output. The first `tail` rows are prefix tokens of sequence 0 (recorded as
        cached once evaluated). With hidden_row, that row's hidden state is read too (llama.cpp
        then computes every row's output: one call instead of a second one for the hidden state)."""
        found: dict[int, dict[int, float]] = {}
        state = None
        if hidden_row is not None:
            llama_cpp.llama_set_embeddings(self._ctx.ctx, True)
            wants = [True] * len(tokens)  # what llama.cpp does anyway with embeddings on (and warns)
        try:
            for start in range(0, len(tokens), self.n_batch):
                end = min(start + self.n_batch, len(tokens))
                self._decode(tokens[start:end], positions[start:end], seq_ids[start:end], wants[start:end])
                for row_index in range(start, end):
                    if row_index in reads:
                        row = self._logprobs_row(row_index - start)
                        found[row_index] = {tok: float(row[tok]) for tok in reads[row_index]}
                    if row_index == hidden_row:
                        state = self._hidden_row(row_index - start)
                if start < tail:
                    self._cached.extend(tokens[start:min(end, tail)])
        finally:
            if hidden_row is not None:
                llama_cpp.llama_set_embeddings(self._ctx.ctx, False)
        return found, state

    def _hidden_row(self, batch_index: int) -> np.ndarray:
        pointer = llama_cpp.llama_get_embeddings_ith(self._ctx.ctx, batch_index)
        if not pointer:
            raise RuntimeError("llama.cpp returned no hidden state for this model")
        width = llama_cpp.llama_model_n_embd(self._model.model)
        values = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(width,))
        return values.astype(np.float64)

    def _score_group(self, prefix: Sequence[int], continuations: Sequence[Sequence[int]], *,
                     hidden: bool = False) -> tuple[list[np.ndarray], np.ndarray | None]:
        nodes = build_trie(prefix[-1], continuations)
        base = len(prefix) - 1
        members = len(continuations)
        tokens, positions, seq_ids = self._begin_group(prefix, members)
        tail = len(tokens)
        # Then every trie node that has children. A leaf's output is never read and nothing
        # attends to it: not evaluated.
        inner = [i for i, n in enumerate(nodes) if n.children]
        tokens += [nodes[i].token for i in inner]
        positions += [base + nodes[i].depth for i in inner]
        seq_ids += [[m + 1 for m in nodes[i].members] for i in inner]
        wants = [False] * tail + [True] * len(inner)
        try:
            found, state = self._run_rows(tokens, positions, seq_ids, wants,
                                          {tail + r: nodes[i].children for r, i in enumerate(inner)}, tail=tail,
                                          hidden_row=tail if hidden else None)
        finally:
            self._end_group(members)
        child_logprobs = {i: found[tail + r] for r, i in enumerate(inner)}
        return _gather(nodes, continuations, child_logprobs), state

    def _score_lazy(self, prefix: Sequence[int], continuations: Sequence[Sequence[int]], nodes: list, epsilon: float,
                    hidden: bool) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Best-first trie evaluation with a certified bound. Call one evaluates the prefix's tail
        and the root (every continuation's first token). Each further call expands the unexpanded
        nodes of highest prefix probability, each with its whole subtree (so its continuations
        complete in that call), until the prefix probability left on the frontier is at most
        `epsilon` times the probability of the completed continuations: every continuation under
        the frontier is at most its frontier node's probability, so together they hold at most
        that much. After two such calls the rest is expanded whole (exact)."""
        base = len(prefix) - 1
        members = len(continuations)
        tokens, positions, seq_ids = self._begin_group(prefix, members)
        tail = len(tokens)
        tokens.append(nodes[0].token)
        positions.append(base)
        seq_ids.append([m + 1 for m in nodes[0].members])
        expanded: dict[int, dict[int, float]] = {}
        try:
            found, state = self._run_rows(tokens, positions, seq_ids, [False] * tail + [True],
                                          {tail: nodes[0].children}, tail=tail, hidden_row=tail if hidden else None)
            expanded[0] = found[tail]
            taken = 0.0
            for round_number in range(3):
                frontier, complete_mass = _frontier(nodes, expanded)
                frontier_mass = sum(mass for _, mass in frontier)
                if not frontier or frontier_mass <= epsilon * complete_mass:
                    break
                if round_number == 2:
                    chosen = [index for index, _ in frontier]
                else:
                    # How much of an expanded node's prefix probability earlier calls found in its
                    # options (the rest goes to text that is no option): the share to expect now.
                    share = min(1.0, complete_mass / taken) if taken > 0 else 1.0
                    chosen, left = [], frontier_mass
                    for index, mass in sorted(frontier, key=lambda item: -item[1]):
                        if left <= epsilon * (complete_mass + share * (frontier_mass - left)):
                            break
                        chosen.append(index)
                        left -= mass
                    taken += frontier_mass - left
                rows = sorted(i for start in chosen for i in _subtree(nodes, start) if nodes[i].children)
                found, _ = self._run_rows([nodes[i].token for i in rows], [base + nodes[i].depth for i in rows],
                                          [[m + 1 for m in nodes[i].members] for i in rows], [True] * len(rows),
                                          {r: nodes[i].children for r, i in enumerate(rows)})
                for r, i in enumerate(rows):
                    expanded[i] = found[r]
        finally:
            self._end_group(members)
        return _gather(nodes, continuations, expanded), state

    def hidden_state(self, prompt: Sequence[int]) -> np.ndarray:
        """The model's final hidden state (after the output norm, before the vocabulary projection)
        at the prompt's last token: the position the answer is predicted from. The part of the
        prompt the cache lacks is evaluated in one call where that costs less than two (see
        `call_cost_rows`); after scoring the same prompt it costs one token's evaluation."""
        if not prompt:
            raise InvalidRequestError("the prompt is empty")
        self._check_fits(len(prompt), "the prompt")
        with self._lock:
            self._make_room(len(prompt))
            reused = self._prepare_prefix(prompt[:-1], fill=False)
            if not self._outputs_cost_less(len(prompt) - 1 - reused):
                self._fill(prompt[:-1], reused, 0)  # without outputs, then the last row on its own
                self._cached.extend(prompt[reused:-1])
            start = len(self._cached)
            tokens = list(prompt[start:])
            last = len(tokens) - 1
            _, state = self._run_rows(tokens, range(start, len(prompt)), [(0,)] * len(tokens),
                                      [False] * last + [True], {}, tail=len(tokens), hidden_row=last)
            assert state is not None
            return state

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
