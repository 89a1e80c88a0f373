"""Deciding: every option of every question scored exactly, in one batched engine call."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from llamadecide.decisions import maths
from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION, build_messages, render_state
from llamadecide.decisions.questions import OptionValue, Question
from llamadecide.errors import InvalidRequestError


class ScoringEngine(Protocol):
    """The small part of the engine that deciding needs."""

    end_of_answer: list[int]

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> str: ...
    def tokenize_prompt(self, text: str) -> list[int]: ...
    def score_continuations(self, prefix: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[np.ndarray]: ...
    def score_naive(self, tokens: Sequence[int], start: int) -> np.ndarray: ...


@dataclass(frozen=True)
class Scoring:
    """How log-likelihoods become probabilities. Calibration fits these per task."""

    temperature: float = 1.0
    length_normalize: bool = False
    bias: tuple[float, ...] | None = None


@dataclass(frozen=True)
class OptionScore:
    value: OptionValue
    answer_text: str
    logprob: float  # log p(answer tokens + end-of-answer marker | prompt)
    n_tokens: int
    probability: float


@dataclass(frozen=True)
class Answer:
    question: Question
    options: tuple[OptionScore, ...]
    label_mass: float
    confidence: float
    scoring: Scoring
    prompt_format: str = PROMPT_FORMAT_VERSION

    @property
    def probabilities(self) -> list[float]:
        return [o.probability for o in self.options]

    @property
    def top(self) -> OptionScore:
        return max(self.options, key=lambda o: o.probability)

    @property
    def choice(self) -> OptionValue:
        return self.top.value

    @property
    def probability(self) -> float:
        """For predicates: the probability that the statement is true."""
        return next(o.probability for o in self.options if o.value is True)

    @property
    def score(self) -> float:
        """For scores: the expected level index."""
        return maths.expected_score(self.probabilities)


@dataclass(frozen=True)
class Decision:
    answers: list[Answer]
    prompt_tokens: int  # distinct tokens evaluated for this decision: shared prefix + trie
    shared_prefix_tokens: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Scored:
    question: Question
    sequences: list[list[int]]  # prompt + answer + end marker, one per option
    boundaries: list[int]  # index where each answer's own tokens begin

    @property
    def answer_lengths(self) -> list[int]:
        """Tokens scored for each option: its own tokens and the end marker."""
        return [len(s) - b for s, b in zip(self.sequences, self.boundaries)]


def _common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for i in range(n):
        t = first[i]
        if any(s[i] != t for s in sequences):
            return i
    return n


class Decider:
    def __init__(self, engine: ScoringEngine) -> None:
        self.engine = engine

    def _tokenize(self, state_text: str, question: Question) -> _Scored:
        prompt_text = self.engine.render_chat(build_messages(state_text, question))
        prompt_tokens = self.engine.tokenize_prompt(prompt_text)
        sequences: list[list[int]] = []
        boundaries: list[int] = []
        for answer in question.answer_texts():
            # In-context tokenization: tokenize prompt + answer together and split where they
            # diverge from the prompt alone, so the answer's tokens are the ones the model emits.
            full = self.engine.tokenize_prompt(prompt_text + answer) + list(self.engine.end_of_answer)
            sequences.append(full)
            boundaries.append(_common_prefix([prompt_tokens, full]))
        seen: dict[tuple[int, ...], int] = {}
        for index, sequence in enumerate(sequences):
            key = tuple(sequence[boundaries[index]:])
            if key in seen:
                other = question.options[seen[key]].value
                raise InvalidRequestError(
                    f"options {other!r} and {question.options[index].value!r} are the same tokens to the model",
                    param="questions",
                )
            seen[key] = index
        return _Scored(question, sequences, boundaries)

    def decide(
        self,
        state: Any,
        questions: Sequence[Question],
        *,
        scoring: Sequence[Scoring | None] | Scoring | None = None,
    ) -> Decision:
        """Answer every question about one state. The state's tokens are evaluated once for all
        questions; all options of all questions are scored in one batched trie evaluation."""
        if not questions:
            raise InvalidRequestError("at least one question is required", param="questions")
        began = time.perf_counter()
        state_text = render_state(state)
        scored = [self._tokenize(state_text, q) for q in questions]
        all_sequences = [s for item in scored for s in item.sequences]
        shared = min(_common_prefix(all_sequences), min(b for item in scored for b in item.boundaries))
        shared = min(shared, min(len(s) for s in all_sequences) - 1)
        continuations = [s[shared:] for s in all_sequences]
        logprobs = self.engine.score_continuations(all_sequences[0][:shared], continuations)
        per_question = _per_question_scoring(scoring, len(questions))
        answers: list[Answer] = []
        cursor = 0
        for item, rule in zip(scored, per_question):
            totals = []
            for boundary in item.boundaries:
                totals.append(float(logprobs[cursor][boundary - shared :].sum()))
                cursor += 1
            answers.append(_answer(item.question, totals, item.answer_lengths, rule))
        distinct = shared + _distinct_prefixes(continuations)
        cached = int(getattr(self.engine, "last_reused_tokens", 0))
        return Decision(answers, distinct, shared, time.perf_counter() - began, {"cached_tokens": cached})

    def decide_naive(self, state: Any, question: Question, *, scoring: Scoring | None = None) -> Answer:
        """Reference path: one full evaluation from scratch per option. Slow; for checks and the
        benchmark baseline."""
        item = self._tokenize(render_state(state), question)
        totals = [float(self.engine.score_naive(s, b).sum()) for s, b in zip(item.sequences, item.boundaries)]
        return _answer(question, totals, item.answer_lengths, scoring or Scoring())


def _distinct_prefixes(sequences: Sequence[Sequence[int]]) -> int:
    """Number of distinct non-empty prefixes: the tokens a trie evaluation really computes."""
    root: dict = {}
    count = 0
    for sequence in sequences:
        level = root
        for token in sequence:
            if token not in level:
                level[token] = {}
                count += 1
            level = level[token]
    return count


def _per_question_scoring(scoring: Sequence[Scoring | None] | Scoring | None, count: int) -> list[Scoring]:
    if scoring is None or isinstance(scoring, Scoring):
        return [scoring or Scoring()] * count
    if len(scoring) != count:
        raise ValueError("one scoring rule per question is required")
    return [s or Scoring() for s in scoring]


def _answer(question: Question, totals: list[float], lengths: list[int], rule: Scoring) -> Answer:
    if rule.bias is not None and len(rule.bias) != len(totals):
        raise InvalidRequestError("the calibration bias does not match the number of options", param="calibration")
    probabilities = maths.normalise(
        totals,
        temperature=rule.temperature,
        lengths=lengths if rule.length_normalize else None,
        bias=rule.bias,
    )
    options = tuple(
        OptionScore(o.value, text, lp, n, float(p))
        for o, text, lp, n, p in zip(question.options, question.answer_texts(), totals, lengths, probabilities)
    )
    return Answer(question, options, maths.label_mass(totals), maths.confidence(probabilities), rule)
