"""Deciding: every option of every question scored exactly (or within a stated bound), one engine
call per question, in an order fixed by the questions' content."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llamadecide.decisions import maths
from llamadecide.decisions.answers import Answer, Decision, OptionTotals, bounded_totals, build_answer
from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION, check_layout, render_state
from llamadecide.decisions.protocol import ScoringEngine
from llamadecide.decisions.questions import Question
from llamadecide.decisions.rotations import shown
from llamadecide.decisions.rules import Demonstration, Evaluation, Scoring, evaluation, per_question
from llamadecide.decisions.tokenized import (
    QuestionTokenizer,
    TokenizedQuestion,
    canonical_key,
    common_prefix,
    describe,
    split_point,
)
from llamadecide.decisions.work import Limits, Work, prompt_work, trie_work
from llamadecide.engine.config import Job
from llamadecide.errors import ContextOverflowError, InvalidRequestError, LlamaDecideError


@dataclass(frozen=True)
class _Plan:
    """One question's engine call: a trie (prefix, continuations) or, for a head on the hidden
    state alone, the prompt; `held` is what the engine's prompt sequence holds afterwards."""

    question: Question
    rule: Scoring
    how: Evaluation
    variants: list[tuple[int, TokenizedQuestion]]
    prefix: list[int]
    continuations: list[list[int]]
    local: int
    held: list[int]
    work: Work


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
    def __init__(self, engine: ScoringEngine, *, prior_cache_size: int = 512, epsilon: float = 0.0) -> None:
        """epsilon > 0 lets `decide` expand a plain softmax question's answers best-first when they
        are many (the engine's `call_cost_rows`): every probability is then within `epsilon` of the
        exact one, and the answer says by how much (`Answer.bound`). 0: always exact."""
        if epsilon < 0 or epsilon >= 1:
            raise ValueError("epsilon must be in [0, 1)")
        self.engine = engine
        self.epsilon = epsilon
        self.tokens = QuestionTokenizer(engine)
        self._priors: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._prior_cache_size = prior_cache_size

    def _tokenize(self, state_text: str, question: Question, demonstrations: Sequence[tuple[str, str]] = (),
                  layout: str = PROMPT_FORMAT_VERSION) -> TokenizedQuestion:
        return self.tokens.tokenize(state_text, question, demonstrations, layout)

    def _plan(self, state_text: str, questions: Sequence[Question], rules: Sequence[Scoring]) -> list[_Plan]:
        plans, previous = [], []
        for question, rule in zip(questions, rules):
            rule.check()
            variants = self.tokens.variants(state_text, question, rule)
            needed = max(len(s) for _, item in variants for s in item.sequences)
            if needed > self.engine.max_sequence:  # what cannot fit is refused before any work
                raise ContextOverflowError(f"question {describe(question)}: the prompt with its longest answer needs "
                                           f"{needed} tokens but the context holds {self.engine.n_ctx} (of which "
                                           f"{self.engine.max_sequence} for a prompt with its answer; shorten the "
                                           f"input "
                                           "or the options, or raise n_ctx)", param="questions")
            how = evaluation(rule, self.epsilon)
            if how is Evaluation.HIDDEN_ONLY:
                prompt = variants[0][1].prompt_tokens
                plans.append(_Plan(question, rule, how, variants, prompt, [], 0, prompt, prompt_work(previous, prompt)))
            else:
                local = split_point([item for _, item in variants])
                group = [s for _, item in variants for s in item.sequences]
                prefix, continuations = group[0][:local], [s[local:] for s in group]
                plans.append(_Plan(question, rule, how, variants, prefix, continuations, local, prefix[:-1],
                                   trie_work(previous, prefix, continuations)))
            previous = plans[-1].held
        return plans

    def _score(self, state_text: str, questions: Sequence[Question], rules: Sequence[Scoring], *,
               limits: Limits | None = None, hidden: bool = False) -> tuple[list[OptionTotals], list[_Plan], int]:
        """Per question, every option of every rotation in one engine call, and each option's
        log-likelihood averaged over its rotations, in the question's own option order; with the
        hidden state at the answer position from the same call when a head needs it (or `hidden`).
        Returns the totals, the plans, and the prompt tokens taken from the cache (from before
        this request: what an earlier question of it left there is not counted)."""
        plans = self._plan(state_text, questions, rules)
        if limits is not None:
            limits.check_work(sum((plan.work for plan in plans), Work()))
        totals: list[OptionTotals] = []
        cached, previous = 0, []
        states: dict[tuple[int, ...], np.ndarray] = {}  # heads whose prompts are the same read one hidden state
        for plan in plans:
            if limits is not None:
                limits.check_time()
            fresh = self._pin([plan])
            first = plan.variants[0][1]
            if plan.how is Evaluation.HIDDEN_ONLY:
                key = tuple(plan.prefix)
                if key in states:
                    reused = len(plan.prefix)
                else:
                    states[key] = self.engine.hidden_state(plan.prefix)
                    reused = self.engine.last_reused_tokens
                totals.append(OptionTotals(None, first.answer_lengths, states[key]))
            else:
                trie = self.engine.score_trie(
    plan.prefix,
    plan.continuations,
    hidden=hidden or plan.rule.head is not None,
     epsilon=self.epsilon if plan.how is Evaluation.BOUNDED else 0.0)
                reused = trie.cached_tokens
                totals.append(self._combine(plan, trie))
            cached += max(0, reused - max(common_prefix([previous, plan.held]), fresh.get(id(plan), 0)))
            previous = plan.held
        return totals, plans, cached

    @staticmethod
    def _combine(plan: _Plan, trie) -> OptionTotals:
        first = plan.variants[0][1]
        if trie.lazy:
            scores, bound = bounded_totals(plan.continuations, trie.rows, [b - plan.local for b in first.boundaries])
            return OptionTotals(scores, first.answer_lengths, trie.hidden, bound)
        k = len(plan.question.options)
        rows = iter(trie.rows)
        sums, lengths = np.zeros(k), np.zeros(k)
        for shift, item in plan.variants:
            for position, (boundary, length) in enumerate(zip(item.boundaries, item.answer_lengths)):
                original = (position + shift) % k
                sums[original] += float(next(rows)[boundary - plan.local:].sum())
                lengths[original] += length
        n = len(plan.variants)
        return OptionTotals(list(sums / n), [int(round(x / n)) for x in lengths], trie.hidden)

    def decide(self, state: Any, questions: Sequence[Question], *,
               scoring: Sequence[Scoring | None] | Scoring | None = None, limits: Limits | None = None) -> Decision:
        """Answer every question about one state. The state's tokens are evaluated once for all
        questions. `limits` bounds the work (checked after tokenizing, before any evaluation) and
        the time (checked before each question's evaluation)."""
        began = time.perf_counter()
        request = self._request(state, questions, scoring)
        scored, plans, cached = self._score(request.state_text, request.ordered_questions, request.ordered_rules,
                                            limits=limits)
        return self._finish(request, scored, plans, cached, time.perf_counter() - began)

    def decide_many(self, requests: Sequence[DecisionInput]) -> list[Decision | Exception]:
        """Many decisions, their engine work shared: every one-question request whose answers are
        scored exactly (or read the hidden state alone) goes into `Engine.score_many` with the others,
        the rest are decided one by one. Each decision is what `decide` gives alone; one that cannot be
        decided is its own exception, in its place, and never fails the others."""
        began = time.perf_counter()
        out: list[Decision | Exception | None] = [None] * len(requests)
        shared: list[tuple[int, _Request, _Plan]] = []
        for index, item in enumerate(requests):
            try:
                request = self._request(item.state, item.questions, item.scoring)
                if len(request.questions) == 1 and evaluation(request.rules[0], self.epsilon) is not Evaluation.BOUNDED:
                    [plan] = self._plan(request.state_text, request.ordered_questions, request.ordered_rules)
                    if item.limits is not None:
                        item.limits.check_work(plan.work)
                        item.limits.check_time()
                    shared.append((index, request, plan))
                else:
                    out[index] = self.decide(item.state, item.questions, scoring=item.scoring, limits=item.limits)
            except (LlamaDecideError, ValueError) as exc:
                out[index] = exc
        fresh = self._pin([plan for _, _, plan in shared])
        jobs = [Job(plan.prefix, plan.continuations if plan.how is not Evaluation.HIDDEN_ONLY else (),
                    hidden=plan.rule.head is not None) for _, _, plan in shared]
        scored = self.engine.score_many(jobs) if jobs else []
        seconds = time.perf_counter() - began
        for (index, request, plan), trie in zip(shared, scored):
            try:
                totals = (OptionTotals(None, plan.variants[0][1].answer_lengths, trie.hidden)
                          if plan.how is Evaluation.HIDDEN_ONLY else self._combine(plan, trie))
                cached = max(0, trie.cached_tokens - fresh.get(id(plan), 0))
                out[index] = self._finish(request, [totals], [plan], cached, seconds)
            except (LlamaDecideError, ValueError) as exc:
                out[index] = exc
        return [result for result in out if result is not None]

    def _request(self, state: Any, questions: Sequence[Question],
                 scoring: Sequence[Scoring | None] | Scoring | None) -> _Request:
        if not questions:
            raise InvalidRequestError("at least one question is required", param="questions")
        rules = per_question(scoring, len(questions))
        # Questions go to the engine in an order fixed by their content, not by the request, so
        # reordering (or renaming) the questions of a request changes no answer.
        order = sorted(range(len(questions)), key=lambda i: canonical_key(questions[i], rules[i]))
        return _Request(render_state(state), list(questions), rules, order)

    def _finish(self, request: _Request, scored: list[OptionTotals], plans: list[_Plan], cached: int,
                seconds: float) -> Decision:
        totals: list[OptionTotals] = [scored[0]] * len(request.questions)
        for position, i in enumerate(request.order):
            totals[i] = scored[position]
        answers: list[Answer] = []
        for question, rule, item in zip(request.questions, request.rules, totals):
            prior = self.prior(question, rule) if rule.prior_correction else None
            answers.append(build_answer(question, item, rule, prior=prior, state_text=request.state_text))
        work = sum((plan.work for plan in plans), Work())
        sequences = [s for plan in plans for _, item in plan.variants
                     for s in (item.sequences if plan.how is not Evaluation.HIDDEN_ONLY else [item.prompt_tokens])]
        shared = min(split_point([item for plan in plans for _, item in plan.variants]), common_prefix(sequences))
        return Decision(answers, work.tokens, shared, seconds, {"cached_tokens": min(cached, work.tokens)})

    def scores(self, state: Any, question: Question, *, rotations: int = 1, hidden: bool = False,
               demonstrations: Sequence[Demonstration] = (), layout: str = PROMPT_FORMAT_VERSION,
               ) -> tuple[list[float], list[int], np.ndarray | None]:
        """Raw material for calibration: the option log-likelihoods (averaged over rotations),
        token counts, and optionally the hidden state at the answer position."""
        rule = Scoring(rotations=rotations, demonstrations=tuple(demonstrations), layout=layout)
        totals, _, _ = self._score(render_state(state), [question], [rule], hidden=hidden)
        item = totals[0]
        assert item.logprobs is not None
        return item.logprobs, item.lengths, item.hidden

    def scores_many(self, states: Sequence[Any], question: Question, *, rotations: int = 1, hidden: bool = False,
                    demonstrations: Sequence[Demonstration] = (), layout: str = PROMPT_FORMAT_VERSION,
                    ) -> list[tuple[list[float], list[int], np.ndarray | None]]:
        """`scores` for many states, their engine work shared (`Engine.score_many`); each the same
        as alone."""
        rule = Scoring(rotations=rotations, demonstrations=tuple(demonstrations), layout=layout)
        plans = [self._plan(render_state(state), [question], [rule])[0] for state in states]
        self._pin(plans)
        scored = self.engine.score_many([Job(plan.prefix, plan.continuations, hidden=hidden) for plan in plans])
        out = []
        for plan, trie in zip(plans, scored):
            totals = self._combine(plan, trie)
            assert totals.logprobs is not None
            out.append((totals.logprobs, totals.lengths, totals.hidden))
        return out

    def hidden_many(self, states: Sequence[Any], question: Question, *, demonstrations: Sequence[Demonstration] = (),
                    layout: str = PROMPT_FORMAT_VERSION) -> list[np.ndarray]:
        """`hidden` for many states, their engine work shared; each the same as alone."""
        rule = Scoring(demonstrations=tuple(demonstrations), layout=check_layout(layout))
        items = [self._tokenize(render_state(state), question, shown(question, rule.demonstrations, 0), rule.layout)
                 for state in states]
        pin = self.tokens.pinned_prefix(question, rule, items[0].prompt_tokens) if items else []
        if pin:
            self.engine.pin_prefix(pin)
        return [trie.hidden for trie in self.engine.score_many([Job(item.prompt_tokens) for item in items])]

    def _pin(self, plans: Sequence[_Plan]) -> dict[int, int]:
        """Pin each distinct question prefix of these plans (once per question and rule). Returns, by
        plan id, the length of a prefix pinned now (evaluated for these plans, so not cached for them)."""
        done: dict[str, int] = {}
        fresh: dict[int, int] = {}
        held = {tuple(p) for p in self.engine.pinned}
        for plan in plans:
            key = canonical_key(plan.question, plan.rule)
            if key not in done:
                pin = self.tokens.pinned_prefix(plan.question, plan.rule, plan.variants[0][1].prompt_tokens)
                done[key] = len(pin) if pin and tuple(pin) not in held else 0
                if pin:
                    self.engine.pin_prefix(pin)
            if done[key]:
                fresh[id(plan)] = done[key]
        return fresh

    def hidden(self, state: Any, question: Question, *, demonstrations: Sequence[Demonstration] = (),
               layout: str = PROMPT_FORMAT_VERSION) -> np.ndarray:
        """What a head on the hidden state alone reads: the hidden state at the answer position,
        with only the prompt evaluated (the question prefix pinned as a decision pins it)."""
        rule = Scoring(demonstrations=tuple(demonstrations), layout=check_layout(layout))
        item = self._tokenize(render_state(state), question, shown(question, rule.demonstrations, 0), rule.layout)
        pin = self.tokens.pinned_prefix(question, rule, item.prompt_tokens)
        if pin:
            self.engine.pin_prefix(pin)
        return self.engine.hidden_state(item.prompt_tokens)

    def footprint(self, question: Question, rule: Scoring) -> tuple[int, int]:
        """What a question needs of the context whatever its input: its pinned prefix's tokens, and
        the longest prompt with its answer for a one-token input."""
        item = self._tokenize("-", question, shown(question, rule.demonstrations, 0), rule.layout)
        return len(self.tokens.pinned_prefix(question, rule, item.prompt_tokens)), max(len(s) for s in item.sequences)

    def cost(self, state: Any, question: Question, rule: Scoring) -> tuple[int, int, int]:
        """What deciding `question` about `state` under `rule` evaluates once its pinned prefix is held:
        (answer rows: the prompt's rest and the answer trie; prompt rows: the prompt's rest alone, what
        its hidden state needs; the pinned prefix's length, which every one of those rows attends to)."""
        [plan] = self._plan(render_state(state), [question], [rule])
        prompt = plan.variants[0][1].prompt_tokens
        pinned = len(self.tokens.pinned_prefix(question, rule, prompt))
        return plan.work.rows - pinned, len(prompt) - pinned, pinned

    def content_free_scores(self,
    question: Question,
    *,
    rotations: int = 1,
    demonstrations: Sequence[Demonstration] = (),
    layout: str = PROMPT_FORMAT_VERSION) -> tuple[np.ndarray,
     np.ndarray]:
        """Option log-likelihoods (rows: `maths.CONTENT_FREE_INPUTS`) and token counts for inputs
        that carry no content (after the same demonstrations, if any), from an empty KV cache."""
        rule = Scoring(rotations=rotations, demonstrations=tuple(demonstrations), layout=layout)
        self.engine.clear_cache()
        rows, lengths = [], []
        for text in maths.CONTENT_FREE_INPUTS:
            totals, _, _ = self._score(text, [question], [rule])
            rows.append(totals[0].logprobs)
            lengths.append(totals[0].lengths)
        return np.asarray(rows), np.asarray(lengths, dtype=np.float64)

    def prior(self, question: Question, rule: Scoring) -> np.ndarray:
        """The question's content-free log prior over its options: the rule's fixed one (a profile's),
        else computed (cached per question, options, mode, rotations, demonstrations and
        normalisation)."""
        if rule.prior is not None:
            return np.asarray(rule.prior)
        key = (question.type, question.instructions, question.options, question.mode, rule.rotations,
               rule.demonstrations, rule.length_normalize, rule.layout)
        cached = self._priors.get(key)
        if cached is not None:
            self._priors.move_to_end(key)
            return cached
        rows, lengths = self.content_free_scores(question, rotations=rule.rotations, demonstrations=rule.demonstrations,
                                                 layout=rule.layout)
        prior = maths.content_free_prior(rows, lengths if rule.length_normalize else None)
        self._priors[key] = prior
        while len(self._priors) > self._prior_cache_size:
            self._priors.popitem(last=False)
        return prior

    def decide_naive(self, state: Any, question: Question, *, scoring: Scoring | None = None) -> Answer:
        """Reference path: one full evaluation from scratch per option. Slow; for checks and the
        benchmark baseline."""
        rule = scoring or Scoring()
        item = self._tokenize(render_state(state), question, shown(question, rule.demonstrations, 0), rule.layout)
        totals = [float(self.engine.score_naive(s, b).sum()) for s, b in zip(item.sequences, item.boundaries)]
        return build_answer(question, OptionTotals(totals, item.answer_lengths), rule)
