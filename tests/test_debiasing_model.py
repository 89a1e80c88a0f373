"""Prior correction, option-order rotations and fitted heads, on the real bundled model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from llamadecide.decisions import Decider, Scoring, choice, maths, predicate, score
from llamadecide.decisions.measuring import Measurer
from llamadecide.decisions.rotations import rotate
from llamadecide.decisions.scoring import Demonstration, Head
from llamadecide.engine import Engine, ScoringInput
from llamadecide.errors import InvalidRequestError
from test_scoring_model import ROUNDING

NEWS = "The central bank raised interest rates by half a point, sending bond yields to a ten-year high."
TOPIC = ["World", "Sports", "Business", "Science"]


def test_prior_correction_divides_out_the_content_free_answer(engine):
    decider = Decider(engine)
    question = choice("What is the topic of this news article?", TOPIC)
    plain = decider.decide(NEWS, [question]).answers[0]
    corrected = decider.decide(NEWS, [question], scoring=Scoring(prior_correction=True)).answers[0]
    rows, _ = Measurer(engine).content_free_scores(question)
    assert rows.shape == (len(maths.CONTENT_FREE_INPUTS), len(TOPIC))
    prior = maths.content_free_prior(rows)
    # Exactly softmax(log p - log p_cf): the raw log-likelihoods are reported unchanged.
    assert [o.logprob for o in corrected.options] == [o.logprob for o in plain.options]
    expected = maths.normalise([o.logprob for o in plain.options], prior=prior)
    assert corrected.probabilities == pytest.approx(list(expected), abs=1e-12)
    # A content-free input is uniform after correction (up to the two inputs disagreeing).
    assert np.exp(prior).sum() == pytest.approx(1.0)
    assert corrected.probabilities != pytest.approx(plain.probabilities, abs=1e-3)


def test_the_content_free_answers_do_not_depend_on_what_the_cache_held(engine):
    decider = Decider(engine)
    question = choice("What is the topic of this news article?", TOPIC)
    first, _ = Measurer(engine).content_free_scores(question)
    decider.decide(NEWS, [question, predicate("The article is about money.")])
    decider.decide("Another story entirely, about football and the weather.", [question], scoring=Scoring(rotations=2))
    shown = (Demonstration("Stocks fell sharply on Monday.", 2), Demonstration("The striker scored twice.", 1))
    decider.decide(NEWS, [question], scoring=Scoring(demonstrations=shown))  # pins a prefix sharing the system turn
    again, _ = Measurer(engine).content_free_scores(question)
    engine.clear_cache()
    assert np.array_equal(first, again)


def test_the_prior_is_computed_once_per_question(engine, monkeypatch):
    decider = Decider(engine)
    question = predicate("The review is positive.")
    calls = []
    original = decider.planner.content_free_scores
    monkeypatch.setattr(decider.planner, "content_free_scores", lambda q, rule: calls.append(q) or original(q, rule))
    for text in ("A wonderful film.", "Dull and far too long.", "A wonderful film."):
        decider.decide(text, [question], scoring=Scoring(prior_correction=True))
    assert len(calls) == 1
    decider.decide("Fine.", [predicate("The review is negative.")], scoring=Scoring(prior_correction=True))
    assert len(calls) == 2  # another question, another prior


def test_a_fixed_prior_is_served_as_given_and_not_recomputed(engine, monkeypatch):
    decider = Decider(engine)
    question = choice("What is the topic of this news article?", TOPIC)
    monkeypatch.setattr(decider.planner, "content_free_scores", lambda q, rule: pytest.fail("the prior was recomputed"))
    fixed = (-0.5, -2.0, -1.0, -3.0)
    served = decider.decide(NEWS, [question], scoring=Scoring(prior_correction=True, prior=fixed)).answers[0]
    expected = maths.normalise([o.logprob for o in served.options], prior=np.array(fixed))
    assert served.probabilities == pytest.approx(list(expected), abs=1e-12)
    assert served.probabilities != pytest.approx(list(maths.normalise([o.logprob for o in served.options])), abs=1e-3)


def test_full_rotation_makes_the_answer_independent_of_option_order(engine):
    decider = Decider(engine)
    question = choice("What is the topic of this news article?", TOPIC, mode="labels")
    rule = Scoring(rotations=4)
    base = decider.decide(NEWS, [question], scoring=rule).answers[0]
    shifted = decider.decide(NEWS, [rotate(question, 1)], scoring=rule).answers[0]
    by_value = {o.value: o.probability for o in shifted.options}
    # Same four prompts either way, evaluated in another batch order: the same numbers, averaged in another order.
    assert [by_value[o.value] for o in base.options] == pytest.approx(base.probabilities, abs=ROUNDING)
    plain = decider.decide(NEWS, [question]).answers[0]
    plain_shifted = decider.decide(NEWS, [rotate(question, 1)]).answers[0]
    unrotated_gap = max(
        abs(a - {o.value: o.probability for o in plain_shifted.options}[o.value])
        for a, o in zip(plain.probabilities, plain.options)
    )
    rotated_gap = max(abs(a - by_value[o.value]) for a, o in zip(base.probabilities, base.options))
    assert rotated_gap < unrotated_gap  # the tiny model is order-biased; rotations remove it


def test_rotated_scores_are_the_mean_of_each_rotation(engine):
    decider = Decider(engine)
    question = choice("What is the topic of this news article?", TOPIC, mode="labels")
    combined = decider.decide(NEWS, [question], scoring=Scoring(rotations=2)).answers[0]
    singles = [decider.decide(NEWS, [rotate(question, s)]).answers[0] for s in (0, 2)]
    for option in combined.options:
        each = [next(o.logprob for o in answer.options if o.value == option.value) for answer in singles]
        assert option.logprob == pytest.approx(np.mean(each), abs=ROUNDING)


def test_rotation_errors_are_the_callers(engine):
    decider = Decider(engine)
    with pytest.raises(InvalidRequestError, match="at most 2 rotations"):
        decider.decide(NEWS, [predicate("It is about money.")], scoring=Scoring(rotations=3))
    with pytest.raises(InvalidRequestError, match="levels are ordered"):
        decider.decide(NEWS, [score("How important?", ["low", "high"])], scoring=Scoring(rotations=2))
    with pytest.raises(InvalidRequestError, match="at least 1"):
        decider.decide(NEWS, [predicate("It is about money.")], scoring=Scoring(rotations=0))


def test_hidden_state_is_deterministic_and_reuses_the_cache(engine):
    from llamadecide.decisions.prompt import build_messages

    question = choice("Topic?", TOPIC)
    prompt = engine.tokenize_prompt(engine.render_chat(build_messages(NEWS, question)))
    first = engine.hidden_state(prompt)
    rows = engine.counters["rows"]
    cached = engine.hidden_state(prompt)
    assert engine.counters["rows"] - rows == 1  # the cached prompt: only its last token evaluated again
    assert np.array_equal(first, cached)
    Decider(engine).decide(NEWS, [question])
    engine.clear_cache()
    again = engine.hidden_state(prompt)
    assert first.shape == (int(engine.metadata["llama.embedding_length"]),)
    assert np.array_equal(first, again)
    assert np.isfinite(first).all() and np.linalg.norm(first) > 0


def test_hidden_states_are_read_inside_the_call_as_the_embeddings_mode_reads_them(engine):
    """The tap copies the last layer's output of the rows asked for and stops a call that reads no
    logits before the vocabulary projection (counted); the states are bit-identical to those of
    llama.cpp's embeddings mode, which makes every row an output."""
    question = choice("Topic?", TOPIC)
    measurer = Measurer(engine)
    texts = [NEWS, "The striker scored twice in the cup final.", "A new chip doubles battery life."]
    engine.clear_cache()
    skipped = engine.counters["projections_skipped"]
    tapped = measurer.hidden_many(texts, question, Scoring(prompt_format="llamadecide-6"))
    alone = [measurer.hidden(text, question, Scoring(prompt_format="llamadecide-6")) for text in texts]
    assert engine.counters["projections_skipped"] - skipped >= 1 + len(texts)
    plain = Engine(dataclasses.replace(engine.config, hidden_tap=False))
    try:
        embedded = Measurer(plain).hidden_many(texts, question, Scoring(prompt_format="llamadecide-6"))
        assert plain.counters["projections_skipped"] == 0
    finally:
        plain.close()
    for a, b, c in zip(tapped, alone, embedded):
        assert np.array_equal(a, b) and np.array_equal(a, c)


