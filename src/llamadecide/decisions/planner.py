"""What deciding and measuring share: a question about a state planned as one engine call (tokenized
in context, checked against the context, its work counted), its fixed prefix pinned, the call made,
and the answers' log-likelihoods combined over rotations. `Decider` (the request path) and `Measurer`
(what calibration and the benchmarks read) both work through a planner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llamadecide.decisions import maths
from llamadecide.decisions.answers import OptionTotals, bounded_totals
from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION
from llamadecide.decisions.questions import Question
from llamadecide.decisions.rotations import shown
from llamadecide.decisions.scoring import Evaluation, Scoring, evaluation
from llamadecide.decisions.scoring_engine import ScoringEngine
from llamadecide.decisions.tokenized import (
    QuestionTokenizer,
    TokenizedQuestion,
    canonical_key,
    common_prefix,
    describe,
    split_point,
)
from llamadecide.decisions.work import Limits, Work, prompt_work, trie_work
from llamadecide.engine.values import TrieScores
from llamadecide.errors import ContextOverflowError


@dataclass(frozen=True)
class QuestionCall:
    """One question's engine call: a trie (prefix, continuations) or, for a head on the hidden
    state alone, the prompt; `held` is what the engine's prompt sequence holds afterwards."""

    question: Question
    rule: Scoring
    how: Evaluation
    rotations: list[tuple[int, TokenizedQuestion]]  # (shift, the question rotated by it), shift 0 first
    prefix: list[int]
    continuations: list[list[int]]
    local: int
    held: list[int]
    work: Work


