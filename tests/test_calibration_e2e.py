"""Calibration end to end with the bundled model on a small slice of AG News: local engine, a
running server by URL, and a SageMaker-style client; the written profile is then served."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import API_KEY, DATA
from llamadecide.calibration.backends import HTTPBackend, LocalBackend, SageMakerBackend, wire_question
from llamadecide.calibration.config import RunConfig, head_layer
from llamadecide.calibration.data import load_task, read_labelled
from llamadecide.calibration.profile import CalibrationProfile
from llamadecide.calibration.run import calibrate
from llamadecide.cli.main import app
from llamadecide.engine.model_files import BLOCK_DEPTH

ROOT = Path(__file__).resolve().parents[1]
AGNEWS = DATA / "agnews" / "test.tsv"


@pytest.fixture(scope="module")
def slice_file(tmp_path_factory):
    lines = AGNEWS.read_text(encoding="utf-8").splitlines()
    path = tmp_path_factory.mktemp("data") / "agnews-slice.tsv"
    path.write_text("\n".join(lines[::190][:40]) + "\n", encoding="utf-8")  # 40 items, all four topics
    return path


def calibrate_slice(slice_file: Path, out: Path, *flags: str):
    """`llamadecide calibrate` on the slice (20 items to fit, 20 to measure, precision 0.5), with `flags`."""
    return CliRunner().invoke(
        app,
        [
            "calibrate",
            str(slice_file),
            "--task",
            "agnews",
            "--text-column",
            "0",
            "--label-column",
            "1",
            "--calibration-size",
            "20",
            "--test-size",
            "20",
            "--target-precision",
            "0.5",
            *flags,
            "--out",
            str(out),
        ],
    )


@pytest.fixture(scope="module")
def local_run(slice_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("calibration")
    result = calibrate_slice(slice_file, out)
    assert result.exit_code == 0, result.output
    return out, result.output


def test_local_run_writes_report_plots_and_profile(local_run):
    out, output = local_run
    for name in (
        "report.html",
        "summary.json",
        "profile.json",
        "reliability.png",
        "risk_coverage.png",
        "predictions.jsonl",
    ):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    raw, calibrated = summary["test"]["raw"], summary["test"]["calibrated"]
    # the question-first 4-shot variant shows one labelled item per class: no variant is fitted on them
    assert summary["split"] == {
        "seed": 0,
        "calibration": 16,
        "test": 20,
        "shown_as_demonstrations": 4,
        "items": 40,
        "as_split": {"calibration": 20, "test": 20},  # what `split` is given back to find the parts again
    }
    for m in (raw, calibrated):
        assert 0 <= m["accuracy"] <= 1 and m["nll"] > 0 and 0 <= m["ece_width"] <= 1
        assert m["ece_width_ci"][0] <= m["ece_width"] <= m["ece_width_ci"][1] + 1e-12
        assert len(m["per_class_ece"]) == 4
    assert {c["label"] for c in summary["candidates"]} >= {
        "text mode, none",
        "text mode, temperature",
        "text mode, head (C=0.05) + lexical",
        "text mode, llamadecide-2, none",
        "text mode, llamadecide-2, 4-shot, head (C=0.05)",
    }
    profile = CalibrationProfile.load(out / "profile.json")
    assert len(profile.model_sha256) == 64 and profile.temperature > 0
    assert profile.prompt_format == summary["prompt_format"] in ("llamadecide-1", "llamadecide-2", "llamadecide-3")
    assert profile.scoring().prompt_format == profile.prompt_format
    # A prior-corrected profile serves the prior it was fitted with.
    assert (profile.prior is not None) == profile.prior_correction
    if profile.prior is not None:
        assert profile.prior == pytest.approx(summary["chosen"]["prior"])
    assert "data:image/png;base64," in (out / "report.html").read_text()
    assert "ECE (equal width)" in output


def test_rerun_is_served_from_the_cache(local_run, slice_file, engine):
    out, _ = local_run
    calls = []

    class Counting(LocalBackend):
        def score(self, text, question, *args, **options):
            calls.append(text)
            return super().score(text, question, *args, **options)

        def score_many(self, texts, question, *args, **options):
            calls.extend(texts)
            return super().score_many(texts, question, *args, **options)

    task = load_task("agnews")
    items = read_labelled(slice_file, text_column="0", label_column="1")
    calibrate(
        Counting(engine), task, items, RunConfig(out_dir=out, calibration_size=20, test_size=20, show_progress=False)
    )
    assert calls == []


def test_http_and_sagemaker_backends_match_local(local_run, slice_file, server, tmp_path):
    out, _ = local_run
    task = load_task("agnews")
    items = read_labelled(slice_file, text_column="0", label_column="1")
    local = json.loads((out / "summary.json").read_text())["model_sha256"]

    class FakeRuntime:  # what boto3's sagemaker-runtime client does, sent to the real server's /invocations
        def invoke_endpoint(self, **kwargs):
            assert kwargs["EndpointName"] == "llamadecide-test" and kwargs["ContentType"] == "application/json"
            response = httpx.post(
                f"{server.url}/invocations",
                content=kwargs["Body"],
                timeout=60,
                headers={
                    "Content-Type": kwargs["ContentType"],
                    "Authorization": f"Bearer {API_KEY}",
                    "X-Amzn-SageMaker-Custom-Attributes": kwargs["CustomAttributes"],
                },
            )
            assert response.status_code == 200, response.text
            return {"Body": io.BytesIO(response.content), "ContentType": "application/json"}

    sagemaker = SageMakerBackend("llamadecide-test", client=FakeRuntime())
    question = task.question()
    with HTTPBackend(server.url, API_KEY) as http:
        assert http.identity() == local == sagemaker.identity()  # the server reports its model's SHA-256
        for item in items[:6]:
            assert http.score(item.text, question).logprobs == pytest.approx(
                sagemaker.score(item.text, question).logprobs, abs=1e-9
            )
        summary = calibrate(
            http,
            task,
            items,
            RunConfig(out_dir=tmp_path / "http", calibration_size=20, test_size=20, show_progress=False),
        )
    assert summary["model_sha256"] == local and summary["test"]["raw"]["n"] == 20


def test_profile_is_served_and_mismatches_are_refused(local_run, tmp_path):
    from llamadecide.bench.server_process import ServerProcess

    out, _ = local_run
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    shutil.copy(out / "profile.json", profiles / "agnews.json")
    profile = CalibrationProfile.load(out / "profile.json")
    task = profile.task
    body = {
        "model": "m",
        "input": "Stocks rallied as the central bank held rates.",
        "llamadecide": {"profile": profile.name},
        "questions": [
            {"type": "choice", "instructions": task["instructions"], "choices": [{"value": v} for v in task["options"]]}
        ],
    }
    with ServerProcess("--profiles-dir", str(profiles)) as server:
        answer = httpx.post(f"{server.url}/v1/decisions", json=body, timeout=60).json()["answers"][0]
        assert answer["calibrated"] is True and answer["profile"] == profile.name
        assert answer["action"] in ("auto", "escalate")
        wrong = {**body, "questions": [{**body["questions"][0], "choices": [{"value": "a"}, {"value": "b"}]}]}
        refused = httpx.post(f"{server.url}/v1/decisions", json=wrong, timeout=60)
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "profile_mismatch"
        unknown = httpx.post(
            f"{server.url}/v1/decisions", json={**body, "llamadecide": {"profile": "nope"}}, timeout=60
        )
        assert unknown.status_code == 400 and "loaded" in unknown.json()["error"]["message"]
    # a profile fitted for another model file, or a file that is no profile, is left out (named in
    # the error of a request for it) while the model serves the good ones
    other = profile.model_copy(update={"model_sha256": "0" * 64, "name": "other"})
    other.save(profiles / "other.json")
    (profiles / "notes.json").write_text('{"hello": 1}')
    with ServerProcess("--profiles-dir", str(profiles)) as server:
        assert httpx.get(f"{server.url}/ping", timeout=10).status_code == 200
        assert httpx.post(f"{server.url}/v1/decisions", json=body, timeout=60).json()["answers"][0]["calibrated"]
        refused = httpx.post(
            f"{server.url}/v1/decisions", json={**body, "llamadecide": {"profile": "other"}}, timeout=60
        )
        message = refused.json()["error"]["message"]
        assert refused.status_code == 400 and "other.json" in message and "recalibrate" in message
        assert "notes.json" in message and "not a calibration profile" in message


def test_a_calibrate_output_folder_is_served_as_it_is(local_run):
    """The README's flow: `serve --profiles-dir` straight on a `calibrate --out` folder, whose
    summary.json is not a profile."""
    from llamadecide.bench.server_process import ServerProcess

    out, _ = local_run
    assert (out / "summary.json").is_file()
    profile = CalibrationProfile.load(out / "profile.json")
    body = {
        "model": "m",
        "input": "Stocks rallied as the central bank held rates.",
        "llamadecide": {"profile": profile.name},
        "questions": [
            {
                "type": "choice",
                "instructions": profile.task["instructions"],
                "choices": [{"value": v} for v in profile.task["options"]],
            }
        ],
    }
    with ServerProcess("--profiles-dir", str(out)) as server:
        assert httpx.get(f"{server.url}/ping", timeout=10).status_code == 200
        answer = httpx.post(f"{server.url}/v1/decisions", json=body, timeout=60).json()["answers"][0]
        assert answer["calibrated"] is True and answer["profile"] == profile.name


def test_a_cross_fitted_profile_serves_each_input_what_calibrate_measured_for_it(
    local_run, slice_file, engine, tmp_path
):
    """`calibrate --cross-fit 2` writes a profile of two fold calibrations; the server answers each
    test item from the fold its input routes to, with the probabilities calibrate measured for it."""
    from llamadecide.bench.server_process import ServerProcess
    from llamadecide.decisions.scoring import route

    out, _ = local_run
    crossed = tmp_path / "crossed"
    crossed.mkdir()
    shutil.copy(out / "cache.sqlite", crossed / "cache.sqlite")  # the same scores, not scored again
    result = calibrate_slice(slice_file, crossed, "--cross-fit", "2")
    assert result.exit_code == 0, result.output
    assert "cross-fitted: 2 calibrations served" in result.output
    profile = CalibrationProfile.load(crossed / "profile.json")
    assert len(profile.folds) == 1 and "cross-fitted (2 folds)" in profile.method_label
    texts = {item.id: item.text for item in read_labelled(slice_file, text_column="0", label_column="1")}
    measured = [json.loads(line) for line in (crossed / "predictions.jsonl").read_text().splitlines()]
    assert len(measured) == 20 and {route(texts[row["id"]], 2) for row in measured} == {0, 1}
    question = wire_question(load_task("agnews").question(profile.mode))  # as calibrate asked it
    with ServerProcess("--profiles-dir", str(crossed)) as server:
        for row in measured[:6]:
            extension = {"profile": profile.name, "mode": profile.mode}
            body = {"model": "m", "input": texts[row["id"]], "llamadecide": extension}
            answer = httpx.post(f"{server.url}/v1/decisions", json={**body, "questions": [question]}, timeout=60)
            served = [o["probability"] for o in answer.json()["answers"][0]["probabilities"]]
            assert served == pytest.approx(row["probabilities"], abs=1e-4), row["id"]


def test_scoring_plans_within_a_row_budget():
    from llamadecide.calibration.budget import plan_scoring
    from llamadecide.calibration.variants import Variant

    used = np.arange(1000)
    cheap, many = Variant("text", prompt_format="llamadecide-3"), Variant("text")
    costs = {many: (700.0, 650.0), cheap: (400.0, 30.0)}
    everything = plan_scoring([many, cheap], costs, used, (used[:700], used[700:]), 10**7, {cheap}, 0)
    assert all(len(idx) == 1000 for idx in everything.answered.values()) and not everything.hidden_variants
    tight = plan_scoring([many, cheap], costs, used, (used[:700], used[700:]), 150_000, {cheap}, 0)
    assert tight.left_out == (many,) and tight.hidden_variants == (cheap,)
    assert len(tight.answered[cheap]) == 100 and tight.rows <= 150_000
    assert sum(i < 700 for i in tight.answered[cheap]) == 70  # both parts alike


def test_over_its_budget_a_run_compares_every_candidate_on_the_answered_items(tmp_path, engine):
    """A 77-option task over its budget: the state-first variant left out, answers on a subsample,
    hidden states alone on every item; a head on the hidden state is fitted on every calibration item,
    every candidate measured on the same answered folds."""
    banking = AGNEWS.parents[1] / "banking77" / "test.csv"
    task = load_task("banking77")
    items = read_labelled(banking, text_column="text", label_column="category")[::50][:40]
    config = RunConfig(
        out_dir=tmp_path / "run",
        calibration_size=30,
        test_size=10,
        show_progress=False,
        prompt_formats=("llamadecide-1", "llamadecide-3"),
        shots_per_class=(),
        lexical=False,
        prior_correction=False,
        row_budget=15000,
        min_answered=16,
        head_depth=BLOCK_DEPTH,
    )
    summary = calibrate(LocalBackend(engine), task, items, config)
    plan = summary["scoring"]
    assert plan["left_out"] == ["text mode"] and plan["hidden_state_on_every_item"] == ["text mode, llamadecide-3"]
    chosen = summary["chosen"]
    reads_answers = not (chosen["kind"] == "head" and chosen["features"] == "hidden-1")
    # 12 calibration items and 4 test items planned; the test part's only once a choice reads them.
    assert plan["answers_scored"] == {"text mode, llamadecide-3": 16 if reads_answers else 12}
    behind = bool(summary["selection"]["behind"])
    held_out = {r["cv_items"] for r in summary["candidates"] if not behind or r.get("behind")}
    assert len(held_out) == 1 and held_out.pop() == 12
    hidden_heads = [r for r in summary["candidates"] if r["features"] == "hidden-1"]
    assert hidden_heads and all(r["fit_items"] == 30 for r in hidden_heads)
    assert summary["test"]["calibrated"]["n"] == 10 or summary["chosen"]["features"] != "hidden-1"
    layer = head_layer(engine.n_layer, BLOCK_DEPTH)
    assert plan["head_layer"] == layer is not None  # heads read a block, and the profile says which
    profile = CalibrationProfile.load(tmp_path / "run" / "profile.json")
    assert profile.head is None or profile.head.layer == layer


def test_the_head_formats_are_measured_as_heads_on_the_hidden_state_alone(engine, slice_file, tmp_path):
    """`--prompt-format llamadecide-5`: hidden states on every item, never an answer; its only candidates are
    heads on the hidden state alone, priced (weighted rows per decision) below the state-first answers."""
    items = read_labelled(slice_file, text_column="0", label_column="1")
    config = RunConfig(
        out_dir=tmp_path,
        calibration_size=20,
        test_size=20,
        show_progress=False,
        prompt_formats=("llamadecide-1", "llamadecide-5"),
        lexical=False,
        prior_correction=False,
    )
    summary = calibrate(LocalBackend(engine), load_task("agnews"), items, config)
    assert summary["scoring"]["hidden_state_on_every_item"] == ["text mode, llamadecide-5"]
    assert set(summary["scoring"]["answers_scored"]) == {"text mode"}
    formats = [c for c in summary["candidates"] if c["prompt_format"] == "llamadecide-5"]
    assert formats and all(c["kind"] == "head" and c["features"] == "hidden-1" for c in formats)
    state_first = [c for c in summary["candidates"] if c["prompt_format"] == "llamadecide-1" and c["kind"] == "none"]
    assert max(c["served_rows"] for c in formats) < min(c["served_rows"] for c in state_first)
