"""What a decision costs, counted once: the rows the engine will evaluate (checked against the
request's limit before any evaluation) and the tokens it reads (reported as usage), and the
decision's time limit."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llamadecide.decisions.tokenized import common_prefix
from llamadecide.engine.trie import trie_rows
from llamadecide.errors import InvalidRequestError, RequestTimeoutError


@dataclass(frozen=True)
class Work:
    """rows: what the engine evaluates when nothing from before the request is cached (prompt
    tokens a previous question of the request did not leave in the cache, answer-trie inner nodes);
    tokens: the distinct tokens the question reads (its new prompt tokens, every answer token)."""

    rows: int = 0
    tokens: int = 0

    def __add__(self, other: Work) -> Work:
        return Work(self.rows + other.rows, self.tokens + other.tokens)


def trie_work(previous: Sequence[int], prefix: Sequence[int], continuations: Sequence[Sequence[int]]) -> Work:
    """A prompt prefix and its continuations scored as a trie, after a question whose evaluated prompt
    was `previous` (the engine keeps it: a trie call leaves prefix[:-1] in the cache)."""
    new = len(prefix) - common_prefix([previous, prefix[:-1]]) if previous else len(prefix)
    answer_tokens = len({tuple(c[:i]) for c in continuations for i in range(1, len(c) + 1)})
    return Work(new - 1 + trie_rows(continuations), new + answer_tokens)


def prompt_work(previous: Sequence[int], prompt: Sequence[int]) -> Work:
    """A prompt evaluated for its hidden state alone (the engine then keeps all of it)."""
    new = len(prompt) - (common_prefix([previous, prompt]) if previous else 0)
    return Work(new, new)


@dataclass
class Limits:
    """What one decision may cost: `max_rows` evaluated rows (`Work.rows` over every question and
    rotation), refused before any evaluation; and `stop`, asked before each question's evaluation,
    which ends the decision with RequestTimeoutError once it says so (the engine then moves on)."""

    max_rows: int | None = None
    stop: Callable[[], bool] | None = None

    def check_work(self, work: Work) -> None:
        if self.max_rows is not None and work.rows > self.max_rows:
            raise InvalidRequestError(
                f"this request needs about {work.rows} evaluated tokens (prompts and answer tries over its questions "
                f"and "
                f"rotations); the limit is {self.max_rows} (max_request_rows): split it or shorten it",
                param="questions",
            )

    def check_time(self) -> None:
        if self.stop is not None and self.stop():
            raise RequestTimeoutError("the decision ran past its time limit (request_timeout)")
