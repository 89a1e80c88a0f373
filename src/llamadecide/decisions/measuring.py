"""What calibration and the benchmarks read of the model, apart from the request path (`Decider`):
option log-likelihoods and hidden states for many inputs in shared calls, content-free scores, what a
question costs and needs of the context, and the from-scratch reference. Each reads what a decision
under the same rule would read, to the bit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from llamadecide.decisions.answers import Answer, OptionTotals, build_answer
from llamadecide.decisions.planner import QuestionPlanner
from llamadecide.decisions.prompt import check_prompt_format, render_state
from llamadecide.decisions.questions import Question
from llamadecide.decisions.rotations import shown
from llamadecide.decisions.scoring import Scoring
from llamadecide.decisions.scoring_engine import ScoringEngine
from llamadecide.engine.values import ScoringInput

PLAIN = Scoring()  # the state-first prompt, no demonstrations, one rotation


class Measurer:
    """Reads one engine the way a `Decider` on it would (a planner of its own: pins are shared in the
    engine, tokenizer caches are not)."""

    def __init__(self, engine: ScoringEngine) -> None:
        self.planner = QuestionPlanner(engine)
        self.engine = engine

    def scores(
        self,
        state: Any,
        question: Question,
        rule: Scoring = PLAIN,
        *,
        hidden: bool = False,
        hidden_layer: int | None = None,
    ) -> tuple[list[float], list[int], np.ndarray | None]:
        """Raw material for calibration: the option log-likelihoods under `rule`'s prompt (averaged
        over its rotations), token counts, and optionally the hidden state at the answer position (the
        output of block `hidden_layer`, None: the final state)."""
        totals, _, _ = self.planner.score(
            render_state(state), [question], [rule], hidden=hidden, hidden_layer=hidden_layer
        )
        item = totals[0]
        assert item.logprobs is not None
        return item.logprobs, item.lengths, item.hidden

    def scores_many(
        self,
        states: Sequence[Any],
        question: Question,
        rule: Scoring = PLAIN,
        *,
        hidden: bool = False,
        hidden_layer: int | None = None,
    ) -> list[tuple[list[float], list[int], np.ndarray | None]]:
        """`scores` for many states, their engine work shared (`Engine.score_many`); each the same
        as alone."""
        plans = [self.planner.plan(render_state(state), [question], [rule.raw()])[0] for state in states]
        self.planner.pin(plans)
        scored = self.engine.score_many(
            [ScoringInput(plan.prefix, plan.continuations, hidden=hidden, hidden_layer=hidden_layer) for plan in plans]
        )
        out = []
        for plan, trie in zip(plans, scored):
            totals = self.planner.combine(plan, trie)
            assert totals.logprobs is not None
            out.append((totals.logprobs, totals.lengths, totals.hidden))
        return out

    def hidden_many(
        self, states: Sequence[Any], question: Question, rule: Scoring = PLAIN, *, layer: int | None = None
    ) -> list[np.ndarray]:
        """`hidden` for many states, their engine work shared; each the same as alone."""
        check_prompt_format(rule.prompt_format)
        shown_first = shown(question, rule.demonstrations, 0)
        items = [
            self.planner.tokens.prompt_only(render_state(state), question, shown_first, rule.prompt_format)
            for state in states
        ]
        pin = self.planner.tokens.pinned_prefix(question, rule, items[0].prompt_tokens) if items else []
        if pin:
            self.engine.pin_prefix(pin)
        inputs = [ScoringInput(item.prompt_tokens, hidden_layer=layer) for item in items]
        return [trie.hidden for trie in self.engine.score_many(inputs)]

    def hidden(self, state: Any, question: Question, rule: Scoring = PLAIN, *, layer: int | None = None) -> np.ndarray:
        """What a head on the hidden state alone reads: the hidden state at the answer position of
        `rule`'s prompt (the output of block `layer`, None: the final state), with only the prompt
        evaluated (the question prefix pinned as a decision pins it)."""
        check_prompt_format(rule.prompt_format)
        item = self.planner.tokens.prompt_only(
            render_state(state), question, shown(question, rule.demonstrations, 0), rule.prompt_format
        )
        pin = self.planner.tokens.pinned_prefix(question, rule, item.prompt_tokens)
        if pin:
            self.engine.pin_prefix(pin)
        return self.engine.hidden_state(item.prompt_tokens, layer)

    def footprint(self, question: Question, rule: Scoring) -> tuple[int, int]:
        """What a question needs of the context whatever its input: its pinned prefix's tokens, and
        the longest prompt with its answer for a one-token input."""
        item = self.planner.tokenize("-", question, shown(question, rule.demonstrations, 0), rule.prompt_format)
        pinned = self.planner.tokens.pinned_prefix(question, rule, item.prompt_tokens)
        return len(pinned), max(len(s) for s in item.sequences)

    def cost(self, state: Any, question: Question, rule: Scoring) -> tuple[int, int, int]:
        """What deciding `question` about `state` under `rule` evaluates once its pinned prefix is held:
        (answer rows: the prompt's rest and the answer trie; prompt rows: the prompt's rest alone, what
        its hidden state needs; the pinned prefix's length, which every one of those rows attends to)."""
        [plan] = self.planner.plan(render_state(state), [question], [rule])
        prompt = plan.rotations[0][1].prompt_tokens
        pinned = len(self.planner.tokens.pinned_prefix(question, rule, prompt))
        return plan.work.rows - pinned, len(prompt) - pinned, pinned

    def content_free_scores(self, question: Question, rule: Scoring = PLAIN) -> tuple[np.ndarray, np.ndarray]:
        """Option log-likelihoods (rows: `maths.CONTENT_FREE_INPUTS`) and token counts under `rule`'s
        prompt for inputs that carry no content, from an empty KV cache."""
        return self.planner.content_free_scores(question, rule)

    def decide_naive(self, state: Any, question: Question, *, scoring: Scoring | None = None) -> Answer:
        """Reference path: one full evaluation from scratch per option. Slow; for checks and the
        benchmark baseline."""
        rule = scoring or Scoring()
        item = self.planner.tokenize(
            render_state(state), question, shown(question, rule.demonstrations, 0), rule.prompt_format
        )
        totals = [float(self.engine.score_naive(s, b).sum()) for s, b in zip(item.sequences, item.boundaries)]
        return build_answer(question, OptionTotals(totals, item.answer_lengths), rule)