def test_a_blocks_hidden_state_stops_the_call_there_and_equals_the_full_calls(engine):
    """A block's output read from a call that stops after it (nothing reads logits) is bit-identical
    to the same block read from a full call that reads logits, alone or beside other inputs; such a
    call runs fewer blocks (counted as a stopped call) and its shallow cells are reused only by reads
    no deeper: scoring afterwards equals scoring on a fresh cache."""
    from llamadecide.decisions.prompt import build_messages

    question = choice("Topic?", TOPIC)
    prompt = engine.tokenize_prompt(engine.render_chat(build_messages(NEWS, question)))
    other = engine.tokenize_prompt(engine.render_chat(build_messages("The striker scored twice.", question)))
    layer = engine.n_layer // 2
    engine.clear_cache()
    fresh = engine.score_trie(prompt, [[1, 2], [3]]).rows
    engine.clear_cache()
    skipped, rows, depth_rows = (engine.counters[k] for k in ("projections_skipped", "rows", "full_depth_rows"))
    stopped = engine.hidden_state(prompt, layer)
    assert engine.counters["projections_skipped"] - skipped == 1
    evaluated = engine.counters["rows"] - rows  # each ran layer + 1 of the model's blocks
    assert engine.counters["full_depth_rows"] - depth_rows == pytest.approx(evaluated * (layer + 1) / engine.n_layer)
    rows = engine.counters["rows"]
    assert np.array_equal(engine.hidden_state(prompt, layer), stopped)
    assert engine.counters["rows"] - rows == 1  # the shallow cells serve a read as deep
    rows = engine.counters["rows"]
    full = engine.score_trie(prompt, [[1, 2], [3]], hidden=True, hidden_layer=layer)
    assert engine.counters["rows"] - rows > 1  # but not a call that runs every block
    assert np.array_equal(full.hidden, stopped)
    assert all(np.array_equal(a, b) for a, b in zip(full.rows, fresh))
    shared = engine.score_many([ScoringInput(other, hidden_layer=layer - 1), ScoringInput(prompt, hidden_layer=layer)])
    assert np.array_equal(shared[1].hidden, stopped)
    final = engine.hidden_state(prompt)
    assert not np.allclose(final, stopped)
    with pytest.raises(InvalidRequestError, match="fitted for another model"):
        engine.hidden_state(prompt, engine.n_layer - 1)  # the last block's output is the final state's input


