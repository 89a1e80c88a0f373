"""Exact option scoring with the real bundled model."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from conftest import DATA
from llamadecide.decisions import Decider, Scoring, choice, predicate, score
from llamadecide.decisions.measuring import Measurer
from llamadecide.errors import ContextOverflowError, InvalidRequestError

TICKET = "I was charged twice for my subscription this month and I want a refund for the second payment."


def banking77_intents() -> list[str]:
    return json.loads((DATA / "banking77" / "categories.json").read_text())


# Every path a decision can take (batched trie, beside other questions or inputs, after other traffic,
# from a pin) gives the same numbers, to the bit, as the from-scratch evaluation of each option: the
# engine's deterministic call shapes and compact KV cache (ARCHITECTURE.md, deterministic numerics).
# So scores are checked two ways: equal to the bit against the from-scratch evaluation, and against
# a float64 reference of the same weights, loosely (llama.cpp quantizes activations to 8 bits and
# keeps the KV cache in f16: up to about a nat on unlikely tokens, `python -m benchmarks.exactness`),
# which catches any misaligned, missing or extra token (each costs several nats).
EXACT = 1e-6
ROUNDING = 1e-12  # an average of the same numbers taken in another order: floating-point rounding only
REFERENCE_NOISE = 0.5  # nats, error averaged under the exact option distribution
REFERENCE_NOISE_PROBABILITY = 0.1


@pytest.fixture(scope="module")
def decider(engine):
    return Decider(engine)


@pytest.fixture(scope="session")
def reference(engine):
    pytest.importorskip("gguf")
    from benchmarks.reference import ReferenceModel

    return ReferenceModel(engine.model_path)


def assert_matches_naive(decider, state, question):
    batched = decider.decide(state, [question]).answers[0]
    naive = Measurer(decider.engine).decide_naive(state, question)
    for b, n in zip(batched.options, naive.options):
        assert b.value == n.value and b.n_tokens == n.n_tokens
        assert b.logprob == n.logprob, b.value
    assert batched.probabilities == naive.probabilities
    return batched


def assert_matches_reference(decider, reference, state, question):
    from llamadecide.decisions.maths import normalise

    answer = decider.decide(state, [question]).answers[0]
    item = decider.planner.tokenize(state, question)
    exact = [
        float(reference.continuation_logprobs(s[:b], s[b:]).sum()) for s, b in zip(item.sequences, item.boundaries)
    ]
    errors = np.abs(np.array([o.logprob for o in answer.options]) - np.array(exact))
    weights = normalise(exact)
    # Unlikely options carry the largest llama.cpp noise and the least weight in any decision.
    assert float(weights @ errors) <= REFERENCE_NOISE, (float(weights @ errors), errors.max())
    assert np.abs(np.array(answer.probabilities) - weights).max() <= REFERENCE_NOISE_PROBABILITY
    return answer


def test_probabilities_sum_to_one(decider):
    answer = decider.decide(TICKET, [choice("Which team?", ["billing", "technical support", "sales"])]).answers[0]
    assert sum(answer.probabilities) == pytest.approx(1.0)
    assert all(0.0 <= p <= 1.0 for p in answer.probabilities)
    assert 0.0 < answer.label_mass <= 1.0
    assert 0.0 <= answer.confidence <= 1.0


def test_deterministic_across_runs(decider, engine):
    q = choice("Which team?", ["billing", "technical support", "sales", "security", "other"])
    first = decider.decide(TICKET, [q]).answers[0]
    engine.clear_cache()
    second = decider.decide(TICKET, [q]).answers[0]
    third = decider.decide(TICKET, [q]).answers[0]  # prefix now served from the cache
    assert [o.logprob for o in first.options] == [o.logprob for o in second.options]
    assert [o.logprob for o in second.options] == [o.logprob for o in third.options]


def test_lone_option_equals_naive_bit_for_bit(decider, engine):
    """With one continuation the trie has the from-scratch KV layout: identical numbers."""
    q = choice("Which team should handle this ticket?", ["billing", "technical support", "account security"])
    item = decider.planner.tokenize(TICKET, q)
    for sequence, boundary in zip(item.sequences, item.boundaries):
        naive = engine.score_naive(sequence, boundary)
        engine.clear_cache()
        batched = engine.score_continuations(sequence[:boundary], [sequence[boundary:]])[0]
        assert len(batched) == len(naive) == len(sequence) - boundary
        assert np.abs(batched - naive).max() <= EXACT


def test_first_tokens_equal_naive_bit_for_bit(decider, engine):
    """Every option's first token is read from the shared prompt's logits: exact in any batch."""
    q = choice("Which team?", ["billing", "technical support", "account security", "sales", "shipping"])
    item = decider.planner.tokenize(TICKET, q)
    prefix = item.sequences[0][: item.boundaries[0]]
    batched = engine.score_continuations(prefix, [s[b:] for s, b in zip(item.sequences, item.boundaries)])
    for sequence, boundary, scores in zip(item.sequences, item.boundaries, batched):
        assert abs(scores[0] - engine.score_naive(sequence, boundary)[0]) <= EXACT


def test_exact_score_is_the_sum_of_token_logprobs(decider, reference):
    """An option's score is the sum over all its tokens and the end marker, matching the exact
    float64 computation for the same weights within llama.cpp's noise."""
    q = choice("Which team should handle this ticket?", ["billing", "technical support", "account security"])
    answer = assert_matches_reference(decider, reference, TICKET, q)
    item = decider.planner.tokenize(TICKET, q)
    for option, sequence, boundary in zip(answer.options, item.sequences, item.boundaries):
        assert option.n_tokens == len(sequence) - boundary


