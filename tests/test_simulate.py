"""`llamadecide simulate` end to end with the test model on a small AG News slice: a stream replay
(a point per refit, labels growing by the reviews) and labelling orders compared (active, random)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import DATA
from llamadecide.cli.main import app
from llamadecide.labels.orders import SHARES
from llamadecide.labels.sqlite_store import SqliteLabelStore

COMMON = ["--task", "agnews", "--text-column", "0", "--label-column", "1", "--target-precision", "0.5"]


@pytest.fixture(scope="module")
def slice_file(tmp_path_factory):
    lines = (DATA / "agnews" / "test.tsv").read_text(encoding="utf-8").splitlines()
    path = tmp_path_factory.mktemp("data") / "agnews-slice.tsv"
    path.write_text("\n".join(lines[::120][:60]) + "\n", encoding="utf-8")  # 60 items, all four topics
    return path


def simulate(slice_file, out, *extra: str) -> dict:
    result = CliRunner().invoke(app, ["simulate", str(slice_file), *COMMON, *extra, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "simulation.png").stat().st_size > 0
    return json.loads((out / "simulation.json").read_text(encoding="utf-8"))


def test_a_stream_replay_refits_as_reviews_arrive_and_measures_each_refit(slice_file, tmp_path):
    found = simulate(
        slice_file,
        tmp_path,
        *("--start-labels", "20", "--stream", "30", "--test-size", "10", "--audit-rate", "0.5"),
        *("--refit-every", "5", "--baseline-labels", "0"),
    )
    labels = [p["labels"] for p in found["points"]]
    assert labels[0] == 20 and labels == sorted(set(labels)) and len(labels) >= 2  # each refit had new labels
    assert labels[-1] <= 20 + 30
    for point in found["points"]:
        assert 0.0 <= point["auto_share"] <= 1.0
        assert (point["threshold"] is None) == (point["true_precision"] is None)
        assert point["certify"] + point["train_only"] == point["labels"]  # every label drawn with a chance
    assert found["honesty"]["certified_refits"] == sum(p["threshold"] is not None for p in found["points"])
    # A refit that certifies nothing does not replace a version that did: the last certified one serves.
    for n, point in enumerate(found["points"]):
        certified = [p["version"] for p in found["points"][: n + 1] if p["threshold"] is not None]
        assert point["serving"] == (certified[-1] if certified else point["version"])


def test_labelling_orders_are_compared_label_for_label_over_seeds(slice_file, tmp_path):
    found = simulate(
        slice_file,
        tmp_path,
        *("--start-labels", "20", "--stream", "30", "--test-size", "10", "--order", "active", "--order", "random"),
        *("--max-labels", "40", "--measure-every", "10", "--round-size", "10", "--seeds", "2"),
    )
    assert set(found["orders"]) == {"active", "random"}
    for order, compared in found["orders"].items():
        assert [r["seed"] for r in compared["replays"]] == [0, 1]
        for replay in compared["replays"]:
            labels = [p["labels"] for p in replay["points"]]
            assert labels[0] == 20 and labels[-1] >= 40 and labels == sorted(labels), (order, labels)
        assert set(compared["median_labels_needed"]) == {f"{share:.1f}" for share in SHARES}
    random_labels = [p["labels"] for p in found["orders"]["random"]["replays"][0]["points"]]
    assert random_labels == [20, 30, 40]  # rounds of 10 in a seeded order, a point every 10
    assert found["labels_for_that_accuracy"]["random"] <= 40
    # Each label after the start records what the model drawing it made of the item, in either order
    # (what a tilted hold-out reads); the start labels read no model.
    for order in ("active", "random"):
        store = SqliteLabelStore(tmp_path / f"labels-{order}-seed0.sqlite")
        records = store.labelled()
        store.close()
        assert {r.item.confidence for r in records if r.item.frame == "start"} == {0.0}
        assert len({r.item.confidence for r in records if r.item.frame != "start"}) > 1


def test_the_plot_of_many_seeds_without_a_baseline_draws_no_empty_legend(tmp_path):
    import warnings

    from llamadecide.labels.simulate import plot

    points = [{"labels": n, "auto_share": 0.5, "true_precision": 0.96} for n in (200, 450)]
    result = {
        "task": "t",
        "audit_rate": 0.02,
        "refit_every": 250,
        "target_precision": 0.95,
        "baseline": None,
        "replays": [{"seed": seed, "points": points} for seed in range(7)],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns "No artists with labels found to put in legend"
        plot(result, tmp_path / "simulation.png")
    assert (tmp_path / "simulation.png").stat().st_size > 0


def test_a_draw_asking_for_more_than_the_whole_is_refused_before_the_model_loads(slice_file, tmp_path, monkeypatch):
    import llamadecide.engine

    def no_engine(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(llamadecide.engine, "Engine", no_engine)
    result = CliRunner().invoke(
        app,
        ["simulate", str(slice_file), *COMMON, "--order", "active", "--floor", "0.6", "--sure-share", "0.5"]
        + ["--out", str(tmp_path)],
    )
    assert result.exit_code != 0
    assert "floor (0.6) and the sure share (0.5)" in result.output and "more than 1" in result.output
