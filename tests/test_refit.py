"""Refits from the label store: every label trains, only labels of known chance certify (each with
its weight), the new profile is its parent's next version; `calibrate --labels` on the real model."""

from __future__ import annotations

import json
import time

import numpy as np
from typer.testing import CliRunner

from conftest import DATA
from fake_backend import OPTIONS, SubsampleBackend, compass_task, fake_run_config
from llamadecide.calibration.certification import Draw
from llamadecide.calibration.data import LabelledItem, read_labelled
from llamadecide.calibration.profile import CalibrationProfile
from llamadecide.calibration.run import run_calibration
from llamadecide.cli.main import app
from llamadecide.labels.records import Label, ReviewItem
from llamadecide.labels.sqlite_store import SqliteLabelStore

TASK = compass_task()


def _items(draw_of_wrong: Draw) -> list[LabelledItem]:
    """240 items labelled truly, certifying with chance 1; 60 more whose labels are wrong (a person
    who picked them by hand and erred), drawn as given."""
    good = [LabelledItem(str(i), f"item {i}", OPTIONS[i % 4], (Draw(1.0, "file"),)) for i in range(240)]
    wrong = [LabelledItem(str(i), f"item {i}", OPTIONS[(i + 1) % 4], (draw_of_wrong,)) for i in range(240, 300)]
    return good + wrong


def _run(tmp_path, items: list[LabelledItem], name: str):
    truth = {it.text: int(it.text.split()[-1]) % 4 for it in items}
    backend = SubsampleBackend(truth, informative=True)
    config = fake_run_config(tmp_path / name, calibration_size=len(items), test_size=0, target_precision=0.9)
    return run_calibration(backend, TASK, items, config).summary


def test_labels_picked_by_hand_train_but_never_certify(tmp_path):
    picked = _run(tmp_path, _items(Draw(None, "served:compass:v1")), "picked")
    counted = _run(tmp_path, _items(Draw(1.0, "file")), "counted")
    # Half the items of known chance are held out to certify (the 240 true ones, or all 300), the
    # rest only train; the 60 picked by hand are never among them.
    assert (picked["certification"]["certify"], picked["certification"]["train_only"]) == (120, 180)
    assert (counted["certification"]["certify"], counted["certification"]["train_only"]) == (150, 150)
    # Counted, the wrong labels held out pull the guarantee down; left out, they cannot.
    certified, spoilt = picked["threshold"]["calibration"], counted["threshold"]["calibration"]
    assert certified is not None and certified["auto"] <= 120
    assert spoilt is None or spoilt["lower_bound"] < certified["lower_bound"]
    assert picked["test"]["calibrated"]["part"] == "held out"


def test_an_audit_is_counted_with_its_weight(tmp_path):
    """The same labels, the wrong ones drawn as audits at 5% (each standing for 20) or as escalations:
    weighted, they count twenty times more against the guarantee."""
    audited = _run(tmp_path, _items(Draw(0.05, "file")), "audited")
    escalated = _run(tmp_path, _items(Draw(1.0, "file")), "escalated")
    frames = audited["certification"]["frames"]["file"]
    assert frames["items"] == 150 and frames["effective_size"] < 150
    a, e = audited["threshold"]["calibration"], escalated["threshold"]["calibration"]
    assert a is None or (e is not None and a["precision"] < e["precision"])


def _store_with_reviews(path, items: list[LabelledItem], version: str) -> None:
    """Reviews as the server records them: escalations (chance 1), audits (chance 0.5), and items
    labelled by hand (no chance), all of one served profile version."""
    store = SqliteLabelStore(path)
    records, labels = [], []
    for n, item in enumerate(items):
        origin, chance = [("escalated", 1.0), ("audited", 0.5), ("picked", None)][n % 3]
        records.append(
            ReviewItem(
                id=f"req-{n}",
                question="0",
                kind="choice",
                instructions="Is this review positive or negative?",
                options=("positive", "negative"),
                probabilities=(0.6, 0.4),
                confidence=0.2,
                input_sha256="0" * 64,
                origin=origin,
                created=time.time(),
                queued=True,
                chance=chance,
                frame=f"served:sst2:{version}",
                input=item.text,
                task="sst2",
                version=version,
                action="escalate",
            )
        )
        labels.append(Label(f"req-{n}", "0", {"1": "positive", "0": "negative"}[item.label]))
    store.record(records)
    store.add_labels(labels)
    store.close()


