import pytest

from llamadecide.decisions import Option, Question, choice, predicate, score
from llamadecide.decisions.prompt import build_messages, render_state
from llamadecide.decisions.questions import option_labels
from llamadecide.errors import InvalidRequestError


@pytest.mark.parametrize("options", [[], ["only"]])
def test_too_few_options(options):
    with pytest.raises(InvalidRequestError, match="at least 2 options"):
        choice("Which?", options)


def test_duplicate_options():
    with pytest.raises(InvalidRequestError, match="duplicate option 'a'"):
        choice("Which?", ["a", "b", "a"])


def test_true_and_string_true_are_shown_as_json_so_they_differ():
    q = choice("Which?", [True, "true", 1, "1", "yes"])
    assert q.answer_texts() == ["true", '"true"', "1", '"1"', '"yes"']
    assert [o.value for o in q.options] == [True, "true", 1, "1", "yes"]
    assert choice("Which?", [True, "maybe"]).answer_texts() == ["true", "maybe"]  # plain text when nothing clashes
    q = choice("Which?", [True, "true"], mode="labels")
    assert q.answer_texts() == ["A", "B"]
    # Two Options deliberately given the same text are still refused in text mode.
    with pytest.raises(InvalidRequestError, match="shown to the model as 'same'"):
        choice("Which?", [Option("a", "same"), Option("b", "same")])


def test_case_variants_are_distinct_options_whitespace_variants_are_not():
    q = choice("Which?", ["billing", "Billing", "BILLING"])
    assert q.answer_texts() == ["billing", "Billing", "BILLING"]
    for variant in (" billing", "billing ", "billing\n"):
        with pytest.raises(InvalidRequestError, match="differ only in surrounding whitespace"):
            choice("Which?", ["billing", variant])
        with pytest.raises(InvalidRequestError, match="differ only in surrounding whitespace"):
            choice("Which?", ["billing", variant], mode="labels")


def test_blank_option_and_instructions():
    with pytest.raises(InvalidRequestError, match="empty or blank"):
        choice("Which?", ["a", "  "])
    with pytest.raises(InvalidRequestError, match="instructions"):
        choice("  ", ["a", "b"])


def test_too_many_options():
    with pytest.raises(InvalidRequestError, match="at most 255"):
        choice("Which?", [f"o{i}" for i in range(256)])


def test_predicate_and_score_shapes():
    p = predicate("The customer is angry")
    assert [o.value for o in p.options] == [True, False]
    assert p.answer_texts() == ["yes", "no"]
    s = score("How urgent?", ["low", ("high", "needs action today")])
    assert [o.value for o in s.options] == [0, 1]
    assert s.answer_texts() == ["0", "1"]


def test_labels_beyond_z():
    labels = option_labels("choice", 30)
    assert labels[:3] == ["A", "B", "C"] and labels[26:] == ["AA", "AB", "AC", "AD"]
    assert len(set(option_labels("choice", 255))) == 255


def test_empty_state_is_refused():
    with pytest.raises(InvalidRequestError, match="state"):
        render_state("   ")
    with pytest.raises(InvalidRequestError):
        render_state(None)


def test_json_state_is_shown_as_json():
    assert '"amount": 12' in render_state({"amount": 12})


def test_state_comes_before_the_question():
    q = Question("choice", "Which team?", (Option("a", "a"), Option("b", "b", "the b team")))
    user = build_messages("my printer is on fire", q)[1]["content"]
    assert user.index("my printer is on fire") < user.index("Which team?")
    assert "- b (the b team)" in user
