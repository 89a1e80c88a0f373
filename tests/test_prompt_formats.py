"""Prompt formats on the real bundled model: the question-first format's shared prefix (pinned,
reused, evicted), one llama_decode call per decision, and answers that do not depend on what
else was asked."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import engine_config
from llamadecide.calibration.profile import CalibrationProfile
from llamadecide.decisions import Decider, Scoring, choice, predicate
from llamadecide.decisions.measuring import Measurer
from llamadecide.decisions.prompt import (
    BARE_INPUT_LAST,
    INPUT_LAST,
    INPUT_ONLY,
    INSTRUCTIONS_ONLY,
    PROMPT_FORMAT_VERSION,
    QUESTION_FIRST,
    build_messages,
)
from llamadecide.decisions.scoring import Demonstration
from llamadecide.engine import Engine, bundled_model_path
from llamadecide.errors import ContextOverflowError, InvalidRequestError, ProfileMismatchError

FIRST = Scoring(prompt_format=QUESTION_FIRST)
TEAMS = choice(
    "Which team should handle this ticket?", ["billing", "technical support", "account security", "sales"], name="team"
)
ANGRY = predicate("The customer is angry.", name="angry")
TICKETS = [
    "I was charged twice this month.",
    "The app crashes when I open settings.",
    "Someone logged into my account.",
]


@pytest.fixture(autouse=True)
def no_pins_left_behind(engine):
    """Pins held by these tests would move later tests' numbers by llama.cpp's KV-layout noise."""
    engine.clear_cache()
    yield
    engine.clear_cache()


def logprobs(answer):
    return [o.logprob for o in answer.options]


def test_only_the_last_turn_depends_on_the_state():
    one = build_messages("first input", TEAMS, [("shown", "billing")], QUESTION_FIRST)
    two = build_messages("second input", TEAMS, [("shown", "billing")], QUESTION_FIRST)
    assert one[:-1] == two[:-1] and one[-1] != two[-1]
    assert "billing" in one[1]["content"] and "Input:\nfirst input" in one[-1]["content"]
    assert [m["role"] for m in one] == ["system", "user", "assistant", "user", "assistant", "user"]
    # llamadecide-2 recaps the answers' names after the input; llamadecide-3 only the instructions;
    # their demonstrations take the short turn, so both share one prefix
    last = build_messages("first input", TEAMS, [("shown", "billing")], INPUT_LAST)
    assert last[:-1] == one[:-1] and "account security" in one[-1]["content"]
    assert "account security" not in last[-1]["content"] and TEAMS.instructions in last[-1]["content"]
    with pytest.raises(InvalidRequestError, match="unknown prompt format"):
        build_messages("x", TEAMS, prompt_format="llamadecide-9")


def test_the_question_prefix_is_evaluated_once_and_reused(engine):
    decider = Decider(engine)
    first = decider.decide(TICKETS[0], [TEAMS], scoring=FIRST)
    [pinned] = engine.pinned
    assert first.answers[0].prompt_format == QUESTION_FIRST
    decider.decide(TICKETS[1], [ANGRY], scoring=FIRST)  # another question in between
    before = dict(engine.counters)
    again = decider.decide(TICKETS[2], [TEAMS], scoring=FIRST)
    assert again.extra["cached_tokens"] >= len(pinned)  # the usage reports the reused prefix
    evaluated = engine.counters["rows"] - before["rows"]
    assert evaluated < again.prompt_tokens - len(pinned) + 1  # the question block was not evaluated again


def test_one_decode_call_per_decision(engine):
    decider = Decider(engine)
    for rule in (Scoring(), FIRST):
        decider.decide(TICKETS[0], [TEAMS], scoring=rule)
        before = dict(engine.counters)
        decision = decider.decide(TICKETS[1], [TEAMS], scoring=rule)
        assert engine.counters["decode_calls"] - before["decode_calls"] == 1
        # prompt tail and the trie's inner nodes, nothing else (leaves are never evaluated)
        assert engine.counters["rows"] - before["rows"] < decision.prompt_tokens - decision.extra["cached_tokens"]


@pytest.mark.parametrize("prompt_format", [PROMPT_FORMAT_VERSION, QUESTION_FIRST, INPUT_LAST])
def test_answers_are_bit_identical_alone_beside_others_and_reordered(engine, prompt_format):
    decider = Decider(engine)
    rule = Scoring(prompt_format=prompt_format)
    other = choice("Which product?", ["subscription", "hardware"], name="product")
    alone = [logprobs(decider.decide(TICKETS[0], [q], scoring=rule).answers[0]) for q in (TEAMS, ANGRY)]
    together = decider.decide(TICKETS[0], [TEAMS, other, ANGRY], scoring=rule).answers
    reordered = decider.decide(TICKETS[0], [ANGRY, TEAMS], scoring=rule).answers
    assert [logprobs(together[0]), logprobs(together[2])] == alone
    assert [logprobs(reordered[1]), logprobs(reordered[0])] == alone


def test_the_prompt_format_changes_the_numbers_and_each_equals_its_from_scratch_evaluation(engine):
    """Question first, the same answers get other numbers than state first; through the pinned
    question prefix they are, to the bit, what evaluating each option's whole prompt from scratch gives."""
    decider = Decider(engine)
    state_first = decider.decide(TICKETS[0], [TEAMS]).answers[0]
    question_first = decider.decide(TICKETS[0], [TEAMS], scoring=FIRST).answers[0]
    assert logprobs(state_first) != logprobs(question_first)
    naive = Measurer(engine).decide_naive(TICKETS[0], TEAMS, scoring=FIRST)
    assert logprobs(question_first) == logprobs(naive)
    assert [o.n_tokens for o in question_first.options] == [o.n_tokens for o in naive.options]