class QuestionPlanner:
    """Plans, pins and scores questions on one engine. Not thread-safe (the engine serialises calls)."""

    def __init__(self, engine: ScoringEngine, *, max_bound: float = 0.0) -> None:
        """max_bound > 0: a plain softmax question's answers may be expanded best-first, each probability
        within max_bound of the exact one (`scoring.evaluation`). 0: always exact."""
        if max_bound < 0 or max_bound >= 1:
            raise ValueError("max_bound must be in [0, 1)")
        self.engine = engine
        self.max_bound = max_bound
        self.tokens = QuestionTokenizer(engine)

    def tokenize(
        self,
        state_text: str,
        question: Question,
        demonstrations: Sequence[tuple[str, str]] = (),
        prompt_format: str = PROMPT_FORMAT_VERSION,
    ) -> TokenizedQuestion:
        return self.tokens.tokenize(state_text, question, demonstrations, prompt_format)

    def plan(self, state_text: str, questions: Sequence[Question], rules: Sequence[Scoring]) -> list[QuestionCall]:
        """One engine call per question, in the given order, each knowing what the one before leaves
        in the engine's prompt sequence (its work counts only what is new). What cannot fit the
        context is refused here, before any evaluation."""
        plans, previous = [], []
        for question, rule in zip(questions, rules):
            rule.check()
            how = evaluation(rule, self.max_bound)
            if how is Evaluation.HIDDEN_ONLY:  # no answer is read: the prompt alone
                shown_first = shown(question, rule.demonstrations, 0)
                rotations = [(0, self.tokens.prompt_only(state_text, question, shown_first, rule.prompt_format))]
            else:
                rotations = self.tokens.rotations(state_text, question, rule)
            longest = max(len(s) for _, item in rotations for s in item.sequences)
            # a head's prompt is held to the bound of a prompt with a one-token answer
            needed = longest + 1 if how is Evaluation.HIDDEN_ONLY else longest
            if needed > self.engine.max_sequence:  # what cannot fit is refused before any work
                raise ContextOverflowError(
                    f"question {describe(question)}: the prompt with its longest answer needs {needed} tokens but "
                    f"the context holds {self.engine.n_ctx} (of which {self.engine.max_sequence} for a prompt with "
                    "its answer; shorten the input or the options, or raise n_ctx)",
                    param="questions",
                )
            if how is Evaluation.HIDDEN_ONLY:
                prompt = rotations[0][1].prompt_tokens
                plans.append(
                    QuestionCall(question, rule, how, rotations, prompt, [], 0, prompt, prompt_work(previous, prompt))
                )
            else:
                local = split_point([item for _, item in rotations])
                group = [s for _, item in rotations for s in item.sequences]
                prefix, continuations = group[0][:local], [s[local:] for s in group]
                plans.append(
                    QuestionCall(
                        question,
                        rule,
                        how,
                        rotations,
                        prefix,
                        continuations,
                        local,
                        prefix[:-1],
                        trie_work(previous, prefix, continuations),
                    )
                )
            previous = plans[-1].held
        return plans

    def score(
        self,
        state_text: str,
        questions: Sequence[Question],
        rules: Sequence[Scoring],
        *,
        limits: Limits | None = None,
        hidden: bool = False,
        hidden_layer: int | None = None,
    ) -> tuple[list[OptionTotals], list[QuestionCall], int]:
        """Per question, every option of every rotation in one engine call, and each option's
        log-likelihood averaged over its rotations, in the question's own option order; with the
        hidden state at the answer position from the same call when a head needs it (of its block),
        or `hidden` (of `hidden_layer`).
        Returns the totals, the plans, and the prompt tokens taken from the cache (from before
        this request: what an earlier question of it left there is not counted)."""
        plans = self.plan(state_text, questions, rules)
        if limits is not None:
            limits.check_work(sum((plan.work for plan in plans), Work()))
        totals: list[OptionTotals] = []
        cached, previous = 0, []
        states: dict[tuple, np.ndarray] = {}  # heads whose prompts and blocks are the same read one hidden state
        for plan in plans:
            if limits is not None:
                limits.check_time()
            fresh = self.pin([plan])
            layer = plan.rule.head.layer if plan.rule.head is not None else hidden_layer
            if plan.how is Evaluation.HIDDEN_ONLY:
                key = (layer, *plan.prefix)
                if key in states:
                    reused = len(plan.prefix)
                else:
                    states[key] = self.engine.hidden_state(plan.prefix, layer)
                    reused = self.engine.last_reused_tokens
                totals.append(self.hidden_totals(plan, states[key]))
            else:
                trie = self.engine.score_trie(
                    plan.prefix,
                    plan.continuations,
                    hidden=hidden or plan.rule.head is not None,
                    hidden_layer=layer,
                    max_bound=self.max_bound if plan.how is Evaluation.BOUNDED else 0.0,
                )
                reused = trie.cached_tokens
                totals.append(self.combine(plan, trie))
            cached += max(0, reused - max(common_prefix([previous, plan.held]), fresh.get(id(plan), 0)))
            previous = plan.held
        return totals, plans, cached

    @staticmethod
    def hidden_totals(plan: QuestionCall, hidden: np.ndarray) -> OptionTotals:
        """What a head on the hidden state alone reads: no answer scored (0 tokens each), the state."""
        return OptionTotals(None, [0] * len(plan.question.options), hidden)

    @staticmethod
    def combine(plan: QuestionCall, trie: TrieScores) -> OptionTotals:
        first = plan.rotations[0][1]
        if trie.best_first:
            scores, bound = bounded_totals(plan.continuations, trie.rows, [b - plan.local for b in first.boundaries])
            return OptionTotals(scores, first.answer_lengths, trie.hidden, bound)
        k = len(plan.question.options)
        rows = iter(trie.rows)
        sums, lengths = np.zeros(k), np.zeros(k)
        for shift, item in plan.rotations:
            for position, (boundary, length) in enumerate(zip(item.boundaries, item.answer_lengths)):
                original = (position + shift) % k
                sums[original] += float(next(rows)[boundary - plan.local :].sum())
                lengths[original] += length
        n = len(plan.rotations)
        return OptionTotals(list(sums / n), [int(round(x / n)) for x in lengths], trie.hidden)

    def pin(self, plans: Sequence[QuestionCall]) -> dict[int, int]:
        """Pin each distinct question prefix of these plans (once per question and rule). Returns, by
        plan id, the length of a prefix pinned now (evaluated for these plans, so not cached for them)."""
        done: dict[str, int] = {}
        fresh: dict[int, int] = {}
        held = {tuple(p) for p in self.engine.pinned}
        for plan in plans:
            key = canonical_key(plan.question, plan.rule)
            if key not in done:
                pin = self.tokens.pinned_prefix(plan.question, plan.rule, plan.rotations[0][1].prompt_tokens)
                done[key] = len(pin) if pin and tuple(pin) not in held else 0
                if pin:
                    self.engine.pin_prefix(pin)
            if done[key]:
                fresh[id(plan)] = done[key]
        return fresh

    def content_free_scores(self, question: Question, rule: Scoring) -> tuple[np.ndarray, np.ndarray]:
        """Option log-likelihoods (rows: `maths.CONTENT_FREE_INPUTS`) and token counts under `rule`'s
        prompt (its format, demonstrations and rotations) for inputs that carry no content, from an
        empty KV cache."""
        self.engine.clear_cache()
        rows, lengths = [], []
        for text in maths.CONTENT_FREE_INPUTS:
            totals, _, _ = self.score(text, [question], [rule.raw()])
            rows.append(totals[0].logprobs)
            lengths.append(totals[0].lengths)
        return np.asarray(rows), np.asarray(lengths, dtype=np.float64)
