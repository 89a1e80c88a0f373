"""Answers that skip work: the best-first answer trie with its certified bound, heads that
read the hidden state in the scoring call or alone, on the real bundled model."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import engine_config
from llamadecide.calibration.data import TASKS_DIR, load_task
from llamadecide.decisions import Decider, Scoring, choice, maths
from llamadecide.decisions.prompt import build_messages
from llamadecide.decisions.scoring import Head
from llamadecide.engine import Engine, bundled_model_path

TEXT = "I lost my card yesterday and I think someone is using it, can you block it?"


@pytest.fixture(scope="module")
def bf_engine() -> Engine:
    """Lazy from 8 trie nodes up, so that a question of the size tests can afford takes that path."""
    return Engine(engine_config(bundled_model_path(), n_ctx=4096, call_cost_rows=8))


@pytest.fixture(scope="module")
def intents():
    return choice(
        "Which banking intent is this?",
        [o.text for o in load_task(TASKS_DIR / "banking77.yaml").question().options][:40],
    )


def counted(engine, work):
    before = dict(engine.counters)
    result = work()
    return result, {key: engine.counters[key] - before[key] for key in ("decode_calls", "rows")}


@pytest.mark.parametrize("max_bound", [0.05, 0.001])
def test_every_bounded_probability_is_within_its_bound_of_the_exact_one(bf_engine, intents, max_bound):
    exact, exact_work = counted(bf_engine, lambda: Decider(bf_engine).decide(TEXT, [intents]).answers[0])
    bf_engine.clear_cache()
    bounded, work = counted(
        bf_engine, lambda: Decider(bf_engine, max_bound=max_bound).decide(TEXT, [intents]).answers[0]
    )
    assert exact.probability_bound == 0.0
    assert 0.0 < bounded.probability_bound <= max_bound
    gap = np.abs(np.array(exact.probabilities) - np.array(bounded.probabilities))
    assert gap.max() <= bounded.probability_bound
    assert sum(bounded.probabilities) == pytest.approx(1.0)
    assert work["decode_calls"] > 1  # tail and root first, then the likeliest subtrees
    if max_bound == 0.05:  # a loose bound leaves most of the trie unevaluated
        assert work["rows"] < exact_work["rows"]
        assert bounded.choice == exact.choice


def test_the_bound_only_applies_to_plain_softmax_answers_and_large_tries(bf_engine, intents):
    decider = Decider(bf_engine, max_bound=0.05)
    tempered = decider.decide(TEXT, [intents], scoring=Scoring(temperature=2.0)).answers[0]
    assert tempered.probability_bound == 0.0 and all(o.logprob is not None for o in tempered.options)
    small = decider.decide(TEXT, [choice("Is this about a card?", ["yes", "no"])]).answers[0]
    assert small.probability_bound == 0.0  # a trie under call_cost_rows is cheaper in one pass


def test_the_default_engine_keeps_small_tries_exact_and_in_one_call(engine):
    question = choice("Which team?", ["Billing", "Technical support", "Account security"])
    answer, work = counted(engine, lambda: Decider(engine, max_bound=0.01).decide(TEXT, [question]).answers[0])
    assert answer.probability_bound == 0.0 and work["decode_calls"] == 1


def test_engine_rows_are_nan_exactly_where_the_trie_was_not_expanded(bf_engine, intents):
    decider = Decider(bf_engine)
    item = decider.planner.tokenize(TEXT, intents)
    local = min(item.boundaries)
    continuations = [s[local:] for s in item.sequences]
    prefix = item.sequences[0][:local]
    exact = bf_engine.score_trie(prefix, continuations)
    lazy = bf_engine.score_trie(prefix, continuations, max_bound=2.0)
    assert not exact.best_first and all(exact.complete)
    assert lazy.best_first and 0 < sum(lazy.complete) < len(continuations)
    for full, partial in zip(exact.rows, lazy.rows):
        known = ~np.isnan(partial)
        assert known[0]  # every first token comes from the root
        assert not known[int(np.argmin(known)) :].any() if not known.all() else True  # known part is a prefix
        assert np.array_equal(partial[known], full[known])


def test_a_head_takes_the_hidden_state_from_the_scoring_call(engine):
    question = choice("What is the topic?", ["World", "Sports", "Business", "Science"])
    width = 4 + int(engine.metadata["llama.embedding_length"])
    rng = np.random.default_rng(0)
    head = Head(rng.normal(scale=0.05, size=(4, width)), rng.normal(size=4))
    answer, work = counted(
        engine, lambda: Decider(engine).decide(TEXT, [question], scoring=Scoring(head=head)).answers[0]
    )
    assert work["decode_calls"] == 1
    hidden = engine.hidden_state(engine.tokenize_prompt(engine.render_chat(build_messages(TEXT, question))))
    features = maths.head_features([o.logprob for o in answer.options], hidden)
    assert answer.probabilities == pytest.approx(
        list(maths.head_probabilities(features, head.weights, head.intercept)), abs=1e-4
    )


def test_a_head_on_the_hidden_state_alone_scores_no_answer(engine, intents):
    width = int(engine.metadata["llama.embedding_length"])
    rng = np.random.default_rng(1)
    k = len(intents.options)
    head = Head(rng.normal(scale=0.05, size=(k, width)), rng.normal(size=k), features=maths.HIDDEN_ONLY)
    assert not head.reads_logprobs
    engine.clear_cache()
    decision, work = counted(engine, lambda: Decider(engine).decide(TEXT, [intents], scoring=Scoring(head=head)))
    answer = decision.answers[0]
    prompt = engine.tokenize_prompt(engine.render_chat(build_messages(TEXT, intents)))
    assert work == {
        "decode_calls": -(-len(prompt) // engine.call_rows),  # its calls, the hidden state read in the last
        "rows": len(prompt),
    }  # the prompt, nothing else
    assert decision.prompt_tokens == len(prompt)
    assert answer.label_mass is None and all(o.logprob is None for o in answer.options)
    hidden = engine.hidden_state(prompt)
    expected = maths.head_probabilities(
        maths.head_features(None, hidden, maths.HIDDEN_ONLY), head.weights, head.intercept
    )
    assert answer.probabilities == pytest.approx(list(expected), abs=1e-4)
