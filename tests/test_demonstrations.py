"""k-shot: labelled demonstrations shown before the question, on the real bundled model; how
calibration picks them and scores its own demonstrations; a served profile that holds them."""

from __future__ import annotations

import numpy as np
import pytest

from llamadecide.calibration.backends import ItemScores
from llamadecide.calibration.cache import ScoreCache
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.profile import CalibrationProfile, DemonstrationParams
from llamadecide.calibration.run import calibrate
from llamadecide.calibration.variant_scoring import score_variants
from llamadecide.calibration.variants import choose_demonstrations
from llamadecide.decisions import Decider, Scoring, choice, predicate
from llamadecide.decisions.measuring import PLAIN, Measurer
from llamadecide.decisions.prompt import build_messages
from llamadecide.decisions.rotations import rotate
from llamadecide.decisions.rotations import shown as _shown
from llamadecide.decisions.scoring import Demonstration
from llamadecide.errors import InvalidRequestError


@pytest.fixture(autouse=True)
def no_pins_left_behind(request):
    """Pins held by these tests would move later tests' numbers by llama.cpp's KV-layout noise."""
    yield
    if "engine" in request.fixturenames:
        request.getfixturevalue("engine").clear_cache()


REVIEW = "The plot drags, but the two leads are wonderful together and the ending is earned."
SENTIMENT = choice("What is the sentiment of this movie review?", ["positive", "negative"])
SHOWN = (Demonstration("A tedious, joyless slog.", 1), Demonstration("Funny, warm and beautifully shot.", 0))


def test_demonstrations_are_earlier_exchanges_in_the_same_prompt_format():
    plain = build_messages(REVIEW, SENTIMENT)
    assert [m["role"] for m in plain] == ["system", "user"]
    shown = build_messages(REVIEW, SENTIMENT, [("A slog.", "negative"), ("A joy.", "positive")])
    assert [m["role"] for m in shown] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert shown[0] == plain[0] and shown[-1] == plain[-1]
    assert shown[1]["content"] == plain[1]["content"].replace(REVIEW, "A slog.")
    assert [shown[2]["content"], shown[4]["content"]] == ["negative", "positive"]


def test_k_shot_scores_are_exact_and_the_demonstrations_matter(engine):
    decider = Decider(engine)
    rule = Scoring(demonstrations=SHOWN)
    answer = decider.decide(REVIEW, [SENTIMENT], scoring=rule).answers[0]
    naive = Measurer(engine).decide_naive(REVIEW, SENTIMENT, scoring=rule)
    # Same prompt, batched against one option per full evaluation: equal to the bit.
    assert [o.logprob for o in answer.options] == [o.logprob for o in naive.options]
    zero_shot = decider.decide(REVIEW, [SENTIMENT]).answers[0]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(answer.options, zero_shot.options)) > 1e-2
    # after other prompts: the same to the bit
    again = Measurer(engine).scores(REVIEW, SENTIMENT, Scoring(demonstrations=SHOWN))[0]
    assert list(again) == [o.logprob for o in answer.options]


def test_the_demonstrations_are_evaluated_once_for_every_item(engine):
    """They stay pinned in the engine, so other prompts in between do not evict them."""
    decider = Decider(engine)
    rule = Scoring(demonstrations=SHOWN)
    decider.decide("Awful.", [SENTIMENT], scoring=rule)
    decider.decide("Something else.", [predicate("It is about a film.")])  # another prompt in between
    second = decider.decide("Lovely.", [SENTIMENT], scoring=rule)
    exchanges = build_messages("Awful.", SENTIMENT, [(d.input, SENTIMENT.answer_texts()[d.option]) for d in SHOWN])[:-1]
    prefix = engine.tokenize_prompt(engine.render_chat(exchanges, add_generation_prompt=False))
    assert len(prefix) > 100 and second.extra["cached_tokens"] >= len(prefix)


def test_a_demonstrations_label_moves_with_the_rotation():
    question = choice("Which team?", ["billing", "support", "sales"], mode="labels")
    shown = [Demonstration("Refund please.", 0), Demonstration("Buy more seats.", 2)]
    assert _shown(question, shown, 0) == [("Refund please.", "A"), ("Buy more seats.", "C")]
    # Shift 1 lists support, sales, billing: billing is now C, sales B.
    assert rotate(question, 1).options[2].value == "billing"
    assert _shown(question, shown, 1) == [("Refund please.", "C"), ("Buy more seats.", "B")]
    text = choice("Which team?", ["billing", "support", "sales"])
    assert _shown(text, shown, 1) == [("Refund please.", "billing"), ("Buy more seats.", "sales")]


def test_bad_demonstrations_are_the_callers(engine):
    decider = Decider(engine)
    with pytest.raises(InvalidRequestError, match="answers option 2; the question has 2"):
        decider.decide(REVIEW, [SENTIMENT], scoring=Scoring(demonstrations=(Demonstration("x", 2),)))
    with pytest.raises(InvalidRequestError, match="input is empty"):
        decider.decide(REVIEW, [SENTIMENT], scoring=Scoring(demonstrations=(Demonstration("  ", 0),)))


