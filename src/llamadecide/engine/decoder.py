"""Raw batches in, outputs out: the only code that calls `llama_decode`, and the call shapes that
keep a row's numbers its own.

On the CPU backend a row's numbers depend on which kernels its call takes, and ggml picks them by
the call's size: K-quant matrix products switch to a tiled kernel from 8 rows (another summation
order below that), and flash attention to a tiled kernel from 64 query rows, which groups KV cells
by their absolute index (below 64 rows, a row kernel visits the row's own cells in cache order).
So a deterministic engine evaluates in calls of at least 8 rows, with at least 8 output rows
whenever any row has an output (the last layer and the vocabulary projection run on output rows
only), and of at most 63 rows, unless the llama.cpp it loads has a batch-invariant attention
kernel at every size (`GGML_CPU_FA_INVARIANT`, from the patch `scripts/install_llama_cpp.sh`
applies; or the older `GGML_CPU_FA_ROW_KERNEL`, which is as exact and slower at long context):
then a call may hold a whole ubatch. Either way a row's numbers depend only on its own tokens and
positions and on the cells it attends to, taken in cache order, not on its batch-mates nor on where
its cells lie (`KVCache` keeps every sequence's cells in position order): the same prompt alone,
beside other prompts, in other chunks or after unrelated cells gives bit-identical
log-probabilities (`tests/test_determinism.py`, `python -m benchmarks.exactness`).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import llama_cpp
import numpy as np

from llamadecide.engine.hidden_tap import HiddenTap

MIN_CALL_ROWS = 8  # ggml's tiled K-quant matmul takes over from 8 rows
MAX_CALL_ROWS = 63  # ggml's tiled flash attention takes over from 64 query rows
# scripts/patch_llama_cpp.py: switches that make flash attention batch-invariant at any call size
FA_INVARIANT = "GGML_CPU_FA_INVARIANT"  # a tiled kernel whose reduction order is the row's own
FA_ROW_KERNEL = "GGML_CPU_FA_ROW_KERNEL"  # ggml's row kernel at every size (as exact, slower at long context)
ATTENTION_SWITCHES = (FA_INVARIANT, FA_ROW_KERNEL)


@cache
def library_has_switch(name: str) -> bool:
    """Whether the loaded llama.cpp was built with a switch of scripts/patch_llama_cpp.py."""
    directory = Path(llama_cpp.__file__).parent / "lib"
    needle = name.encode()
    return any(needle in path.read_bytes() for path in directory.glob("*ggml*") if path.is_file())


def choose_attention(deterministic: bool) -> None:
    """Set the attention switch ggml reads once per process, unless the environment already chose:
    for deterministic scoring the batch-invariant kernel where the library has it, else the row kernel."""
    if any(name in os.environ for name in ATTENTION_SWITCHES):
        return
    for name in ATTENTION_SWITCHES:
        if library_has_switch(name):
            os.environ[name] = "1" if deterministic else "0"
            return


def invariant_attention() -> str | None:
    """The switch that makes flash attention batch-invariant at every size in this process, if any."""
    return next((name for name in ATTENTION_SWITCHES if os.environ.get(name) == "1" and library_has_switch(name)), None)


def max_call_rows(n_ubatch: int) -> int:
    """The most rows a deterministic call may hold: a ubatch when flash attention is batch-invariant
    at any size, else under the 64 rows where ggml switches to its tiled kernel."""
    if invariant_attention() is not None:
        return max(MIN_CALL_ROWS, n_ubatch)
    return min(MAX_CALL_ROWS, max(MIN_CALL_ROWS, n_ubatch))


@dataclass
class Rows:
    """Batch rows in evaluation order: a token at a position, the KV sequences it belongs to, and
    whether its output (logits, and hidden state when asked) is read."""

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    seq_ids: list[Sequence[int]] = field(default_factory=list)
    outputs: list[bool] = field(default_factory=list)

    def add(self, token: int, position: int, seq_ids: Sequence[int], output: bool = False) -> int:
        self.tokens.append(token)
        self.positions.append(position)
        self.seq_ids.append(seq_ids)
        self.outputs.append(output)
        return len(self.tokens) - 1

    def extend(self, tokens: Sequence[int], start: int, seq_ids: Sequence[int]) -> None:
        """Consecutive tokens of one prompt from position `start`, no outputs."""
        for offset, token in enumerate(tokens):
            self.add(token, start + offset, seq_ids)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Call:
    """One llama_decode call: rows [start, end), then `padding` scratch rows (every row's matmuls
    run on the call's row count), and outputs forced on rows nothing reads so that a call with any
    output has at least MIN_CALL_ROWS output rows (the scratch rows' outputs count towards them)."""

    start: int
    end: int
    padding: int = 0
    extra_outputs: tuple[int, ...] = ()


def plan_calls(outputs: Sequence[bool], *, deterministic: bool, limit: int) -> list[Call]:
    """Split rows into calls of at most `limit` rows, as even as possible; deterministic calls hold
    at least MIN_CALL_ROWS rows (work under the minimum is padded with scratch rows)."""
    n = len(outputs)
    if n == 0:
        return []
    count = -(-n // limit)
    base, extra = divmod(n, count)
    calls, start = [], 0
    for index in range(count):
        end = start + base + (1 if index < extra else 0)
        padding, forced = 0, ()
        if deterministic:
            padding = max(0, MIN_CALL_ROWS - (end - start))
            wanted = sum(outputs[start:end])
            if 0 < wanted < MIN_CALL_ROWS - padding:
                spare = [i for i in range(start, end) if not outputs[i]]
                forced = tuple(spare[: MIN_CALL_ROWS - padding - wanted])
        calls.append(Call(start, end, padding, forced))
        start = end
    return calls


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64, copy=False)
    peak = row.max()
    return row - (peak + np.log(np.exp(row - peak).sum()))


class Decoder:
    """A llama_batch of n_batch rows over one context; counts calls and rows."""

    def __init__(
        self,
        ctx: llama_cpp.llama_context_p,
        model: llama_cpp.llama_model_p,
        n_batch: int,
        n_seq_max: int,
        tap: HiddenTap | None = None,
    ) -> None:
        self._ctx = ctx
        self._tap = tap  # the context's eval callback, when it was created with one
        self._states: dict[int, np.ndarray] = {}
        self.n_batch = n_batch
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.n_embd = llama_cpp.llama_model_n_embd(model)
        self.n_layer = llama_cpp.llama_model_n_layer(model)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, n_seq_max)
        # Work done since load: llama_decode calls, the batch rows they evaluated for callers, and
        # apart from those the scratch rows added to keep call shapes deterministic.
        # projections_skipped: calls the tap stopped before the vocabulary projection.
        # full_depth_rows: the rows for callers weighted by the share of the model's blocks their call
        # ran (a row of a call stopped after block 23 of 28 counts 24/28): the work in full rows.
        self.counters = {
            "decode_calls": 0,
            "rows": 0,
            "padding_rows": 0,
            "projections_skipped": 0,
            "full_depth_rows": 0.0,
        }

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None

    def decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        seq_ids: Sequence[Sequence[int]],
        outputs: Sequence[bool],
        *,
        padding: int = 0,
        hidden_rows: Mapping[int, int | None] | None = None,
        logits: bool = True,
    ) -> None:
        """One llama_decode call (at most n_batch rows). The last `padding` rows are scratch rows,
        counted apart. `hidden_rows` (output rows -> a block's index, or None for the final state)
        have their hidden states read; without `logits` nothing reads the call's logits, so the tap
        stops the call after the deepest state read (the KV cells of its rows then lack the blocks
        it did not run). Raises RuntimeError when llama.cpp refuses the batch; the caller must then
        treat the KV cache as unknown."""
        hidden_rows = hidden_rows or {}
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
            batch.logits[i] = outputs[i]
        self.counters["decode_calls"] += 1
        self.counters["rows"] += n - padding
        self.counters["padding_rows"] += padding
        self._states = {}
        depth = 1.0
        embeddings = bool(hidden_rows) and self._tap is None  # llama.cpp's own way: every row an output
        if embeddings and any(layer is not None for layer in hidden_rows.values()):
            raise LookupError("this model's graph gives no block outputs to read")
        if hidden_rows and self._tap is not None:
            if not all(outputs[i] for i in hidden_rows):
                raise ValueError("a row whose hidden state is read must be an output row")
            rank = {index: r for r, index in enumerate(i for i in range(n) if outputs[i])}
            self._tap.arm(
                {i: (rank[i] if layer is None else i, layer) for i, layer in hidden_rows.items()}, stop=not logits
            )
        elif embeddings:
            for i in range(n):
                batch.logits[i] = True
            llama_cpp.llama_set_embeddings(self._ctx, True)
        try:
            code = llama_cpp.llama_decode(self._ctx, batch)
            if code == 0 and hidden_rows:
                if embeddings:
                    self._states = {i: self._embedding(i) for i in hidden_rows}
                else:
                    states = self._tap.states
                    if any(i not in states for i in hidden_rows):
                        raise LookupError("the call's graph has no tensor for the tap to read")
                    self._states = dict(states)
                    self.counters["projections_skipped"] += self._tap.stopped
                    if self._tap.stopped_after is not None:
                        depth = (self._tap.stopped_after + 1) / self.n_layer
        finally:
            if embeddings:
                llama_cpp.llama_set_embeddings(self._ctx, False)
            if self._tap is not None:
                self._tap.disarm()
            self.counters["full_depth_rows"] += (n - padding) * depth
        if code != 0:
            raise RuntimeError(f"llama_decode failed with code {code}")

    def tap_works(self, token: int, layer: int | None = None) -> bool:
        """Probe the tap with one row in sequence 0 (the caller clears the cache): whether this model's
        graph has the tensor it reads for `layer` (None: the final state; without it, hidden states
        come from the embeddings mode)."""
        if self._tap is None:
            return False
        try:
            self.decode([token], [0], [(0,)], [True], hidden_rows={0: layer}, logits=False)
        except LookupError:
            if layer is None:
                self._tap = None
            return False
        finally:
            self.counters.update(dict.fromkeys(self.counters, 0))
        return True

    def logprobs(self, batch_index: int) -> np.ndarray:
        """Log-softmax of a row's logits from the last call (-1: its last output row)."""
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, batch_index)
        row = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        return log_softmax(row)

    def hidden(self, batch_index: int) -> np.ndarray:
        """A row's hidden state from the last call, which read it."""
        return self._states[batch_index]

    def _embedding(self, batch_index: int) -> np.ndarray:
        pointer = llama_cpp.llama_get_embeddings_ith(self._ctx, batch_index)
        if not pointer:
            raise RuntimeError("llama.cpp returned no hidden state for this model")
        values = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_embd,))
        return values.astype(np.float64)
