"""The load benchmark's pure parts, and one short real run against the server."""

import asyncio
import json

import pytest

from conftest import API_KEY
from llamadecide.bench.load import Record, floor_figures, parse_choice, run_level, summarise
from llamadecide.calibration.data import TASKS_DIR, LabelledItem, load_task
from llamadecide.errors import InvalidRequestError
from llamadecide.prices import cost_table, load_prices


def test_parse_choice_finds_the_named_option_or_none():
    options = ["World", "Sports", "Business", "Science/Technology"]
    assert parse_choice("Sports", options) == 1
    assert parse_choice("  business.\nBecause...", options) == 2
    assert parse_choice("Science/Technology is the topic", options) == 3
    assert parse_choice("The topic is politics", options) is None
    assert parse_choice("", options) is None


def test_summary_percentiles_throughput_and_errors():
    records = [Record("decision", 200, t, correct=t < 0.3, valid=True) for t in (0.1, 0.2, 0.3, 0.4)] + [
        Record("decision", 503, 0.01, error="overloaded")
    ]
    s = summarise(records, wall_s=2.0)
    assert s["ok"] == 4 and s["error_rate"] == pytest.approx(0.2) and s["throughput_rps"] == 2.0
    assert s["p50_s"] == pytest.approx(0.25) and s["accuracy"] == 0.5 and s["first_error"] == "overloaded"


def test_cost_per_thousand_requests():
    prices = load_prices()
    assert prices["source"] and all(
        {"region", "instance_type", "vcpu", "usd_per_hour", "date"} <= set(i) for i in prices["instances"]
    )
    rows = {r["instance_type"]: r for r in cost_table(prices, cpu_rps=2.0, cpu_vcpu=2, gpu_rps=None)}
    large = rows["ml.c5.large"]  # same vCPU count as the measuring machine: 2 req/s
    assert large["usd_per_1000"] == pytest.approx(1000 * large["usd_per_hour"] / (3600 * 2.0))
    assert rows["ml.c5.xlarge"]["requests_per_second"] == 4.0
    assert rows["ml.g5.xlarge"]["usd_per_1000"] is None and "no GPU" in rows["ml.g5.xlarge"]["basis"]
    measured = {r["instance_type"]: r for r in cost_table(prices, cpu_rps=2.0, cpu_vcpu=2, gpu_rps=10.0)}
    assert measured["ml.g5.xlarge"]["usd_per_1000"] == pytest.approx(1000 * 1.408 / (3600 * 10.0))
    big = {
        r["instance_type"]: r for r in cost_table(prices, cpu_rps=2.0, cpu_vcpu=2, gpu_rps=None, model_bytes=4 * 2**30)
    }
    assert big["ml.c5.large"]["usd_per_1000"] is None and "does not fit" in big["ml.c5.large"]["basis"]
    assert big["ml.c5.2xlarge"]["usd_per_1000"] is not None  # 16 GiB holds 4 GiB and the margin


@pytest.mark.parametrize(
    ("table", "complaint"),
    [
        ({"instances": []}, "non-empty"),
        ({"instances": [{"instance_type": "ml.x", "vcpu": 2}]}, "lacks usd_per_hour"),
        ({"instances": [{"instance_type": "ml.x", "vcpu": "two", "usd_per_hour": 1}]}, "must be numbers"),
    ],
)
def test_a_price_table_without_what_costs_need_is_refused(tmp_path, table, complaint):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(table))
    with pytest.raises(InvalidRequestError, match=complaint):
        load_prices(path)


