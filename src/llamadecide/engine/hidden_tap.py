"""Hidden states read from inside a llama_decode call, and the call stopped there when no logits are read.

llama.cpp gives hidden states through its embeddings mode, which makes every row of a call an output
row: every row then runs the vocabulary projection (on the default model about a fifth of a row's
work, and the projection's weights are read once more per call). The tap instead watches the graph
for the last layer's normalised output (`result_norm`, the tensor the embeddings mode returns),
copies the columns of the rows asked for, and, when the call reads no logits, tells ggml to stop
the graph there. Rows, their order and their outputs are what the call planned, so the numbers are
the same as the embeddings mode's.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
import numpy as np
from llama_cpp._ggml import libggml

HIDDEN_TENSOR = b"result_norm"

libggml.ggml_get_name.argtypes = [ctypes.c_void_p]
libggml.ggml_get_name.restype = ctypes.c_char_p
libggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
libggml.ggml_nbytes.restype = ctypes.c_size_t
libggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
libggml.ggml_backend_tensor_get.restype = None


class HiddenTap:
    """The eval callback a context is created with (`callback`), idle unless a call is armed."""

    def __init__(self, n_embd: int) -> None:
        self.n_embd = n_embd
        self._wanted: Sequence[int] = ()
        self._stop = False
        self._seen = 0  # output columns seen so far in this call (a call may run as several ubatches)
        self.states: dict[int, np.ndarray] = {}
        self.stopped = False  # whether the last armed call ended at the hidden states
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)

    def arm(self, output_ranks: Sequence[int], *, stop: bool) -> None:
        """Read the hidden states of these output rows (ranks among the call's output rows) in the next
        call; with `stop`, end the call at the hidden states (nothing reads its logits)."""
        self._wanted, self._stop, self._seen, self.states = tuple(output_ranks), stop, 0, {}
        self.stopped = False

    def disarm(self) -> None:
        self._wanted, self._stop = (), False

    def _on_node(self, tensor: int, ask: bool, _user: int) -> bool:
        if not self._wanted:
            return not ask  # idle: observe nothing, never stop the graph
        if libggml.ggml_get_name(tensor) != HIDDEN_TENSOR:
            return not ask
        if ask:
            return True
        size = libggml.ggml_nbytes(tensor)
        columns = size // (4 * self.n_embd)
        data = np.empty((columns, self.n_embd), dtype=np.float32)
        libggml.ggml_backend_tensor_get(tensor, data.ctypes.data, 0, size)
        for rank in self._wanted:
            if self._seen <= rank < self._seen + columns:
                self.states[rank] = data[rank - self._seen].astype(np.float64)
        self._seen += columns
        self.stopped = self._stop
        return not self._stop