def test_a_head_reads_log_likelihoods_and_the_hidden_state(engine):
    from llamadecide.decisions.prompt import build_messages

    decider = Decider(engine)
    question = choice("What is the topic of this news article?", TOPIC)
    width = len(TOPIC) + int(engine.metadata["llama.embedding_length"])
    rng = np.random.default_rng(0)
    head = Head(rng.normal(scale=0.05, size=(len(TOPIC), width)), rng.normal(size=len(TOPIC)))
    answer = decider.decide(NEWS, [question], scoring=Scoring(head=head)).answers[0]
    hidden = engine.hidden_state(engine.tokenize_prompt(engine.render_chat(build_messages(NEWS, question))))
    features = maths.head_features(np.array([o.logprob for o in answer.options]), hidden)
    assert answer.probabilities == pytest.approx(
        list(maths.head_probabilities(features, head.weights, head.intercept)), abs=1e-9
    )
    wrong = Head(np.zeros((len(TOPIC), width + 1)), np.zeros(len(TOPIC)))
    with pytest.raises(InvalidRequestError, match="fitted for another model"):
        decider.decide(NEWS, [question], scoring=Scoring(head=wrong))


def test_an_answer_does_not_depend_on_the_other_questions_or_their_order(engine):
    decider = Decider(engine)
    text = "Hi, I was charged twice for my March invoice and I am really annoyed."
    anger = score("How frustrated is the customer?", ["Calm", "Frustrated", "Very angry"])
    team = choice("Which team?", ["Billing", "Technical", "Sales"])
    refund = predicate("Is the customer asking for money back?")
    alone = decider.decide(text, [anger]).answers[0].probabilities
    decider.decide("something else entirely", [team])  # another cache state
    beside = decider.decide(text, [refund, team, anger]).answers[2].probabilities
    reordered = decider.decide(text, [anger, refund, team]).answers[0].probabilities
    engine.clear_cache()
    renamed = (
        decider.decide(
            text, [score("How frustrated is the customer?", ["Calm", "Frustrated", "Very angry"], name="q-2")]
        )
        .answers[0]
        .probabilities
    )
    assert alone == beside == reordered == renamed  # bit-identical, not merely close


def test_the_hidden_state_benchmark_prints_its_figures(capsys):
    from benchmarks import hidden_states

    assert hidden_states.main(["--model", "smollm2-135m-instruct", "--dataset", "sst2", "--items", "3"]) == 0
    out = capsys.readouterr().out
    assert "states bit-identical both ways" in out and out.count("| llamadecide-") == 8  # 2 formats x 4 ways
    assert out.count("(tap, stops there)") == 2