def test_batched_and_naive_paths_agree(decider):
    q = choice("Which team?", ["billing", "technical support", "account security", "sales", "shipping"])
    assert_matches_naive(decider, TICKET, q)


def test_end_marker_is_scored_for_every_option(decider, engine):
    q = choice("Which team?", ["billing", "technical support"])
    item = decider.planner.tokenize(TICKET, q)
    for sequence in item.sequences:
        assert sequence[-len(engine.end_of_answer) :] == engine.end_of_answer


def test_prefix_option_gets_no_free_advantage(decider, engine, reference):
    """'technical' is a token prefix of 'technical support'. Scored on its tokens alone it could
    never lose to the longer option; with the end-of-answer marker each option is the exact
    probability of the whole answer, and the answer the text asks for wins."""
    state = "My laptop will not boot after the update, please put me through to technical support."
    q = choice("Which department?", ["technical", "technical support"])
    item = decider.planner.tokenize(state, q)
    short, long = (s[b:] for s, b in zip(item.sequences, item.boundaries))
    end = len(engine.end_of_answer)
    assert long[: len(short) - end] == short[:-end], "the test needs a token-level prefix pair"
    answer = decider.decide(state, [q]).answers[0]
    technical, technical_support = answer.options
    without_marker = engine.score_naive(item.sequences[0][:-end], item.boundaries[0]).sum()
    assert without_marker >= technical_support.logprob  # the first-tokens-only approximation's bias
    assert technical.logprob < without_marker
    assert technical_support.probability > 0.8
    assert_matches_naive(decider, state, q)
    assert_matches_reference(decider, reference, state, q)


def test_multi_token_options_are_scored_on_every_token(decider, reference):
    q = choice("Which team?", ["technical support engineering", "customer billing and refunds department"])
    answer = assert_matches_naive(decider, TICKET, q)
    assert_matches_reference(decider, reference, TICKET, q)
    assert all(o.n_tokens >= 4 for o in answer.options)


def test_case_variants(decider, reference):
    q = choice("Which team?", ["billing", "Billing", "bIlling", "BILLING"])
    item = decider.planner.tokenize(TICKET, q)
    answers = {tuple(s[b:]) for s, b in zip(item.sequences, item.boundaries)}
    assert len(answers) == 4  # four different token sequences
    answer = assert_matches_naive(decider, TICKET, q)
    assert_matches_reference(decider, reference, TICKET, q)
    assert sum(answer.probabilities) == pytest.approx(1.0)
    assert len(set(answer.probabilities)) == 4


