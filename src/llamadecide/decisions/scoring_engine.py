"""All that deciding asks of an engine (`llamadecide.engine.Engine` is one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from llamadecide.engine.values import ScoringInput, TrieScores


class ScoringEngine(Protocol):
    end_of_answer: list[int]
    n_ctx: int
    max_sequence: int  # the longest prompt with its answer the engine scores (a little under n_ctx)

    @property
    def pinned(self) -> list[tuple[int, ...]]:
        """The prefixes the engine keeps evaluated across calls."""

    @property
    def last_reused_tokens(self) -> int:
        """Prompt tokens the last `hidden_state` or `score_trie` took from the cache."""

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> str: ...
    def tokenize_prompt(self, text: str) -> list[int]: ...
    def tokenize_answers(self, prompt_text: str, answers: Sequence[str]) -> tuple[list[int], list[list[int]]]: ...
    def pin_prefix(self, tokens: Sequence[int]) -> bool: ...
    def clear_cache(self) -> None: ...
    def score_trie(
        self,
        prefix: Sequence[int],
        continuations: Sequence[Sequence[int]],
        *,
        hidden: bool = False,
        hidden_layer: int | None = None,
        max_bound: float = 0.0,
    ) -> TrieScores: ...
    def score_naive(self, tokens: Sequence[int], start: int) -> np.ndarray: ...
    def hidden_state(self, prompt: Sequence[int], layer: int | None = None) -> np.ndarray: ...
    def score_many(self, inputs: Sequence[ScoringInput]) -> list[TrieScores]: ...
