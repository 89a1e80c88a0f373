"""The engine's front door: loads a GGUF into one llama context (a unified KV cache with many
sequences), owns the lock, and hands each job to the module that does it: `tokenizer` (text and
chat template), `kv_cache` (what every KV cell holds, and every evaluation), `scoring` (answer
tries, hidden states, reference paths), `generation` (sampling)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import _internals as internals
from llama_cpp import _logger as llama_logger

from llamadecide.engine.batch_scorer import BatchScorer
from llamadecide.engine.config import EngineConfig
from llamadecide.engine.decoder import Decoder, choose_attention, max_call_rows
from llamadecide.engine.generation import SamplingParams, generate_tokens
from llamadecide.engine.gguf_file import file_sha256, gguf_problem
from llamadecide.engine.hidden_tap import HiddenTap
from llamadecide.engine.kv_cache import KVCache
from llamadecide.engine.scoring import Scorer, check_fits, max_sequence
from llamadecide.engine.tokenizer import Tokenizer
from llamadecide.engine.values import GenerationResult, ScoringInput, TokenEvent, TrieScores
from llamadecide.errors import InvalidRequestError, ModelLoadError

log = logging.getLogger(__name__)

_backend_lock = threading.Lock()
_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True


class Engine:
    """A loaded GGUF model. Thread-safe: one call drives the llama context at a time."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        path = Path(config.model_path)
        if not path.is_file():
            raise ModelLoadError(f"model file not found: {path}")
        llama_logger.set_verbose(config.verbose)
        # Deterministic scoring takes a batch-invariant flash attention kernel at any batch size, where
        # the loaded llama.cpp has one (`decoder.max_call_rows`); ggml reads the switch once per process.
        choose_attention(config.deterministic)
        _init_backend()
        self._lock = threading.RLock()
        problem = gguf_problem(path)
        if problem is not None:
            raise ModelLoadError(problem)
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0x7FFFFFFF if config.n_gpu_layers < 0 else config.n_gpu_layers
        # The library default (-1, "auto") crashes on decode with this build; be explicit.
        model_params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE if config.no_mmap else llama_cpp.LLAMA_LOAD_MODE_MMAP
        model_params.use_extra_bufts = config.repack
        try:
            self._model = internals.LlamaModel(path_model=str(path), params=model_params, verbose=config.verbose)
        except ValueError as exc:
            raise ModelLoadError(f"cannot load {path}: {exc}") from exc
        max_seq = llama_cpp.llama_max_parallel_sequences()
        n_seq = min(config.n_seq_max or max_seq, max_seq)
        if n_seq < 4:
            raise ModelLoadError("n_seq_max must be at least 4 (prompt, an option, a pin, scratch)")
        n_threads = config.n_threads or max(os.cpu_count() or 1, 1)
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = config.n_ctx if config.n_ctx > 0 else self._model.n_ctx_train()
        ctx_params.n_batch = min(config.n_batch, ctx_params.n_ctx)
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
        # Hidden states are read from inside the call (`hidden_tap`), without embeddings mode's
        # vocabulary projection on every row.
        self._tap = HiddenTap(llama_cpp.llama_model_n_embd(self._model.model)) if config.hidden_tap else None
        if self._tap is not None:
            ctx_params.cb_eval = self._tap.callback
        try:
            self._ctx = internals.LlamaContext(model=self._model, params=ctx_params, verbose=config.verbose)
        except ValueError as exc:
            raise ModelLoadError(f"cannot create a llama context for {path}: {exc}") from exc

        self.model_path = path
        self.model_name = path.stem  # what clients see; GGUF general.name is often a training-run label
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx.ctx)
        self.n_batch = ctx_params.n_batch
        self.n_seq_max = llama_cpp.llama_n_seq_max(self._ctx.ctx)
        self.n_vocab = self._model.n_vocab()
        self.n_threads = n_threads
        self.n_gpu_layers = config.n_gpu_layers
        self._decoder = Decoder(self._ctx.ctx, self._model.model, self.n_batch, self.n_seq_max, self._tap)
        self._kv = KVCache(
            self._ctx.ctx,
            self._decoder,
            n_ctx=self.n_ctx,
            n_seq_max=self.n_seq_max,
            pinned_prefixes=config.pinned_prefixes,
            pinned_cells=config.pinned_cells,
            deterministic=config.deterministic,
            call_rows=max_call_rows(ctx_params.n_ubatch) if config.deterministic else self.n_batch,
        )
        self._scorer = Scorer(self._kv, call_cost_rows=config.call_cost_rows)
        self._batch_scorer = BatchScorer(self._kv, self._scorer)
        self.tokenizer = Tokenizer(self._model, template_override=config.chat_template, model_label=path.name)
        self._sha256: str | None = None
        self.n_layer = self._decoder.n_layer
        if self._tap is not None and not self._decoder.tap_works(0):
            log.warning("%s: no result_norm tensor in the graph; hidden states through embeddings mode", path.name)
        self._kv.clear()
        # Blocks whose output a head may read (the last block's output is the final state's input).
        self.readable_layers = range(self.n_layer - 1) if self._decoder.tap_works(0, self.n_layer - 2) else range(0)
        self._kv.clear()

    @property
    def call_rows(self) -> int:
        """The most rows one llama_decode call holds when scoring (`decoder.max_call_rows`)."""
        return self._kv.call_rows

    @property
    def max_sequence(self) -> int:
        """The longest prompt with its longest answer this engine scores (a little under n_ctx)."""
        return max_sequence(self.n_ctx)

    # -- identity -----------------------------------------------------------------------------

    @property
    def model_sha256(self) -> str:
        """SHA-256 of the GGUF file (what calibration profiles are bound to); computed once."""
        if self._sha256 is None:
            self._sha256 = file_sha256(self.model_path)
        return self._sha256

    @property
    def metadata(self) -> dict:
        """The GGUF's key-value metadata (architecture, context length, ...), as strings."""
        return self.tokenizer.metadata

    @property
    def counters(self) -> dict[str, int]:
        """Work done since load: `decode_calls`, `rows` evaluated for callers, and `padding_rows`
        (scratch rows that pad small calls to a deterministic shape). Read without the lock."""
        return self._decoder.counters

    def close(self) -> None:
        """Free the context, the batch and the model; the engine is unusable afterwards."""
        with self._lock:
            self._decoder.close()
            self._ctx.close()
            self._model.close()

    # -- text (`tokenizer`) ---------------------------------------------------------------------

    @property
    def chat_template(self):
        """The chat template in force (the GGUF's, or the configured override)."""
        return self.tokenizer.chat_template

    @property
    def chat_template_origin(self) -> str:
        """Where the chat template came from: 'gguf', 'override' (Jinja source given), or 'builtin:NAME'."""
        return self.tokenizer.chat_template_origin

    @property
    def end_of_answer(self) -> list[int]:
        """The tokens that close an assistant turn in this template (appended to every scored answer)."""
        return self.tokenizer.end_of_answer

    @property
    def bos_id(self) -> int:
        """The beginning-of-sequence token."""
        return self.tokenizer.bos_id

    @property
    def eos_id(self) -> int:
        """The end-of-sequence token."""
        return self.tokenizer.eos_id

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Tokens of `text` (no BOS added); `special`: parse special-token text such as <|im_end|>."""
        return self.tokenizer.tokenize(text, special=special)

    def tokenize_prompt(self, text: str) -> list[int]:
        """Tokens of a rendered chat prompt, BOS added where the model wants one."""
        return self.tokenizer.tokenize_prompt(text)

    def tokenize_answers(self, prompt_text: str, answers: Sequence[str]) -> tuple[list[int], list[list[int]]]:
        """The prompt's tokens and each answer's tokens as they are tokenized after that prompt (in context)."""
        return self.tokenizer.tokenize_answers(prompt_text, answers)

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """Text of `tokens`; `special`: render special tokens as their text."""
        return self.tokenizer.detokenize(tokens, special=special)

    def is_end_of_generation(self, token: int) -> bool:
        """Whether generation stops at this token (EOS, end of turn)."""
        return self.tokenizer.is_end_of_generation(token)

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> str:
        """`messages` rendered with the chat template, the assistant turn opened unless told otherwise."""
        return self.tokenizer.render_chat(messages, add_generation_prompt=add_generation_prompt)

    # -- the KV cache (`kv_cache`) --------------------------------------------------------------

    @property
    def pinned(self) -> list[tuple[int, ...]]:
        """The pinned prefixes, least recently used first."""
        return self._kv.pinned

    @property
    def last_reused_tokens(self) -> int:
        """Prompt tokens the last scoring call or hidden state took from the cache."""
        return self._kv.last_reused

    def pin_prefix(self, tokens: Sequence[int]) -> bool:
        """Keep `tokens` evaluated across calls (`KVCache.pin`); returns whether they are pinned."""
        with self._lock:
            return self._kv.pin(tokens)

    def clear_cache(self) -> None:
        """Drop everything the KV cache holds (sequence 0's prompt, pins, working sequences)."""
        with self._lock:
            self._kv.clear()

    # -- scoring (`scoring`) ----------------------------------------------------------------------

    def score_continuations(self, prefix: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Log-probability of every token of every continuation given `prefix` and the
        continuation's own earlier tokens, all exact (`score_trie` without a bound)."""
        return self.score_trie(prefix, continuations).rows

    def score_trie(
        self,
        prefix: Sequence[int],
        continuations: Sequence[Sequence[int]],
        *,
        hidden: bool = False,
        hidden_layer: int | None = None,
        max_bound: float = 0.0,
    ) -> TrieScores:
        """Score every continuation of `prefix` as a token trie: the part of the prefix the cache
        lacks and the trie go in the same calls. With `hidden`, the hidden state at the prefix's last
        token comes from the same calls (what a fitted head reads; `hidden_layer`: the output of that
        block, `readable_layers`, instead of the final state). With `max_bound` > 0 and a trie of
        at least `call_cost_rows` nodes, the trie is expanded best-first until the continuations left
        unexpanded hold at most `max_bound` times the probability found; their tokens below the
        frontier are NaN."""
        self._check_layer(hidden_layer)
        with self._lock:
            return self._scorer.score_trie(
                prefix, continuations, hidden=hidden, hidden_layer=hidden_layer, max_bound=max_bound
            )

    def score_many(self, inputs: Sequence[ScoringInput]) -> list[TrieScores]:
        """Many inputs' tries and hidden states in shared calls (`ScoringInput`); each input's scores
        equal those it gets alone."""
        for work in inputs:
            self._check_layer(work.hidden_layer)
        with self._lock:
            return self._batch_scorer.score_many(inputs)

    def hidden_state(self, prompt: Sequence[int], layer: int | None = None) -> np.ndarray:
        """The hidden state at the prompt's last token: the output of block `layer` (`readable_layers`;
        the call stops there), or with None the final state (after the output norm)."""
        self._check_layer(layer)
        with self._lock:
            return self._scorer.hidden_state(prompt, layer)

    def _check_layer(self, layer: int | None) -> None:
        if layer is not None and layer not in self.readable_layers:
            raise InvalidRequestError(
                f"this model's hidden states are read at blocks {self.readable_layers.start} to "
                f"{self.readable_layers.stop - 1} (or the final state), not block {layer}: "
                "the calibration head was fitted for another model",
                param="calibration",
            )

    def score_naive(self, tokens: Sequence[int], start: int, *, displaced: bool = False) -> np.ndarray:
        """Reference path: `tokens` evaluated from an empty cache (`displaced`: behind one unrelated
        cell); log-probabilities from `start` on."""
        with self._lock:
            return self._scorer.score_naive(tokens, start, displaced=displaced)

    def prompt_seconds(self, tokens: Sequence[int]) -> float:
        """Seconds to evaluate a prompt from an empty cache (the benchmark's prompt-only baseline)."""
        with self._lock:
            return self._scorer.prompt_seconds(tokens)

    # -- generation (`generation`) ---------------------------------------------------------------

    def generate(self, prompt: Sequence[int], params: SamplingParams) -> Iterator[TokenEvent | GenerationResult]:
        """Stream tokens for a prompt; the last item is a GenerationResult. The engine stays
        locked while the iterator is open: close it (or exhaust it) to release the engine."""
        if not prompt:
            raise InvalidRequestError("the prompt is empty")
        check_fits(self.n_ctx, len(prompt) + 1, "the prompt")
        return self._generate(list(prompt), params)

    def _generate(self, prompt: list[int], params: SamplingParams) -> Iterator[TokenEvent | GenerationResult]:
        with self._lock:
            yield from generate_tokens(
                self._kv,
                self._ctx,
                self._model,
                prompt,
                params,
                default_seed=self.config.seed,
                is_end=self.is_end_of_generation,
            )


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU (no model loaded)."""
    return bool(llama_cpp.llama_supports_gpu_offload())
