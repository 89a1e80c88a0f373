"""`llamadecide plan`: the recommendation rule and Pareto front on fixed rows, bad input refused
before a model loads, and a real plan on the two small models (plus a broken file that must become
a row saying so), rerun to check that it resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import DATA
from llamadecide.cli.main import app
from llamadecide.planning.choice import instance_rows, pareto_front, recommend
from llamadecide.prices import load_prices

ROOT = Path(__file__).resolve().parents[1]
SST2 = DATA / "sst2" / "dev.tsv"


def _model(name: str, share: float | None, costs: dict[str, float | None]) -> dict:
    return {
        "model": name,
        "accuracy": 0.9,
        "threshold": None if share is None else 0.8,
        "auto_share": share or 0.0,
        "instances": [
            {
                "name": instance,
                "usd_per_1000": None if cost is None else cost * (share or 1.0),
                "usd_per_1000_auto": cost,
                "basis": "test",
            }
            for instance, cost in costs.items()
        ],
    }


def test_the_recommendation_is_the_cheapest_pair_meeting_the_share_rule():
    models = [
        _model("big", 0.80, {"cpu.large": 0.50, "cpu.xlarge": 0.50, "gpu": None}),
        _model("small", 0.77, {"cpu.large": 0.20, "cpu.xlarge": 0.20, "gpu": None}),
        _model("tiny", 0.60, {"cpu.large": 0.05, "cpu.xlarge": 0.05, "gpu": None}),  # cheapest, share too low
        _model("unreachable", None, {"cpu.large": None}),
        {"model": "broken", "error": "ModelLoadError: bad file"},
    ]
    rec = recommend(models, target_precision=0.95)
    assert rec["required_auto_share"] == pytest.approx(0.75)  # best share less 5 points
    assert (rec["choice"]["model"], rec["choice"]["instance"]) == ("small", "cpu.large")
    assert rec["runner_up"]["model"] == "big" and "2.50x" in rec["runner_up"]["why"]  # meets the rule, dearer
    assert "tiny" in rec["why"]  # said to be below the share
    strict = recommend(models, target_precision=0.95, min_auto_share=0.79)
    assert strict["choice"]["model"] == "big"
    assert strict["runner_up"]["model"] == "tiny" and "below the required 79.0%" in strict["runner_up"]["why"]
    assert recommend(models[3:], target_precision=0.95)["choice"] is None


def test_the_pareto_front_holds_only_undominated_pairs():
    models = [
        _model("big", 0.80, {"a": 0.50, "b": 0.60}),
        _model("small", 0.77, {"a": 0.20}),
        _model("worse", 0.70, {"a": 0.30}),  # dearer than small and handles less
    ]
    assert set(pareto_front(models)) == {("big", "a"), ("small", "a")}


def test_instance_rows_price_automatically_handled_decisions():
    prices = load_prices()
    rows = {
        r["name"]: r
        for r in instance_rows(prices, throughput_rps=4.0, cpu_vcpu=2, auto_share=0.5, model_bytes=2**30, gpu_rps=None)
    }
    large = rows["ml.c5.large"]
    assert large["usd_per_1000"] == pytest.approx(1000 * 0.119 / (3600 * 4.0))
    assert large["usd_per_1000_auto"] == pytest.approx(2 * large["usd_per_1000"])
    assert rows["ml.g5.xlarge"]["usd_per_1000"] is None and rows["ml.g5.xlarge"]["basis"].startswith("not measured")


def _invoke(*args: str):
    return CliRunner().invoke(app, ["plan", *args])


@pytest.mark.parametrize(
    ("extra", "complaint"),
    [
        (["--model", "no-such-model"], "unknown model"),
        (["--model", "smollm2-135m-instruct", "--label-column", "sentence"], "not an option"),
        (["--model", "smollm2-135m-instruct", "--prices", "{prices}"], "lacks usd_per_hour"),
        (["--model", "smollm2-135m-instruct", "--review-cost", "ten cents"], "valid number"),
        (["--model", "smollm2-135m-instruct", "--review-cost", "-0.1"], "--review-cost"),
    ],
)
def test_bad_input_is_refused_before_a_model_loads(tmp_path, extra, complaint):
    data = tmp_path / "data.tsv"
    data.write_text("sentence\tlabel\ngood film\t1\nbad film\t0\n" * 4)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"instances": [{"instance_type": "ml.x", "vcpu": 2}]}))
    out = tmp_path / "out"
    extra = [e.replace("{prices}", str(prices)) for e in extra]
    result = _invoke(str(data), "--task", "sst2", "--text-column", "sentence", "--out", str(out), *extra)
    assert result.exit_code == 2 and complaint in result.output
    assert not (out / "models").exists()  # nothing was calibrated


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan")
    lines = SST2.read_text(encoding="utf-8").splitlines()
    data = folder / "sst2.tsv"
    data.write_text("\n".join([lines[0], *lines[1:41]]) + "\n", encoding="utf-8")
    broken = folder / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    out = folder / "out"
    args = [
        str(data),
        "--task",
        "sst2",
        "--text-column",
        "sentence",
        "--model",
        "smollm2-135m-instruct",
        "--model",
        "gemma-3-270m",
        "--model",
        str(broken),
        "--calibration-size",
        "20",
        "--test-size",
        "20",
        "--target-precision",
        "0.6",
        "--confidence",
        "0.5",
        "--requests",
        "4",
        "--concurrency",
        "1",
        "--concurrency",
        "2",
        "--out",
        str(out),
    ]
    first = _invoke(*args)
    assert first.exit_code == 0, first.output
    plan_first = json.loads((out / "plan.json").read_text())
    second = _invoke(*args)
    assert second.exit_code == 0, second.output
    return out, plan_first, json.loads((out / "plan.json").read_text())


def test_a_plan_measures_each_model_and_writes_its_outputs(small_plan):
    out, plan, _ = small_plan
    assert (out / "report.html").is_file() and (out / "pareto.png").is_file()
    rows = {m["model"]: m for m in plan["models"]}
    assert set(rows) == {"smollm2-135m-instruct", "gemma-3-270m", "broken"}
    assert rows["broken"]["error"]  # a model that fails to load is a row saying so
    for name in ("smollm2-135m-instruct", "gemma-3-270m"):
        m = rows[name]
        for field in ("accuracy", "ece", "threshold", "auto_share", "p50_s", "throughput_rps", "instances"):
            assert field in m, field
        assert (out / "models" / name / "profile.json").is_file()
        assert 0 <= m["accuracy"] <= 1 and m["p50_s"] > 0 and m["throughput_rps"] > 0
        assert [level["concurrency"] for level in m["levels"]] == [1, 2]
        assert m["throughput_rps"] == max(level["throughput_rps"] for level in m["levels"])
        for instance in m["instances"]:
            assert {"name", "usd_per_1000", "usd_per_1000_auto", "basis"} <= set(instance)


def test_a_plans_costs_follow_from_its_throughput_and_the_price_table(small_plan):
    _, plan, _ = small_plan
    prices = {i["instance_type"]: i for i in load_prices()["instances"]}
    for m in (m for m in plan["models"] if not m.get("error")):
        for instance in m["instances"]:
            listed = prices[instance["name"]]
            if listed["gpu"]:
                assert instance["usd_per_1000"] is None and instance["basis"].startswith("not measured")
                continue
            rps = m["throughput_rps"] * listed["vcpu"] / m["measured_on_vcpu"]
            assert instance["usd_per_1000"] == pytest.approx(1000 * listed["usd_per_hour"] / (3600 * rps))
            if m["threshold"] is None:
                assert instance["usd_per_1000_auto"] is None
            else:
                assert instance["usd_per_1000_auto"] == pytest.approx(instance["usd_per_1000"] / m["auto_share"])


def test_a_plan_recommends_the_cheapest_pair_meeting_its_rule(small_plan):
    _, plan, _ = small_plan
    rec = plan["recommendation"]
    reaching = [m for m in plan["models"] if not m.get("error") and m["threshold"] is not None]
    if not reaching:
        assert rec["choice"] is None
        return
    required = max(m["auto_share"] for m in reaching) - 0.05
    pairs = [
        (i["usd_per_1000_auto"], m["model"], i["name"])
        for m in reaching
        if m["auto_share"] >= required - 1e-12
        for i in m["instances"]
        if i["usd_per_1000_auto"] is not None
    ]
    assert rec["choice"]["usd_per_1000_auto"] == pytest.approx(min(pairs)[0])
    front = {(p["model"], p["instance"]) for p in plan["pareto"]}
    assert (rec["choice"]["model"], rec["choice"]["instance"]) in front


def test_a_rerun_resumes_every_finished_step(small_plan):
    _, first, second = small_plan
    for before, after in zip(first["models"], second["models"]):
        if before.get("error"):
            assert after.get("error")
            continue
        assert before["resumed"] == [] and after["resumed"] == ["calibration", "served"]
        assert after["accuracy"] == before["accuracy"] and after["throughput_rps"] == before["throughput_rps"]


def test_with_a_review_cost_the_plan_recommends_by_total_cost_and_states_the_break_even():
    """Compute plus the people who take the escalated share: at 10 cents a review the model that
    handles more automatically wins although its compute costs twice as much; below the break-even
    review cost the cheaper one would."""
    from llamadecide.planning.choice import break_even, recommend_by_total, total_cost

    def model(name: str, share: float, compute: float) -> dict:
        return {
            "model": name,
            "accuracy": 0.9,
            "threshold": 0.8 if share else None,
            "auto_share": share,
            "instances": [
                {
                    "name": "ml.m5.large",
                    "usd_per_1000": compute,
                    "usd_per_1000_auto": compute / share if share else None,
                    "usd_per_1000_total": total_cost(compute, share, 0.1),
                    "basis": "test",
                }
            ],
        }

    strong, cheap, none = model("strong", 0.64, 0.008), model("cheap", 0.50, 0.004), model("none", 0.0, 0.001)
    assert strong["instances"][0]["usd_per_1000_total"] == pytest.approx(0.008 + 0.36 * 100)
    assert none["instances"][0]["usd_per_1000_total"] == pytest.approx(0.001 + 100)  # it escalates everything
    rec = recommend_by_total([cheap, strong, none], 0.1)
    assert rec["choice"]["model"] == "strong" and rec["runner_up"]["model"] == "cheap"
    even = rec["break_even"]
    # 0.008 + 0.36 * 1000 r == 0.004 + 0.50 * 1000 r  =>  r = 0.004 / 140
    assert even["usd_per_review"] == pytest.approx(0.004 / 140) and even["above"].startswith("strong")
    assert break_even((strong, strong["instances"][0]), (strong, strong["instances"][0])) is None
    assert total_cost(None, 0.5, 0.1) is None and total_cost(0.01, 0.5, None) is None


def test_instance_rows_price_the_people_a_plan_needs():
    rows = {
        r["name"]: r
        for r in instance_rows(
            load_prices(), throughput_rps=4.0, cpu_vcpu=2, auto_share=0.75, model_bytes=2**30, review_cost=0.1
        )
    }
    large = rows["ml.c5.large"]
    assert large["usd_per_1000_total"] == pytest.approx(large["usd_per_1000"] + 0.25 * 1000 * 0.1)
