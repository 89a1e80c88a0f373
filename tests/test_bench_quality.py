"""The quality benchmark end to end on a small slice with the bundled small model: every method row,
both baselines, figures in range, Markdown rendering; and its pure pieces on synthetic data."""

from __future__ import annotations

import json

import numpy as np
from benchmarks import quality
from benchmarks.baselines import measure


def test_quality_bench_on_a_slice(tmp_path, capsys):
    out = tmp_path / "runs"
    code = quality.main(
        [
            "--model",
            "smollm2-135m-instruct",
            "--dataset",
            "sst2",
            "--labelled",
            "30",
            "--test",
            "12",
            "--generate",
            "3",
            "--shots",
            "2",
            "--nested",
            "--out",
            str(out),
            "--json",
            str(out / "r.json"),
            "--quiet",
        ]
    )
    assert code == 0
    [result] = json.loads((out / "r.json").read_text())
    methods = [(r["method"], r["variant"]) for r in result["rows"]]
    for expected in [
        ("zero-shot", "text mode"),
        ("prior-corrected", "text mode"),
        ("zero-shot", "labels mode"),
        ("prior-corrected", "labels mode, 2 rotations"),
        ("2-shot", "labels mode, 2-shot"),
        ("2-shot, prior-corrected", "labels mode, 2-shot"),
        ("zero-shot", "labels mode, llamadecide-2"),
        ("2-shot", "labels mode, llamadecide-2, 2-shot"),
    ]:
        assert expected in methods
    assert next(r for r in result["rows"] if r["method"] == "2-shot")["labels_used"] == 2
    assert any(m == "head" for m, _ in methods) and any(m == "chosen by CV" for m, _ in methods)
    assert any(m == "head + lexical" for m, _ in methods)
    chosen = [m for m, _ in methods].index("chosen by CV")
    assert methods[chosen + 1][0] == "chosen by CV, nested"
    nested = result["rows"][chosen + 1]
    # 30 labelled items less the 2 the question-first 2-shot prefix shows, four fifths of them per outer fold
    assert nested["labels_used"] == 22 and nested["variant"].startswith(methods[chosen][1])
    assert methods[-3:] == [
        ("TF-IDF + LR (baseline)", "words"),
        ("TF-IDF + LR (baseline)", "char 2-4-grams"),
        ("generate-and-parse (baseline)", "3 items"),
    ]
    for row in result["rows"]:
        assert 0.0 <= row["accuracy"] <= 1.0
        if row["nll"] is not None:
            assert row["nll"] > 0 and 0.0 <= row["ece"] <= 1.0 and 0.0 <= row["macro_f1"] <= 1.0
    assert result["rows"][-1]["invalid_rate"] is not None
    # A second run is served from the cache and gives the same figures.
    quality.main(
        [
            "--model",
            "smollm2-135m-instruct",
            "--dataset",
            "sst2",
            "--labelled",
            "30",
            "--test",
            "12",
            "--generate",
            "0",
            "--shots",
            "2",
            "--out",
            str(out),
            "--json",
            str(out / "again.json"),
            "--quiet",
        ]
    )
    again = json.loads((out / "again.json").read_text())[0]["rows"]
    assert [r["accuracy"] for r in again] == [r["accuracy"] for r in result["rows"][:-1] if r is not nested]
    capsys.readouterr()
    quality.main(["--markdown", str(out / "r.json")])
    assert "| TF-IDF + LR (baseline) | char 2-4-grams | 30 |" in capsys.readouterr().out


def test_measure_reports_guaranteed_coverage_only_when_the_bound_holds():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    sure = np.where(y[:, None] == np.arange(2), 0.99, 0.01)  # confident and always right
    row = measure(sure[200:], y[200:], sure[:200], y[:200])
    assert row["accuracy"] == 1.0 and row["auto_coverage"] == 1.0 and row["auto_precision"] == 1.0
    coin = np.full((400, 2), 0.5)  # no information: nothing can be auto-handled at precision 0.9
    row = measure(coin[200:], y[200:], coin[:200], y[:200])
    assert row["auto_coverage"] == 0.0 and row["threshold"] is None


def test_the_nested_row_measures_the_chosen_method_on_held_out_labelled_folds():
    from llamadecide.calibration.fitting import Candidate
    from llamadecide.calibration.variants import Variant, VariantScores

    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 300)
    cal = np.arange(300)
    variant = Variant("text")
    candidate = Candidate("temperature", False)
    fitted = {"text mode, temperature": (variant, candidate)}
    result = {"label": "text mode, temperature"}
    clear = VariantScores(np.log(np.where(y[:, None] == np.arange(3), 0.98, 0.01)), None, None, None)
    row = quality.nested_row(result, fitted, {variant: clear}, cal, y)
    assert row["labels_used"] == 240 and row["accuracy"] == 1.0
    assert row["auto_coverage"] == 1.0 and row["auto_precision"] == 1.0
    noise = VariantScores(rng.normal(size=(300, 3)), None, None, None)  # no information about y
    row = quality.nested_row(result, fitted, {variant: noise}, cal, y)
    assert row["accuracy"] < 0.5 and row["auto_coverage"] == 0.0 and row["auto_precision"] is None
