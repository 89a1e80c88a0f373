"""Deciding, the request path: every option of every question scored exactly (or within a stated
bound), one engine call per question, in an order fixed by the questions' content; many one-question
decisions in shared engine calls. What calibration reads of the model lives in `measuring`."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llamadecide.decisions import maths
from llamadecide.decisions.answers import Answer, Decision, OptionTotals, build_answer
from llamadecide.decisions.planner import QuestionCall, QuestionPlanner
from llamadecide.decisions.prompt import render_state
from llamadecide.decisions.questions import Question
from llamadecide.decisions.scoring import Evaluation, Scoring, evaluation, per_question
from llamadecide.decisions.scoring_engine import ScoringEngine
from llamadecide.decisions.tokenized import canonical_key, common_prefix, split_point
from llamadecide.decisions.work import Limits, Work
from llamadecide.engine.values import ScoringInput
from llamadecide.errors import InvalidRequestError, LlamaDecideError


@dataclass(frozen=True)
class DecisionInput:
    """One decision to make among many (`Decider.decide_many`)."""

    state: Any
    questions: Sequence[Question]
    scoring: Sequence[Scoring | None] | Scoring | None = None
    limits: Limits | None = None


@dataclass(frozen=True)
class _Request:
    state_text: str
    questions: list[Question]
    rules: list[Scoring]
    order: list[int]

    @property
    def ordered_questions(self) -> list[Question]:
        return [self.questions[i] for i in self.order]

    @property
    def ordered_rules(self) -> list[Scoring]:
        return [self.rules[i] for i in self.order]


class Decider:
    def __init__(self, engine: ScoringEngine, *, prior_cache_size: int = 512, max_bound: float = 0.0) -> None:
        """max_bound > 0 lets `decide` expand a plain softmax question's answers best-first when they
        are many (the engine's `call_cost_rows`): every probability is then within `max_bound` of the
        exact one, and the answer says by how much (`Answer.probability_bound`). 0: always exact."""
        self.planner = QuestionPlanner(engine, max_bound=max_bound)
        self.engine = engine
        self.max_bound = max_bound
        self._priors: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._prior_cache_size = prior_cache_size

    def decide(
        self,
        state: Any,
        questions: Sequence[Question],
        *,
        scoring: Sequence[Scoring | None] | Scoring | None = None,
        limits: Limits | None = None,
    ) -> Decision:
        """Answer every question about one state. The state's tokens are evaluated once for all
        questions. `limits` bounds the work (checked after tokenizing, before any evaluation) and
        the time (checked before each question's evaluation)."""
        began = time.perf_counter()
        request = self._request(state, questions, scoring)
        scored, plans, cached = self.planner.score(
            request.state_text, request.ordered_questions, request.ordered_rules, limits=limits
        )
        return self._finish(request, scored, plans, cached, time.perf_counter() - began)

    def decide_many(self, requests: Sequence[DecisionInput]) -> list[Decision | Exception]:
        """Many decisions, their engine work shared: every one-question request whose answers are
        scored exactly (or read the hidden state alone) goes into `Engine.score_many` with the others,
        the rest are decided one by one. Each decision is what `decide` gives alone; one that cannot be
        decided is its own exception, in its place, and never fails the others."""
        began = time.perf_counter()
        out: list[Decision | Exception | None] = [None] * len(requests)
        shared: list[tuple[int, _Request, QuestionCall]] = []
        for index, item in enumerate(requests):
            try:
                request = self._request(item.state, item.questions, item.scoring)
                if (
                    len(request.questions) == 1
                    and evaluation(request.rules[0], self.max_bound) is not Evaluation.BOUNDED
                ):
                    [plan] = self.planner.plan(request.state_text, request.ordered_questions, request.ordered_rules)
                    if item.limits is not None:
                        item.limits.check_work(plan.work)
                        item.limits.check_time()
                    shared.append((index, request, plan))
                else:
                    out[index] = self.decide(item.state, item.questions, scoring=item.scoring, limits=item.limits)
            except (LlamaDecideError, ValueError) as exc:
                out[index] = exc
        fresh = self.planner.pin([plan for _, _, plan in shared])
        inputs = [
            ScoringInput(
                plan.prefix,
                plan.continuations,
                hidden=plan.rule.head is not None,
                hidden_layer=None if plan.rule.head is None else plan.rule.head.layer,
            )
            for _, _, plan in shared
        ]
        scored = self.engine.score_many(inputs) if inputs else []
        seconds = time.perf_counter() - began
        for (index, request, plan), trie in zip(shared, scored):
            try:
                totals = (
                    self.planner.hidden_totals(plan, trie.hidden)
                    if plan.how is Evaluation.HIDDEN_ONLY
                    else self.planner.combine(plan, trie)
                )
                cached = max(0, trie.cached_tokens - fresh.get(id(plan), 0))
                out[index] = self._finish(request, [totals], [plan], cached, seconds)
            except (LlamaDecideError, ValueError) as exc:
                out[index] = exc
        return [result for result in out if result is not None]

    def _request(
        self, state: Any, questions: Sequence[Question], scoring: Sequence[Scoring | None] | Scoring | None
    ) -> _Request:
        if not questions:
            raise InvalidRequestError("at least one question is required", param="questions")
        rules = per_question(scoring, len(questions))
        # Questions go to the engine in an order fixed by their content, not by the request, so
        # reordering (or renaming) the questions of a request changes no answer.
        order = sorted(range(len(questions)), key=lambda i: canonical_key(questions[i], rules[i]))
        return _Request(render_state(state), list(questions), rules, order)

    def _finish(
        self, request: _Request, scored: list[OptionTotals], plans: list[QuestionCall], cached: int, seconds: float
    ) -> Decision:
        totals: list[OptionTotals] = [scored[0]] * len(request.questions)
        for position, i in enumerate(request.order):
            totals[i] = scored[position]
        answers: list[Answer] = []
        for question, rule, item in zip(request.questions, request.rules, totals):
            prior = self.prior(question, rule) if rule.prior_correction else None
            answers.append(build_answer(question, item, rule, prior=prior, state_text=request.state_text))
        work = sum((plan.work for plan in plans), Work())
        sequences = [s for plan in plans for _, item in plan.rotations for s in item.sequences]
        shared = min(split_point([item for plan in plans for _, item in plan.rotations]), common_prefix(sequences))
        return Decision(answers, work.tokens, shared, seconds, {"cached_tokens": min(cached, work.tokens)})

    def prior(self, question: Question, rule: Scoring) -> np.ndarray:
        """The question's content-free log prior over its options: the rule's fixed one (a profile's),
        else computed (cached per question, options, mode, rotations, demonstrations and
        normalisation)."""
        if rule.prior is not None:
            return np.asarray(rule.prior)
        key = (
            question.type,
            question.instructions,
            question.options,
            question.mode,
            rule.rotations,
            rule.demonstrations,
            rule.length_normalize,
            rule.prompt_format,
        )
        cached = self._priors.get(key)
        if cached is not None:
            self._priors.move_to_end(key)
            return cached
        rows, lengths = self.planner.content_free_scores(question, rule)
        prior = maths.content_free_prior(rows, lengths if rule.length_normalize else None)
        self._priors[key] = prior
        while len(self._priors) > self._prior_cache_size:
            self._priors.popitem(last=False)
        return prior
