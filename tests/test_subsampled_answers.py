"""Answers scored on a subsample (a many-option task over its row budget): they stop once every
candidate reading them is behind, and the test part's wait for a chosen candidate that reads them.
The backend is a fake whose answers and hidden states are as informative as each test needs (the
run's logic is under test here; tests/test_calibration_e2e.py runs the same path on the real model)."""

from fake_backend import OPTIONS, SubsampleBackend, compass_task, fake_run_config
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import LabelledItem
from llamadecide.calibration.profile import CalibrationProfile
from llamadecide.calibration.run import calibrate
from llamadecide.calibration.steps import split
from llamadecide.calibration.variant_scoring import RACE_START


def _run(
    tmp_path, informative: bool, prompt_formats: tuple[str, ...] = ("llamadecide-3",), shots: tuple[int, ...] = ()
) -> tuple[SubsampleBackend, dict, list[LabelledItem], RunConfig]:
    task = compass_task()
    items = [LabelledItem(id=str(i), text=f"item {i}", label=OPTIONS[i % 4]) for i in range(300)]
    backend = SubsampleBackend({it.text: OPTIONS.index(it.label) for it in items}, informative=informative)
    backend.dear_without_demonstrations = bool(shots)
    config = fake_run_config(
        tmp_path,
        calibration_size=200,
        test_size=100,
        head=True,
        prompt_formats=prompt_formats,
        shots_per_class=shots,
        row_budget=50_000,
        min_answered=150,
    )
    return backend, calibrate(backend, task, items, config), items, config


def test_answers_stop_once_every_candidate_reading_them_is_behind_and_the_test_part_gets_none(tmp_path):
    backend, summary, items, config = _run(tmp_path, informative=False)
    cal_idx, test_idx = split(len(items), config.calibration_size, config.test_size, config.seed)
    answered = {int(t.split()[-1]) for t in backend.answered}
    assert len(answered) == len(backend.answered) == RACE_START  # one round, then behind
    assert answered <= set(cal_idx.tolist())  # the test part waited, and its turn never came
    plan = summary["scoring"]
    assert list(plan["answers_scored"].values()) == [RACE_START]
    assert list(plan["answers_planned"].values()) == [150]  # 100 calibration items, 50 test
    behind = [c for c in summary["candidates"] if c.get("behind")]
    assert behind and all(not (c["kind"] == "head" and c["features"] == "hidden-1") for c in behind)
    assert summary["selection"]["behind"] == len(behind)
    # The others are compared on every calibration item, not just the answered ones.
    heads = [c for c in summary["candidates"] if c["features"] == "hidden-1" and c["kind"] == "head"]
    assert heads and all(c["cv_items"] == 200 for c in heads)
    assert summary["chosen"]["features"] == "hidden-1" and summary["test"]["calibrated"]["n"] == 100
    # Raw answers are measured where they exist: on the answered calibration items.
    assert summary["test"]["raw"]["part"] == "calibration" and summary["test"]["raw"]["n"] == RACE_START
    assert CalibrationProfile.load(tmp_path / "profile.json").metrics["test_raw"]["part"] == "calibration"
    assert 0 < summary["cost"]["comparing_while_scoring_s"] < summary["cost"]["scoring_s"]


def test_answers_that_hold_their_own_are_scored_on_the_whole_subsample_and_then_on_the_test_part(tmp_path):
    backend, summary, items, config = _run(tmp_path, informative=True)
    cal_idx, test_idx = split(len(items), config.calibration_size, config.test_size, config.seed)
    answered = {int(t.split()[-1]) for t in backend.answered}
    assert len(answered) == len(backend.answered) == 150  # each once: no round scored twice
    assert not any(c.get("behind") for c in summary["candidates"])
    assert summary["chosen"]["features"] != "hidden-1" or summary["chosen"]["kind"] != "head"
    on_test = answered & set(test_idx.tolist())
    assert len(on_test) == 50 and summary["test"]["calibrated"]["n"] == 50  # scored once chosen
    order = [int(t.split()[-1]) for t in backend.answered]
    assert set(order[-50:]) == on_test  # the calibration part's first, the test part's after the choice
    assert summary["test"]["raw"]["part"] == "test"


def test_the_test_parts_answers_come_from_the_same_plan_when_demonstrations_leave_the_calibration_part(tmp_path):
    """A question-first k-shot variant shows calibration items in its prompt (they leave the part
    that is fitted on); the later call that scores the test part's answers plans as the first did."""
    backend, summary, items, config = _run(tmp_path, True, prompt_formats=("llamadecide-3",), shots=(1,))
    assert summary["split"]["shown_as_demonstrations"] > 0
    answered = [int(t.split()[-1]) for t in backend.answered]
    assert len(answered) == len(set(answered))  # each once: the second call answered only the test part
    cal_idx, test_idx = split(len(items), config.calibration_size, config.test_size, config.seed)
    assert summary["test"]["calibrated"]["n"] == len(set(answered) & set(test_idx.tolist())) > 0
