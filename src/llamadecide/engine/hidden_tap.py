"""Hidden states read from inside a llama_decode call, and the call stopped there when no logits are read.

llama.cpp gives hidden states through its embeddings mode, which makes every row of a call an output
row: every row then runs the vocabulary projection (on the default model about a fifth of a row's
work, and the projection's weights are read once more per call). The tap instead watches the graph
for the tensors it is asked for and copies the columns of the rows asked for: the last layer's
normalised output (`result_norm`, the tensor the embeddings mode returns), or a block's output
(`l_out-<layer>`, the residual stream after that block). When the call reads no logits, it tells ggml
to stop the graph after the deepest tensor read: a head on block 23 of 28 costs 24 blocks.
Rows, their order and their outputs are what the call planned, so a state is the same whatever else
the call holds (and `result_norm` the same as the embeddings mode's).

A call stopped early leaves the KV cells of its rows without the blocks it did not run: the caller
drops them or never lets a deeper call attend to them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

import llama_cpp
import numpy as np
from llama_cpp._ggml import libggml

FINAL_TENSOR = b"result_norm"
BLOCK_TENSOR = b"l_out-"

libggml.ggml_get_name.argtypes = [ctypes.c_void_p]
libggml.ggml_get_name.restype = ctypes.c_char_p
libggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
libggml.ggml_nbytes.restype = ctypes.c_size_t
libggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
libggml.ggml_backend_tensor_get.restype = None


def tensor_name(layer: int | None) -> bytes:
    """The graph tensor holding the hidden state of a block's output (None: the final normalised state)."""
    return FINAL_TENSOR if layer is None else BLOCK_TENSOR + str(layer).encode()


class HiddenTap:
    """The eval callback a context is created with (`callback`), idle unless a call is armed."""

    def __init__(self, n_embd: int) -> None:
        self.n_embd = n_embd
        self._wanted: dict[bytes, list[tuple[int, int]]] = {}  # tensor -> (column, key) pairs
        self._last: bytes | None = None  # the tensor after which the graph stops
        self._seen: dict[bytes, int] = {}  # columns of each tensor seen so far (a call may run as several ubatches)
        self.states: dict[int, np.ndarray] = {}
        self.stopped = False  # whether the last armed call ended early
        self.stopped_after: int | None = None  # the block it ended after (None: the final state or not stopped)
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)

    def arm(self, reads: Mapping[int, tuple[int, int | None]], *, stop: bool) -> None:
        """Read, in the next call, for each key a (column, layer) pair: the hidden state of that
        column of a block's output (`layer`; the column is the row's index in the call) or of the
        final normalised state (None; the column is the row's rank among the call's output rows).
        With `stop`, end the call after the deepest tensor read (nothing reads its logits)."""
        self._wanted, self._seen, self.states, self.stopped, self.stopped_after = {}, {}, {}, False, None
        for key, (column, layer) in reads.items():
            self._wanted.setdefault(tensor_name(layer), []).append((column, key))
        self._last = None
        if stop:
            layers = [layer for _, layer in reads.values() if layer is not None]
            final = len(layers) < len(reads)
            self._last = FINAL_TENSOR if final else tensor_name(max(layers))

    def disarm(self) -> None:
        self._wanted, self._last = {}, None

    def _on_node(self, tensor: int, ask: bool, _user: int) -> bool:
        if not self._wanted:
            return not ask  # idle: observe nothing, never stop the graph
        name = libggml.ggml_get_name(tensor)
        wanted = self._wanted.get(name)
        if wanted is None:
            return not ask
        if ask:
            return True
        size = libggml.ggml_nbytes(tensor)
        columns = size // (4 * self.n_embd)
        data = np.empty((columns, self.n_embd), dtype=np.float32)
        libggml.ggml_backend_tensor_get(tensor, data.ctypes.data, 0, size)
        seen = self._seen.get(name, 0)
        for column, key in wanted:
            if seen <= column < seen + columns:
                self.states[key] = data[column - seen].astype(np.float64)
        self._seen[name] = seen + columns
        if name == self._last:
            self.stopped = True
            if name != FINAL_TENSOR:
                self.stopped_after = int(name[len(BLOCK_TENSOR) :])
            return False
        return True