def test_demonstrations_live_in_the_shared_prefix(engine):
    decider = Decider(engine)
    shown = (Demonstration("Refund my last invoice please.", 0), Demonstration("Error 500 on login.", 1))
    rule = Scoring(prompt_format=QUESTION_FIRST, demonstrations=shown)
    decider.decide(TICKETS[0], [TEAMS], scoring=rule)
    [pinned] = engine.pinned
    decider.decide(TICKETS[1], [TEAMS], scoring=FIRST)  # zero-shot pins its own, shorter prefix
    assert len(engine.pinned) == 2 and len(pinned) > len(engine.pinned[-1])
    assert decider.decide(TICKETS[1], [TEAMS], scoring=rule).extra["cached_tokens"] >= len(pinned)


def test_rotations_need_the_state_first_prompt_format(engine):
    with pytest.raises(InvalidRequestError, match="rotations need"):
        Decider(engine).decide(TICKETS[0], [TEAMS], scoring=Scoring(prompt_format=QUESTION_FIRST, rotations=2))


def test_a_full_pin_store_evicts_the_least_recently_used_and_big_prefixes_still_answer():
    small = Engine(engine_config(bundled_model_path(), n_ctx=2048, pinned_prefixes=2, pinned_cells=400))
    try:
        decider = Decider(small)
        questions = [choice(f"Question {i}: which team?", ["billing", "support"]) for i in range(3)]
        prefixes = []
        for question in questions:
            decider.decide(TICKETS[0], [question], scoring=FIRST)
            prefixes.append(small.pinned[-1])
        assert small.pinned == prefixes[1:]  # two sequences: the least recently used gave way
        many = choice(
            "Which of these very many teams should handle it?", [f"team number {i} of the company" for i in range(40)]
        )
        answer = decider.decide(TICKETS[0], [many], scoring=FIRST).answers[0]  # prefix over the 400-cell limit
        assert sum(answer.probabilities) == pytest.approx(1.0)
        assert all(len(p) < 400 for p in small.pinned)
        assert sum(len(p) for p in small.pinned) <= 400
    finally:
        small.close()


def test_a_prefix_too_large_for_the_context_is_a_clear_error_naming_the_question():
    small = Engine(engine_config(bundled_model_path(), n_ctx=512))
    try:
        huge = choice("Which one?", [f"option number {i} with a long description" for i in range(60)], name="huge")
        with pytest.raises(ContextOverflowError, match=r"question 'huge'.*needs \d+ tokens but the context holds 512"):
            Decider(small).decide(TICKETS[0], [huge], scoring=FIRST)
        assert Decider(small).decide(TICKETS[0], [TEAMS], scoring=FIRST).answers[0]  # still healthy
    finally:
        small.close()


def test_a_profile_keeps_its_prompt_format_and_an_unknown_format_is_refused(tmp_path):
    profile = CalibrationProfile(
        name="p",
        created="now",
        model_sha256="a" * 64,
        prompt_format=QUESTION_FIRST,
        task={"type": "choice", "instructions": "Which?", "options": ["x", "y"]},
        mode="text",
        calibrator="none",
        length_normalize=False,
        temperature=1.0,
        target_precision=0.9,
        confidence_level=0.95,
        dataset_fingerprint="",
        metrics={},
    )
    assert profile.scoring().prompt_format == QUESTION_FIRST
    profile.check_bound_to("a" * 64, (PROMPT_FORMAT_VERSION, QUESTION_FIRST))
    future = profile.model_copy(update={"prompt_format": "llamadecide-9"})
    with pytest.raises(ProfileMismatchError, match="prompt format 'llamadecide-9'.*llamadecide-1, llamadecide-2"):
        future.check_bound_to("a" * 64, (PROMPT_FORMAT_VERSION, QUESTION_FIRST))