def _parent(engine, threshold: float | None = None) -> CalibrationProfile:
    return CalibrationProfile(
        name="sst2",
        created="2026-12-01T00:00:00+00:00",
        version=3,
        model_sha256=engine.model_sha256,
        prompt_format="llamadecide-1",
        task={"type": "choice", "instructions": "x", "options": ["positive", "negative"]},
        mode="text",
        calibrator="none",
        length_normalize=False,
        temperature=1.0,
        target_precision=0.9,
        confidence_level=0.95,
        dataset_fingerprint="",
        metrics={},
        threshold=threshold,
    )


def _refit(tmp_path, parent: CalibrationProfile, *flags: str):
    items = read_labelled(DATA / "sst2" / "dev.tsv", text_column="sentence", label_column="label")[:90]
    parent.save(tmp_path / "parent.json")
    store = tmp_path / "labels.sqlite"
    _store_with_reviews(store, items, parent.version_id)
    out = tmp_path / "refit"
    result = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--labels",
            str(store),
            "--task",
            "sst2",
            "--parent",
            str(tmp_path / "parent.json"),
            "--prompt-format",
            "llamadecide-1",
            "--no-head",
            "--n-ctx",
            "4096",
            "--out",
            str(out),
            *flags,
        ],
    )
    assert result.exit_code == 0, result.output
    return out, result


def test_calibrate_from_a_label_store_writes_the_next_version_naming_its_parent(tmp_path, engine):
    parent = _parent(engine)
    out, result = _refit(tmp_path, parent)
    summary = json.loads((out / "summary.json").read_text())
    # 60 of the 90 are of known chance (escalations and audits): half of them, 30, are too few to be
    # held out (a threshold at 0.9 is tested with 58 at least), so every label fits and none certifies.
    assert summary["certification"]["certify"] == 60 and summary["certification"]["train_only"] == 30
    assert summary["certification"]["held_out"] == 0 and summary["threshold"]["calibration"] is None
    assert set(summary["certification"]["frames"]) == {f"served:sst2:{parent.version_id}"}
    assert summary["parent"]["parent"] == parent.version_id and summary["parent"]["matched"] == 90
    profile = CalibrationProfile.load(out / "profile.json")
    assert (profile.name, profile.version, profile.parent) == ("sst2", 4, parent.version_id)
    assert summary["split"]["test"] == 0 and summary["test"]["calibrated"]["part"] == "out of fold"
    assert "certify" in result.output  # the report says how many items certify and how many only train
    assert np.isfinite(summary["test"]["calibrated"]["nll"])


def test_a_refit_that_certifies_nothing_leaves_its_certified_parent_served(tmp_path, engine):
    """Its parent acts automatically above 0.6; the new version certifies no threshold (precision
    0.999 is out of reach of 60 items), so it is written where no server reads it."""
    parent = _parent(engine, threshold=0.6)
    out, result = _refit(tmp_path, parent, "--target-precision", "0.999")
    assert not (out / "profile.json").exists()
    waiting = CalibrationProfile.load(out / "profile.uncertified.json")
    assert (waiting.version, waiting.threshold) == (4, None)
    assert "its parent stays served" in result.output
    # A server reading the profiles folder (the parent beside the refit's folder) serves the parent.
    (tmp_path / "served").mkdir()
    parent.save(tmp_path / "served" / "sst2.json")
    (out).rename(tmp_path / "served" / "refit")
    from llamadecide.calibration.profile import profile_files

    assert profile_files(tmp_path / "served") == [tmp_path / "served" / "sst2.json"]


def test_the_next_step_says_certified_only_when_a_threshold_is():
    from llamadecide.labels.labelling import _next_step

    def need(more):
        return {"labels_needed": {"labelled": 300, "more": more, "coverage": 0.8}}

    assert _next_step(need(100), 0.9, certified=False).startswith("about 100 more labels")
    enough = _next_step(need(0), 0.9, certified=False)
    assert "certified" not in enough and "label on" in enough
    assert "is certified" in _next_step(need(0), 0.9, certified=True)
    assert "label on" in _next_step({"labels_needed": None}, 0.9, certified=False)
