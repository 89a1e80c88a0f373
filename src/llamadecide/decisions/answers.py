"""Answers: the probabilities a question's option scores give under its rule, and their record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llamadecide.decisions import maths
from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION
from llamadecide.decisions.questions import OptionValue, Question
from llamadecide.decisions.scoring import Scoring
from llamadecide.errors import InvalidRequestError


@dataclass(frozen=True)
class OptionScore:
    value: OptionValue
    answer_text: str
    # log p(answer tokens + end-of-answer marker | prompt); None when the question's head reads the
    # hidden state alone (the answers are not scored). Under a bound (Answer.probability_bound > 0) an option the
    # evaluation left unexpanded gets its share of the probability its unexpanded prefix leaves.
    logprob: float | None
    n_tokens: int  # tokens scored for the option (0 when the answers are not scored)
    probability: float


@dataclass(frozen=True)
class Answer:
    question: Question
    options: tuple[OptionScore, ...]
    label_mass: float | None
    confidence: float
    scoring: Scoring
    prompt_format: str = PROMPT_FORMAT_VERSION
    # 0: every probability exact. Otherwise the answers were expanded best-first (`Decider.max_bound`)
    # and every probability is within this of the exact one.
    probability_bound: float = 0.0

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
    prompt_tokens: int  # distinct tokens the decision reads: prompts once, every answer token
    shared_prefix_tokens: int
    seconds: float
    # cached_tokens: prompt tokens taken from the KV cache (from before this request) instead of evaluated
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OptionTotals:
    """A question's option log-likelihoods in its own option order (None: not scored), token counts,
    the hidden state at its answer position, and the bound on the probabilities they give."""

    logprobs: list[float] | None
    lengths: list[int]
    hidden: np.ndarray | None = None
    probability_bound: float = 0.0


def bounded_totals(
    continuations: Sequence[Sequence[int]], rows: Sequence[np.ndarray], starts: Sequence[int]
) -> tuple[list[float], float]:
    """Option log-likelihoods from a best-first evaluation, and the bound on the probabilities
    they give. A complete option has its exact log-likelihood. The options under one unexpanded
    node share what its prefix leaves, split evenly: together at most that probability, F in all;
    M the complete options' total. Softmax over these is then within F / M of the exact
    probabilities, every one: the exact normaliser lies in [M, M + F]."""
    totals: list[float] = [0.0] * len(rows)
    open_groups: dict[tuple[int, ...], list[int]] = {}
    complete_mass = 0.0
    for index, (tokens, row, start) in enumerate(zip(continuations, rows, starts)):
        known = ~np.isnan(row)
        totals[index] = float(row[start:][known[start:]].sum())
        if known.all():
            complete_mass += float(np.exp(totals[index]))
        else:
            open_groups.setdefault(tuple(tokens[: int(np.argmin(known))]), []).append(index)
    frontier_mass = 0.0
    for members in open_groups.values():
        for index in members:
            totals[index] -= float(np.log(len(members)))
        frontier_mass += float(np.exp(totals[members[0]])) * len(members)
    bound = frontier_mass / complete_mass if complete_mass > 0 else 1.0
    return totals, min(bound, 1.0)


def build_answer(
    question: Question,
    totals: OptionTotals,
    rule: Scoring,
    *,
    prior: np.ndarray | None = None,
    state_text: str | None = None,
) -> Answer:
    scores = totals.logprobs
    rule = rule.routed(state_text)
    if rule.bias is not None and scores is not None and len(rule.bias) != len(scores):
        raise InvalidRequestError("the calibration bias does not match the number of options", param="calibration")
    if rule.head is not None:
        if totals.hidden is None:
            raise ValueError("a head needs the hidden state")
        if rule.head.intercept.shape[0] != len(question.options):
            raise InvalidRequestError("the calibration head does not match the number of options", param="calibration")
        probabilities = rule.head.probabilities(scores, totals.hidden, state_text)
    else:
        assert scores is not None
        probabilities = maths.normalise(
            scores,
            temperature=rule.temperature,
            lengths=totals.lengths if rule.length_normalize else None,
            bias=rule.bias,
            prior=prior,
        )
    logprobs = scores if scores is not None else [None] * len(question.options)
    options = tuple(
        OptionScore(o.value, text, lp, n, float(p))
        for o, text, lp, n, p in zip(question.options, question.answer_texts(), logprobs, totals.lengths, probabilities)
    )
    mass = maths.label_mass(scores) if scores is not None else None
    return Answer(
        question, options, mass, maths.confidence(probabilities), rule, rule.prompt_format, totals.probability_bound
    )