def test_a_short_real_run(server):
    task = load_task(TASKS_DIR / "agnews.yaml")
    items = [
        LabelledItem("1", "The team won the championship final on Sunday.", "Sports"),
        LabelledItem("2", "Shares of the chip maker fell after weak earnings.", "Business"),
    ]
    golds = [task.gold_index(i.label) for i in items]
    for kind in ("decision", "chat"):
        records, wall, work = asyncio.run(
            run_level(server.url, API_KEY, kind, task, items, golds, concurrency=2, requests=4, warmup=1)
        )
        s = summarise(records, wall)
        assert s["requests"] == 4 and s["ok"] == 4, s
        if kind == "chat":
            assert s["ttft_p50_s"] > 0 and "invalid_answer_rate" in s
        else:
            assert s["invalid_answer_rate"] == 0.0
            # what the engine did for the four measured decisions, read from the server's /metrics
            assert work is not None and work["decisions"] == 4 and 1 <= work["runs"] <= 4 and work["rows"] > 0
            figures = floor_figures(s, work, 0.002)
            assert figures["rows_per_request"] == work["rows"] / 4
            assert figures["full_depth_rows_per_request"] == pytest.approx(figures["rows_per_request"])  # no head
            assert figures["floor_efficiency"] == pytest.approx(
                figures["full_depth_rows_per_request"] * 0.002 * s["throughput_rps"]
            )


def test_floor_figures_follow_from_the_counters():
    summary = {"ok": 10, "throughput_rps": 4.0}
    # a head on a middle block: its rows ran 24 of 28 blocks, so the floor is that share of full rows
    work = {"rows": 280.0, "full_depth_rows": 240.0, "decode_calls": 5.0, "runs": 4.0, "decisions": 10.0}
    figures = floor_figures(summary, work, 0.01)
    assert figures == pytest.approx(
        {
            "rows_per_request": 28.0,
            "full_depth_rows_per_request": 24.0,
            "decode_calls_per_request": 0.5,
            "decisions_per_engine_run": 2.5,
            "floor_s_per_request": 0.24,
            "floor_efficiency": 0.96,
        }
    )
    assert floor_figures(summary, None, 0.01) == {} and "floor_efficiency" not in floor_figures(summary, work, None)


def test_bench_measures_a_profiles_accuracy_only_on_items_it_was_not_calibrated_on(tmp_path):
    """A profile records its data's fingerprint and split: the workload leaves its calibration items
    out; on other data, or without a recorded split, accuracy is not measured and the bench says so."""
    from llamadecide.bench.run import profile_holdout, workload
    from llamadecide.calibration.data import file_fingerprint, read_labelled
    from llamadecide.calibration.profile import CalibrationProfile
    from llamadecide.calibration.steps import split

    data = tmp_path / "data.tsv"
    data.write_text("".join(f"item {n}\t{'World' if n % 2 else 'Sports'}\n" for n in range(40)), encoding="utf-8")
    labelled = read_labelled(data, text_column="0", label_column="1")

    def profile(fingerprint: str, split_record: dict | None) -> None:
        CalibrationProfile(
            name="p",
            created="",
            model_sha256="0" * 64,
            prompt_format="llamadecide-1",
            task={"type": "choice", "instructions": "x", "options": ["World", "Sports"]},
            mode="text",
            calibrator="none",
            length_normalize=False,
            temperature=1.0,
            target_precision=0.9,
            confidence_level=0.95,
            dataset_fingerprint=fingerprint,
            metrics={"split": split_record} if split_record else {},
        ).save(tmp_path / "profile.json")

    profile(file_fingerprint(data, "0", "1"), {"seed": 3, "items": 40, "calibration": 24, "test": 16})
    held, note = profile_holdout(tmp_path / "profile.json", data, "0", "1", len(labelled))
    calibration, _ = split(40, 24, 16, 3)
    assert note is None and held == {int(i) for i in calibration}
    chosen = workload(labelled, 64, exclude=held)
    assert len(chosen) == 16 and not {item.id for item in chosen} & {str(i) for i in held}
    profile("another file", {"seed": 3, "items": 40, "calibration": 24, "test": 16})
    held, note = profile_holdout(tmp_path / "profile.json", data, "0", "1", 40)
    assert held == set() and "other data" in note
    profile(file_fingerprint(data, "0", "1"), None)
    assert "does not record" in profile_holdout(tmp_path / "profile.json", data, "0", "1", 40)[1]
