import json

from typer.testing import CliRunner

from llamadecide.cli.main import app

runner = CliRunner()
TICKET = "I was charged twice for my subscription this month and I want a refund."


def test_decide_json_on_the_bundled_model():
    result = runner.invoke(
        app, ["decide", TICKET, "-q", "Which team?", "-o", "billing", "-o", "technical support", "--json"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert [p["value"] for p in payload["probabilities"]] == ["billing", "technical support"]
    assert abs(sum(p["probability"] for p in payload["probabilities"]) - 1) < 1e-9
    assert payload["prompt_format"] == "llamadecide-1"
    assert payload["choice"] in ("billing", "technical support")


def test_decide_table_shows_every_option():
    result = runner.invoke(app, ["decide", TICKET, "-q", "Which team?", "-o", "billing", "-o", "sales", "-o", "legal"])
    assert result.exit_code == 0, result.output
    for option in ("billing", "sales", "legal", "confidence", "label mass"):
        assert option in result.output


def test_predicate_and_score_from_the_cli():
    result = runner.invoke(
        app, ["decide", TICKET, "-q", "The customer wants money back", "--type", "predicate", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert 0 < json.loads(result.output)["probability"] < 1
    result = runner.invoke(
        app, ["decide", TICKET, "-q", "How urgent?", "--type", "score", "-o", "low", "-o", "high", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert 0 <= json.loads(result.output)["score"] <= 1


def test_bad_input_is_a_clear_error_not_a_traceback():
    for args, message in [
        (["decide", TICKET, "-q", "Which?", "-o", "only"], "at least 2 options"),
        (["decide", TICKET, "-q", "Which?", "-o", "a", "-o", "a"], "duplicate option"),
        (["decide", "  ", "-q", "Which?", "-o", "a", "-o", "b"], "state"),
        (["decide", TICKET, "-q", "Which?", "-o", "a", "-o", "b", "--model", "/nonexistent.gguf"], "not found"),
        (["decide", TICKET, "-q", "Which?", "--type", "vote"], "unknown --type"),
    ]:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output


def test_prior_correction_and_rotations_from_the_cli():
    result = runner.invoke(
        app,
        [
            "decide",
            TICKET,
            "-q",
            "Which team?",
            "-o",
            "billing",
            "-o",
            "sales",
            "-o",
            "legal",
            "--mode",
            "labels",
            "--rotations",
            "3",
            "--prior-correction",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "prior-corrected, 3 rotations" in " ".join(result.output.split())
    result = runner.invoke(app, ["decide", TICKET, "-q", "Which team?", "-o", "a", "-o", "b", "--rotations", "3"])
    assert result.exit_code == 2 and "at most 2 rotations" in result.output


def test_models_lists_every_bundled_model():
    result = runner.invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert set(rows) >= {
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct",
        "gemma-3-270m",
    }
    assert rows["smollm2-135m-instruct"]["state"] == "ready"
    assert rows["gemma-3-270m"]["kind"] == "base"
    assert rows["qwen2.5-coder-1.5b-instruct"]["licence"] == "Apache-2.0"
    result = runner.invoke(app, ["models", "--assemble", "no-such-model"])
    assert result.exit_code == 2 and "unknown bundled model" in result.output


def test_bench_outside_a_checkout_asks_for_data_and_tasks_are_packaged(monkeypatch, tmp_path):
    from llamadecide.calibration.data import load_task, packaged_tasks
    from llamadecide.cli import bench

    monkeypatch.setattr(bench, "REPOSITORY_DATA", tmp_path / "absent.tsv")  # as in a wheel install
    result = runner.invoke(app, ["bench", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "pass --data FILE" in result.output
    assert {"agnews", "sst2", "banking77", "banking77-phrases"} <= set(packaged_tasks())
    assert load_task("agnews").name == load_task("agnews.yaml").name == "agnews-topic"
    result = runner.invoke(
        app, ["bench", "--data", str(tmp_path), "--task", "no-such-task", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "packaged task" in result.output


def test_help_names_the_default_in_force_and_is_not_cut(monkeypatch):
    import subprocess
    import sys

    env = {**__import__("os").environ, "LLAMADECIDE_DEFAULT_MODEL": "qwen2.5-coder-0.5b-instruct"}
    shown = subprocess.run(
        [sys.executable, "-m", "llamadecide.cli.main", "serve", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    ).stdout
    assert "qwen2.5-coder-0.5b-instruct" in shown and "1.5b" not in shown and "…" not in shown


def test_option_text_is_not_read_as_markup_and_scores_show_level_names():
    result = runner.invoke(app, ["decide", TICKET, "-q", "Which team?", "-o", "[billing]", "-o", "[bold]support"])
    assert result.exit_code == 0, result.output
    assert "[billing]" in result.output and "[bold]support" in result.output
    result = runner.invoke(
        app, ["decide", TICKET, "-q", "How urgent?", "--type", "score", "-o", "low", "-o", "medium", "-o", "high"]
    )
    assert result.exit_code == 0 and all(level in result.output for level in ("low", "medium", "high"))