@pytest.mark.parametrize("k", [2, 5])
def test_two_and_five_options(decider, reference, k):
    options = ["billing", "technical support", "sales", "account security", "shipping"][:k]
    answer = assert_matches_naive(decider, TICKET, choice("Which team?", options))
    assert_matches_reference(decider, reference, TICKET, choice("Which team?", options))
    assert len(answer.options) == k


def test_77_banking_intents(decider, reference):
    intents = banking77_intents()
    assert len(intents) == 77
    q = choice("Which banking intent does this message express?", intents)
    state = "I still have not received my new card, I ordered over a week ago."
    answer = assert_matches_reference(decider, reference, state, q)
    assert sum(answer.probabilities) == pytest.approx(1.0)
    assert len(answer.options) == 77 and all(o.n_tokens >= 2 for o in answer.options)


def test_labels_mode_scores_letters(decider):
    q = choice("Which team?", ["billing", "technical support", "sales"], mode="labels")
    answer = assert_matches_naive(decider, TICKET, q)
    assert [o.answer_text for o in answer.options] == ["A", "B", "C"]
    assert [o.value for o in answer.options] == ["billing", "technical support", "sales"]


def test_predicate_and_score(decider):
    pred = predicate("The customer asks for money back.")
    lvl = score("How urgent is this ticket?", ["not urgent", "somewhat urgent", "very urgent"])
    decision = decider.decide(TICKET, [pred, lvl])
    p_answer, s_answer = decision.answers
    assert 0.0 < p_answer.probability < 1.0
    assert 0.0 <= s_answer.score <= 2.0
    assert s_answer.score == pytest.approx(sum(i * p for i, p in enumerate(s_answer.probabilities)))


def test_several_questions_share_the_state_prefix(decider, engine):
    questions = [
        choice("Which team?", ["billing", "technical support"]),
        predicate("The customer is angry."),
        choice("Which product?", ["subscription", "hardware"]),
    ]
    together = decider.decide(TICKET, questions)
    state_tokens = len(engine.tokenize(TICKET))
    assert together.shared_prefix_tokens > state_tokens  # system text + the whole state
    for question, answer in zip(questions, together.answers):
        alone = decider.decide(TICKET, [question]).answers[0]
        assert [o.logprob for o in answer.options] == [o.logprob for o in alone.options]
        assert answer.probabilities == alone.probabilities


def test_length_normalisation_changes_probabilities_not_logprobs(decider):
    q = choice("Which team?", ["billing", "technical support engineering"])
    plain = decider.decide(TICKET, [q]).answers[0]
    normed = decider.decide(TICKET, [q], scoring=Scoring(length_normalize=True)).answers[0]
    assert [o.logprob for o in plain.options] == pytest.approx([o.logprob for o in normed.options], abs=1e-4)
    expected = np.exp([o.logprob / o.n_tokens for o in plain.options])
    assert normed.probabilities == pytest.approx(list(expected / expected.sum()))


def test_empty_state_is_a_typed_error(decider):
    with pytest.raises(InvalidRequestError, match="state"):
        decider.decide("", [choice("Which?", ["a", "b"])])


def test_no_questions_is_a_typed_error(decider):
    with pytest.raises(InvalidRequestError, match="at least one question"):
        decider.decide(TICKET, [])


def test_state_longer_than_context_is_refused_not_truncated(decider, engine):
    long_state = "word " * (engine.n_ctx + 100)
    with pytest.raises(ContextOverflowError, match="context holds"):
        decider.decide(long_state, [choice("Which?", ["a", "b"])])
    # the engine is still usable afterwards
    assert decider.decide(TICKET, [choice("Which?", ["a", "b"])]).answers[0]


def test_banking_rows_are_readable():
    path = DATA / "banking77" / "test.csv"
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert set(banking77_intents()) == {r["category"] for r in rows}


def test_the_scoring_benchmark_prints_its_figures(capsys):
    import json

    from benchmarks import scoring

    assert (
        scoring.main(["--model", "smollm2-135m-instruct", "--options", "2", "--repeats", "1", "--flash-attn", "--json"])
        == 0
    )
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert row["k"] == 2 and row["prompt_tokens"] > 100 and row["decision_ms"] > 0 and row["speedup_vs_naive"] > 0
    assert row["warm_decision_ms"] > 0
