"""A float64 NumPy forward pass of llama-architecture GGUF models, for checking the engine.

It dequantizes the GGUF's weights and computes exact log-probabilities for those weights, without
llama.cpp's 8-bit activation quantization or f16 KV cache. Its differences from llama.cpp are
llama.cpp's own numerical noise, which is what the engine's scores should be judged against.
Needs the `gguf` package (test extra). Supports the `llama` architecture (e.g. SmolLM2) only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def _field(reader, key: str):
    value = reader.fields[key]
    return value.parts[value.data[0]][0]


@dataclass
class _Cache:
    tokens: list[int] = field(default_factory=list)
    keys: list[np.ndarray] = field(default_factory=list)  # per layer [T, n_kv_heads, head_dim]
    values: list[np.ndarray] = field(default_factory=list)


class ReferenceModel:
    def __init__(self, path: Path) -> None:
        import gguf
        from gguf.quants import dequantize

        reader = gguf.GGUFReader(str(path))
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        if arch != "llama":
            raise ValueError(f"the reference implements the llama architecture, not {arch!r}")
        self.n_layers = int(_field(reader, "llama.block_count"))
        self.n_embd = int(_field(reader, "llama.embedding_length"))
        self.n_heads = int(_field(reader, "llama.attention.head_count"))
        self.n_kv_heads = int(_field(reader, "llama.attention.head_count_kv"))
        self.eps = float(_field(reader, "llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(_field(reader, "llama.rope.freq_base"))
        self.head_dim = self.n_embd // self.n_heads
        self.w: dict[str, np.ndarray] = {}
        for tensor in reader.tensors:
            array = dequantize(tensor.data, tensor.tensor_type).astype(np.float64)
            self.w[tensor.name] = array.reshape([int(x) for x in reversed(tensor.shape)])
        self.output = self.w.get("output.weight", self.w["token_embd.weight"])
        self._cache = _Cache()

    def _rms(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * weight

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        # llama.cpp's "normal" RoPE: rotates adjacent pairs (the GGUF converter permuted Q and K).
        inv = self.theta ** (-np.arange(0, self.head_dim, 2) / self.head_dim)
        angle = positions[:, None] * inv[None, :]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def _forward(self, tokens: Sequence[int], cache: _Cache) -> np.ndarray:
        """Log-probabilities after each of `tokens`, appended to `cache` (which is extended)."""
        start = len(cache.tokens)
        n = len(tokens)
        positions = np.arange(start, start + n, dtype=np.float64)
        x = self.w["token_embd.weight"][list(tokens)]
        group = self.n_heads // self.n_kv_heads
        mask = np.triu(np.full((n, start + n), -np.inf), start + 1)
        for layer in range(self.n_layers):
            p = f"blk.{layer}."
            h = self._rms(x, self.w[p + "attn_norm.weight"])
            q = self._rope((h @ self.w[p + "attn_q.weight"].T).reshape(n, self.n_heads, self.head_dim), positions)
            k = self._rope((h @ self.w[p + "attn_k.weight"].T).reshape(n, self.n_kv_heads, self.head_dim), positions)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(n, self.n_kv_heads, self.head_dim)
            if layer < len(cache.keys):
                k = np.concatenate([cache.keys[layer], k])
                v = np.concatenate([cache.values[layer], v])
                cache.keys[layer], cache.values[layer] = k, v
            else:
                cache.keys.append(k)
                cache.values.append(v)
            attended = np.empty((n, self.n_heads, self.head_dim))
            for head in range(self.n_heads):
                kv = head // group
                scores = q[:, head, :] @ k[:, kv, :].T / np.sqrt(self.head_dim) + mask
                scores = np.exp(scores - scores.max(-1, keepdims=True))
                attended[:, head, :] = (scores / scores.sum(-1, keepdims=True)) @ v[:, kv, :]
            x = x + attended.reshape(n, self.n_embd) @ self.w[p + "attn_output.weight"].T
            h = self._rms(x, self.w[p + "ffn_norm.weight"])
            gate = h @ self.w[p + "ffn_gate.weight"].T
            x = (
                x
                + ((gate / (1 + np.exp(-gate))) * (h @ self.w[p + "ffn_up.weight"].T)) @ self.w[p + "ffn_down.weight"].T
            )
        cache.tokens.extend(tokens)
        logits = self._rms(x, self.w["output_norm.weight"]) @ self.output.T
        peak = logits.max(-1, keepdims=True)
        return logits - (peak + np.log(np.exp(logits - peak).sum(-1, keepdims=True)))

    def continuation_logprobs(self, prefix: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
        """log p(continuation[j] | prefix, continuation[:j]) for every j. The prefix's keys and
        values are kept, so many continuations of one prefix cost the prefix once."""
        if self._cache.tokens != list(prefix[:-1]):
            self._cache = _Cache()
            if len(prefix) > 1:
                self._forward(prefix[:-1], self._cache)
        branch = _Cache(list(self._cache.tokens), list(self._cache.keys), list(self._cache.values))
        rows = self._forward([prefix[-1], *continuation[:-1]], branch)
        return np.array([rows[j, token] for j, token in enumerate(continuation)])
