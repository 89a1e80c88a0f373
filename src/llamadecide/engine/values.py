"""What the engine takes and returns besides its settings: scoring inputs, trie scores, generated
tokens (no llama.cpp here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


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
    of its tokens given the prefix and its own earlier tokens; NaN where a best-first evaluation never
    expanded the node that predicts it (the continuation's probability is then at most that of its
    evaluated part). hidden: the hidden state at the prefix's last token, when asked for.
    cached_tokens: how many prefix tokens came from the KV cache instead of being evaluated."""

    rows: list[np.ndarray]
    hidden: np.ndarray | None = None
    best_first: bool = False
    cached_tokens: int = 0

    @property
    def complete(self) -> list[bool]:
        return [not np.isnan(row).any() for row in self.rows]


@dataclass(frozen=True)
class ScoringInput:
    """One input's work. With continuations: score them after `prefix` as a trie (and the hidden
    state at the prefix's last token when `hidden`). Without: `prefix` is a whole prompt, of which
    only the hidden state at its last token is wanted. hidden_layer: the block whose output is that
    state (None: the final state, after the output norm)."""

    prefix: Sequence[int]
    continuations: Sequence[Sequence[int]] = ()
    hidden: bool = False
    hidden_layer: int | None = None

    @property
    def members(self) -> int:
        return max(1, len(self.continuations))