def test_the_prompt_format_benchmark_prints_its_figures(tmp_path, capsys):
    import json

    from benchmarks import prompt_formats

    from llamadecide.calibration.config import head_layer
    from llamadecide.engine.model_files import BLOCK_DEPTH

    out = tmp_path / "prompt_formats.json"
    assert (
        prompt_formats.main(
            [
                "--model",
                "smollm2-135m-instruct",
                "--dataset",
                "sst2",
                "--items",
                "3",
                "--n-ctx",
                "4096",
                "--shots-per-class",
                "1",
                "--head-labels",
                "12",
                "--max-bound",
                "0.001",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    layer = head_layer(30, BLOCK_DEPTH)  # SmolLM2-135M has 30 blocks; the heads read calibrate's
    head = f"head, block {layer} of 30 + lexical (12 labels)"
    assert [(r["prompt_format"], r["shots"], r["method"]) for r in rows] == [
        (PROMPT_FORMAT_VERSION, 0, "zero-shot"),
        (QUESTION_FIRST, 0, "zero-shot"),
        (QUESTION_FIRST, 0, head),
        (QUESTION_FIRST, 2, "zero-shot"),
        (QUESTION_FIRST, 2, head),
        (INPUT_LAST, 0, "zero-shot"),
        (INPUT_LAST, 0, head),
        (INPUT_LAST, 2, "zero-shot"),
        (INPUT_LAST, 2, head),
        (INSTRUCTIONS_ONLY, 0, head),  # the head formats answer nothing: heads only
        (BARE_INPUT_LAST, 0, head),
        (INPUT_ONLY, 0, head),
    ]
    for row in rows:
        assert row["dataset"] == "sst2" and row["decode_calls"] == 1.0 and row["p50_s"] > 0
        assert row.get("head_layer", layer) == layer
        assert 0 <= row["accuracy"] <= 1 and row["rows_per_request"] > 0
        assert row["max_probability_bound"] == (0.001 if row["method"] == "zero-shot" else 0.0)  # a head: all exact
        assert row["probability_bound"] == 0.0  # two answers: never worth a second call
    assert max(r["rows_per_request"] for r in rows[1:]) < rows[0]["rows_per_request"]
    for plain, headed in zip(rows[1:9:2], rows[2:9:2]):  # the head evaluates the prompt alone: no answer trie
        assert headed["rows_per_request"] < plain["rows_per_request"]
    assert rows[-1]["rows_per_request"] < rows[6]["rows_per_request"]  # the input alone: fewer rows than -3's head
    assert rows[-2]["rows_per_request"] < rows[6]["rows_per_request"]  # -3's question pinned, the input alone after


def test_the_head_formats_show_no_options_and_the_input_only_one_is_the_same_for_every_question():
    from llamadecide.decisions.prompt import INPUT_ONLY, INSTRUCTIONS_ONLY

    without = build_messages("first input", TEAMS, (), INSTRUCTIONS_ONLY)
    full = build_messages("first input", TEAMS, (), INPUT_LAST)
    assert without[-1] == full[-1]  # the same last turn as llamadecide-3
    assert "account security" in full[1]["content"] and "account security" not in without[1]["content"]
    assert TEAMS.instructions in without[1]["content"]
    alone = build_messages("first input", TEAMS, (), INPUT_ONLY)
    assert alone == build_messages("first input", ANGRY, (), INPUT_ONLY)  # no question in it at all
    assert [m["role"] for m in alone] == ["system", "user"] and alone[-1]["content"] == "Input:\nfirst input"
    with pytest.raises(InvalidRequestError, match="no demonstrations"):
        build_messages("x", TEAMS, [("shown", "billing")], INPUT_ONLY)
    bare = build_messages("first input", TEAMS, (), BARE_INPUT_LAST)
    assert bare[:-1] == full[:-1]  # llamadecide-3's pinned prefix, every option listed
    assert bare[-1] == {"role": "user", "content": "Input:\nfirst input"}  # then the input alone


def test_heads_on_the_input_only_format_share_one_hidden_state_per_request(engine):
    """Two heads on `llamadecide-5` about one input read one hidden state: the request evaluates the
    rows and calls of one question (counted), and each head answers what it answers alone."""
    from llamadecide.decisions import Head, maths
    from llamadecide.decisions.prompt import INPUT_ONLY

    width = int(engine.metadata["llama.embedding_length"])
    rng = np.random.default_rng(1)

    def head(k: int) -> Scoring:
        weights = rng.normal(scale=0.05, size=(k, width))
        return Scoring(prompt_format=INPUT_ONLY, head=Head(weights, rng.normal(size=k), features=maths.HIDDEN_ONLY))

    rules = [head(4), head(2)]
    decider = Decider(engine)

    def counted(questions, scoring):
        engine.clear_cache()
        before = dict(engine.counters)
        decision = decider.decide(TICKETS[0], questions, scoring=scoring)
        return decision, {key: engine.counters[key] - before[key] for key in ("rows", "decode_calls")}

    alone = [counted([q], r)[0].answers[0] for q, r in zip((TEAMS, ANGRY), rules)]
    _, one = counted([TEAMS], rules[0])
    both, work = counted([TEAMS, ANGRY], rules)
    assert work == one
    for a, b in zip(alone, both.answers):
        assert np.abs(np.array(a.probabilities) - np.array(b.probabilities)).max() <= 1e-6