def test_the_prior_is_taken_after_the_same_demonstrations(engine):
    decider = Decider(engine)
    plain = decider.prior(SENTIMENT, Scoring(prior_correction=True))
    shown = decider.prior(SENTIMENT, Scoring(prior_correction=True, demonstrations=SHOWN))
    assert not np.allclose(plain, shown, atol=1e-3)
    rows, _ = Measurer(engine).content_free_scores(SENTIMENT, Scoring(demonstrations=SHOWN))
    assert shown == pytest.approx(np.log(np.exp(rows - np.logaddexp.reduce(rows, axis=1, keepdims=True)).mean(0)))


def _items(labels: list[str]) -> list[LabelledItem]:
    return [LabelledItem(id=str(i), text="x" * (5 + (i * 7) % 23), label=label) for i, label in enumerate(labels)]


def test_demonstrations_are_balanced_short_interleaved_and_from_the_pool_only():
    labels = ["a"] * 30 + ["b"] * 30 + ["c"] * 6
    items = _items(labels)
    y = np.array(["abc".index(label) for label in labels])
    pool = np.arange(0, 66, 2)
    chosen = choose_demonstrations(items, y, pool, 6, seed=3)
    assert chosen == choose_demonstrations(items, y, pool, 6, seed=3)
    assert set(chosen) <= set(pool.tolist()) and len(set(chosen)) == 6
    classes = [int(y[i]) for i in chosen]
    assert sorted(classes) == [0, 0, 1, 1, 2, 2] and classes[:3] == classes[3:]  # one of each class per round
    for i in chosen:
        same = sorted(len(items[j].text) for j in pool if y[j] == y[i])
        assert len(items[i].text) <= same[(len(same) - 1) // 2]
    assert len(choose_demonstrations(items, y, np.array([0, 2, 64]), 8)) == 3  # no more than the pool holds


class RecordingBackend:
    description = "recording"
    supports_hidden = False
    supports_demonstrations = True

    def __init__(self):
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.prompt_formats: list[tuple[str, str]] = []  # (text, prompt format) of every call

    def identity(self) -> str:
        return "recording"

    def head_layer(self, depth):
        return None  # no hidden states

    def score(self, text, question, rule=PLAIN, *, hidden=False, hidden_layer=None):
        self.prompt_formats.append((text, rule.prompt_format))
        if rule.prompt_format == "llamadecide-1":
            self.calls.append((text, tuple(d.input for d in rule.demonstrations)))
        return ItemScores([-1.0 - len(rule.demonstrations), -2.0], [1, 1])

    def score_many(self, texts, question, rule=PLAIN, *, answers=True, **options):
        return [self.score(t, question, rule, **options) for t in texts]

    def content_free(self, question, rule=PLAIN):
        return np.zeros((2, 2)), None


def test_calibration_scores_a_demonstration_with_the_others_only(tmp_path):
    task = Task("t", "predicate", "It holds.", [True, False], [None, None], {"1": True, "0": False})
    items = [LabelledItem(id=str(i), text=f"item {i}", label=str(i % 2)) for i in range(12)]
    backend = RecordingBackend()
    cache = ScoreCache(tmp_path / "cache.sqlite")
    used = np.arange(12)
    scored = score_variants(
        backend,
        task,
        items,
        used,
        RunConfig(out_dir=tmp_path, shots=2, head=False, prompt_formats=("llamadecide-1",)),
        cache,
        pool=np.arange(8),
    )
    cache.close()
    [plain, shot] = scored
    assert (plain.shots, shot.shots) == (0, 2)
    shown = [d.input for d in scored[shot].demonstrations]
    assert len(shown) == 2 and all(int(text.split()[1]) < 8 for text in shown)
    with_demonstrations = {text: given for text, given in backend.calls if given}
    for text, given in with_demonstrations.items():
        assert text not in given
        assert len(given) == (1 if text in shown else 2)
    assert set(with_demonstrations) == {item.text for item in items}
    assert scored[shot].L[0, 0] == (-2.0 if items[0].text in shown else -3.0)
    # Without a pool (or with a backend that cannot show them) there is no k-shot variant.
    cache = ScoreCache(tmp_path / "cache2.sqlite")
    assert [
        v.shots
        for v in score_variants(backend, task, items, used, RunConfig(out_dir=tmp_path, shots=2, head=False), cache)
    ] == [0]
    cache.close()


def test_question_first_demonstrations_are_never_scored_nor_fitted_on(tmp_path):
    """Many-shot in the question-first format: one prefix for every item (evaluated once); the items
    it shows are part of every prompt, so no variant is fitted or measured on them."""
    from llamadecide.calibration.variants import demonstration_items

    task = Task("t", "predicate", "It holds.", [True, False], [None, None], {"1": True, "0": False})
    items = [LabelledItem(id=str(i), text=f"item {i}", label=str(i % 2)) for i in range(12)]
    backend = RecordingBackend()
    cache = ScoreCache(tmp_path / "cache.sqlite")
    scored = score_variants(
        backend,
        task,
        items,
        np.arange(12),
        RunConfig(out_dir=tmp_path, head=False, shots_per_class=(0, 2)),
        cache,
        pool=np.arange(8),
    )
    cache.close()
    assert [(v.prompt_format, v.shots) for v in scored] == [
        ("llamadecide-1", 0),
        ("llamadecide-2", 0),
        ("llamadecide-2", 4),
        ("llamadecide-3", 0),
        ("llamadecide-3", 4),
    ]
    many = list(scored)[2]
    shown = scored[many].shown
    assert len(shown) == 4 and set(shown) <= set(range(8)) and list(demonstration_items(scored)) == sorted(shown)
    question_first = [
        text for text, prompt_format in backend.prompt_formats if prompt_format == "llamadecide-2"
    ]  # (-3 alike)
    assert sum(text in question_first for text in (items[i].text for i in shown)) == len(shown)  # zero-shot only
    assert len(question_first) == 12 + 12 - len(shown)


def test_a_profile_checks_its_demonstrations():
    base = dict(
        name="x",
        created="",
        model_sha256="0" * 64,
        prompt_format="llamadecide-1",
        task={"type": "predicate", "instructions": "x", "options": [True, False]},
        mode="text",
        calibrator="none",
        length_normalize=False,
        temperature=1.0,
        target_precision=0.9,
        confidence_level=0.95,
        dataset_fingerprint="",
        metrics={},
    )
    with pytest.raises(ValueError, match="answers option 2; the task has 2"):
        CalibrationProfile(**base, demonstrations=[DemonstrationParams(input="a", option=2)])
    profile = CalibrationProfile(
        **base,
        method="prior-corrected",
        prior_correction=True,
        demonstrations=[DemonstrationParams(input="a", option=1)],
    )
    assert profile.scoring().demonstrations == (Demonstration("a", 1),)
    assert profile.method_label == "1-shot, prior-corrected"
    assert (
        CalibrationProfile(**base, demonstrations=[DemonstrationParams(input="a", option=0)]).method_label == "1-shot"
    )
    assert CalibrationProfile(**base).method_label == "zero-shot"
    fixed = CalibrationProfile(**base, method="prior-corrected", prior_correction=True, prior=[-0.4, -1.1])
    assert fixed.scoring().prior == (-0.4, -1.1) and fixed.scoring().prior_correction
    with pytest.raises(ValueError, match="one prior value per option"):
        CalibrationProfile(**base, method="prior-corrected", prior_correction=True, prior=[-0.4])
    with pytest.raises(ValueError, match="only with prior correction"):
        CalibrationProfile(**base, prior=[-0.4, -1.1])


def test_a_served_k_shot_profile_answers_as_the_library_does(engine, tmp_path):
    import httpx

    from llamadecide.bench.server_process import ServerProcess

    question = predicate("The movie review is positive.")
    profile = CalibrationProfile(
        name="sst2-2-shot",
        created="2026-12-03T00:00:00+00:00",
        model_sha256=engine.model_sha256,
        prompt_format="llamadecide-1",
        task={"type": "predicate", "instructions": question.instructions, "options": [True, False]},
        mode="text",
        calibrator="none",
        length_normalize=False,
        temperature=1.0,
        threshold=0.6,
        demonstrations=[DemonstrationParams(input=d.input, option=d.option) for d in SHOWN],
        target_precision=0.9,
        confidence_level=0.95,
        dataset_fingerprint="test",
        metrics={},
    )
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    profile.save(profiles / "p.json")
    engine.clear_cache()  # as the fresh server: the same KV layout
    expected = Decider(engine).decide(REVIEW, [question], scoring=Scoring(demonstrations=SHOWN)).answers[0].probability
    body = {
        "model": "m",
        "input": REVIEW,
        "llamadecide": {"profile": "sst2-2-shot"},
        "questions": [{"type": "predicate", "instructions": question.instructions}],
    }
    with ServerProcess("--profiles-dir", str(profiles)) as server:
        answer = httpx.post(f"{server.url}/v1/decisions", json=body, timeout=120).json()["answers"][0]
    assert answer["method"] == "2-shot" and answer["calibrated"] is True
    assert answer["probability"] == pytest.approx(expected, abs=0.02)


def test_asking_a_remote_backend_for_k_shot_is_an_error_not_a_silent_skip(tmp_path):
    class Remote(RecordingBackend):
        description = "endpoint http://example"
        supports_demonstrations = False

    task = Task("t", "predicate", "It holds.", [True, False], [None, None], {"1": True, "0": False})
    items = [LabelledItem(id=str(i), text=f"item {i}", label=str(i % 2)) for i in range(12)]
    with pytest.raises(InvalidRequestError, match="--shots needs the local backend: endpoint http://example"):
        calibrate(Remote(), task, items, RunConfig(out_dir=tmp_path, shots=2, calibration_size=6, test_size=6))
