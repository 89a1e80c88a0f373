"""Decision quality on real labelled data (a script that prints figures, not a timed test).

    python -m benchmarks.quality [--model NAME ...] [--dataset agnews sst2 banking77 banking77-phrases]
        [--labelled N] [--test N] [--rotations R] [--shots K] [--generate N] [--nested] [--out DIR] [--json FILE]

Per model and data set: a seeded split into a labelled (calibration) part and a test part. Every
method is chosen or fitted on the labelled part only and measured on the test part: accuracy,
macro-F1, NLL, ECE, and the share of test items handled automatically at precision 0.9 (threshold
from held-out labelled-part probabilities with the Clopper-Pearson bound at 95% confidence), with
the precision those items really had. Baselines on the same split: TF-IDF + logistic regression
trained on the labelled part, and generate-and-parse (greedy chat answer, parsed for an option).
With --nested, the chosen method is also measured by nested cross-validation on the labelled part,
which checks its threshold's guarantee on several times as many items as a small test part holds.
Scores are cached under DIR, so a re-run (or an interrupted one) only computes what is missing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.baselines import (
    TARGET,
    generate_and_parse,
    guaranteed_threshold,
    measure,
    tfidf_baseline,
)
from benchmarks.datasets import DATASETS, Dataset
from benchmarks.engines import engine_for
from llamadecide.calibration.backends import LocalBackend
from llamadecide.calibration.cache import ScoreCache
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import load_task, read_labelled
from llamadecide.calibration.fitting import Candidate
from llamadecide.calibration.folds import splitter
from llamadecide.calibration.selection import apply_variant, choose, fit_variant, out_of_fold, select
from llamadecide.calibration.steps import split
from llamadecide.calibration.variant_scoring import score_variants
from llamadecide.calibration.variants import Variant, VariantScores, demonstration_items
from llamadecide.decisions.maths import HIDDEN_ONLY, LOGLIK_HIDDEN, confidence
from llamadecide.decisions.prompt import PROMPT_FORMATS
from llamadecide.engine import Engine
from llamadecide.engine.model_files import BUNDLED


def method_rows(
    scored: dict[Variant, VariantScores],
    cal_idx: np.ndarray,
    test_idx: np.ndarray,
    y: np.ndarray,
    *,
    nested: bool = False,
) -> list[dict]:
    """Zero-shot (or k-shot) and prior-corrected (no labels fitted) for each variant, the best head
    for each variant, the method `llamadecide calibrate` would choose, and (`nested`) that method
    measured by nested cross-validation on the labelled part. Items shown as demonstrations in a
    question-first prefix are left out of the labelled part (as `calibrate` does)."""
    cal_idx = np.setdiff1d(cal_idx, demonstration_items(scored))
    y_cal, y_test = y[cal_idx], y[test_idx]
    rows = []
    for variant, data in scored.items():
        shots = f"{variant.shots}-shot" if variant.shots else ""
        fixed = [(shots or "zero-shot", Candidate("none", False))]
        if data.content_free is not None:
            fixed.append(
                (
                    f"{shots}, prior-corrected" if shots else "prior-corrected",
                    Candidate("none", False, prior_correction=True),
                )
            )
        for name, candidate in fixed:
            calibrator = fit_variant(candidate, data, cal_idx, y_cal)
            rows.append(
                {
                    "method": name,
                    "variant": variant.label,
                    "labels_used": variant.shots,
                    **measure(
                        apply_variant(calibrator, data, test_idx),
                        y_test,
                        apply_variant(calibrator, data, cal_idx),
                        y_cal,
                    ),
                }
            )
    results, fitted = select(scored, cal_idx, y_cal)
    heads = [r for r in results if r["kind"] == "head"]
    for variant in scored:
        for features, with_lexical, name in (
            (LOGLIK_HIDDEN, False, "head"),
            (LOGLIK_HIDDEN, True, "head + lexical"),
            (HIDDEN_ONLY, False, "head, hidden state alone"),
            (HIDDEN_ONLY, True, "head, hidden state alone + lexical"),
        ):
            mine = [
                r
                for r in heads
                if (r["mode"], r["rotations"], r["shots"], r["prompt_format"], r["lexical"], r["features"])
                == (variant.mode, variant.rotations, variant.shots, variant.prompt_format, with_lexical, features)
            ]
            if mine:
                rows.append(
                    _fitted_row(name, min(mine, key=lambda r: r["cv_nll"]), fitted, scored, cal_idx, test_idx, y)
                )
    best, _ = choose(results)
    rows.append(_fitted_row("chosen by CV", best, fitted, scored, cal_idx, test_idx, y))
    if nested:
        rows.append(nested_row(best, fitted, scored, cal_idx, y))
    return rows


def _fitted_row(
    name: str, result: dict, fitted: dict, scored: dict, cal_idx: np.ndarray, test_idx: np.ndarray, y: np.ndarray
) -> dict:
    variant, candidate = fitted[result["label"]]
    data = scored[variant]
    calibrator = fit_variant(candidate, data, cal_idx, y[cal_idx])
    oof = out_of_fold(candidate, data, cal_idx, y[cal_idx])
    return {
        "method": name,
        "variant": result["label"],
        "labels_used": len(cal_idx),
        **measure(apply_variant(calibrator, data, test_idx), y[test_idx], oof, y[cal_idx]),
    }


def nested_row(
    result: dict, fitted: dict, scored: dict, cal_idx: np.ndarray, y: np.ndarray, *, folds: int = 5, seed: int = 1
) -> dict:
    """The method chosen by CV, measured on the labelled part itself, with several times the items of
    a small test part: in each of `folds` outer folds, the threshold is chosen on out-of-fold
    probabilities of the other folds and the calibrator is refitted on them, as `calibrate` does on
    the whole part; the figures are pooled over the held-out folds. The method was chosen on the
    whole part, so this checks the fit and the threshold's guarantee, not the choice."""
    variant, candidate = fitted[result["label"]]
    data = scored[variant]
    y_cal = y[cal_idx]
    P = np.zeros((len(cal_idx), data.L.shape[1]))
    auto = np.zeros(len(cal_idx), dtype=bool)
    for train, held in splitter(data.L[cal_idx], y_cal, folds, seed):
        oof = out_of_fold(candidate, data, cal_idx[train], y_cal[train])
        threshold = guaranteed_threshold(oof, y_cal[train])
        P[held] = apply_variant(fit_variant(candidate, data, cal_idx[train], y_cal[train]), data, cal_idx[held])
        if threshold is not None:
            auto[held] = confidence(P[held]) >= threshold.threshold
    correct = P.argmax(1) == y_cal
    row = measure(P, y_cal, None, y_cal)
    row.update(auto_coverage=float(auto.mean()), auto_precision=float(correct[auto].mean()) if auto.any() else None)
    return {
        "method": "chosen by CV, nested",
        "variant": f"{result['label']}; labelled part, {folds} outer folds",
        "labels_used": int(round(len(cal_idx) * (folds - 1) / folds)),
        **row,
    }


def run_one(engine: Engine, model: str, name: str, dataset: Dataset, args, console: Console) -> dict:
    task = load_task(dataset.task)
    items = read_labelled(dataset.path, text_column=dataset.text_column, label_column=dataset.label_column)
    y = np.array([task.gold_index(item.label) for item in items])
    cal_idx, test_idx = split(len(items), args.labelled or dataset.labelled, args.test or dataset.test, args.seed)
    used = np.concatenate([cal_idx, test_idx])
    rotations = args.rotations if len(task.options) <= args.max_rotated_options else 1
    config = RunConfig(
        out_dir=args.out,
        compare_modes=len(args.modes) > 1,
        rotations=rotations,
        shots=args.shots,
        show_progress=not args.quiet,
        only_mode=None if len(args.modes) > 1 else args.modes[0],
        prompt_formats=tuple(args.prompt_formats),
        shots_per_class=tuple(args.shots_per_class),
        row_budget=None,
    )  # every method on every item: the bench compares them all
    cache = ScoreCache(args.out / f"cache-{model}-{name}.sqlite")
    began = time.perf_counter()
    try:
        scored = score_variants(LocalBackend(engine), task, items, used, config, cache, pool=cal_idx)
    finally:
        cache.close()
    rows = method_rows(scored, cal_idx, test_idx, y, nested=args.nested)
    rows.append(
        {
            "method": "TF-IDF + LR (baseline)",
            "variant": "words",
            "labels_used": len(cal_idx),
            **tfidf_baseline(items, y, cal_idx, test_idx, len(task.options)),
        }
    )
    rows.append(
        {
            "method": "TF-IDF + LR (baseline)",
            "variant": "char 2-4-grams",
            "labels_used": len(cal_idx),
            **tfidf_baseline(items, y, cal_idx, test_idx, len(task.options), analyzer="char_wb"),
        }
    )
    generated = None
    if args.generate:
        generated = generate_and_parse(engine, task, items, y, test_idx[: args.generate])
        rows.append(
            {
                "method": "generate-and-parse (baseline)",
                "variant": f"{generated['items']} items",
                "labels_used": 0,
                "accuracy": generated["accuracy"],
                "macro_f1": None,
                "nll": None,
                "ece": None,
                "auto_coverage": None,
                "auto_precision": None,
                "threshold": None,
                "invalid_rate": generated["invalid_rate"],
            }
        )
    result = {
        "model": model,
        "dataset": name,
        "labelled": len(cal_idx),
        "test": len(test_idx),
        "seed": args.seed,
        "rotations": rotations,
        "seconds": time.perf_counter() - began,
        "rows": rows,
    }
    print_table(result, console)
    return result


def print_table(result: dict, console: Console) -> None:
    table = Table(
        title=f"{result['dataset']} · {result['model']} · {result['labelled']} labelled, "
        f"{result['test']} test items (seed {result['seed']})"
    )
    for column in ("method", "variant", "accuracy", "macro-F1", "NLL", "ECE", f"auto @ P>={TARGET}", "their precision"):
        table.add_column(column, justify="left" if column in ("method", "variant") else "right")

    def f(value, fmt="{:.3f}"):
        return "-" if value is None else fmt.format(value)

    for row in result["rows"]:
        table.add_row(
            row["method"],
            row["variant"],
            f(row["accuracy"]),
            f(row.get("macro_f1")),
            f(row.get("nll")),
            f(row.get("ece")),
            f(row.get("auto_coverage"), "{:.1%}"),
            f(row.get("auto_precision")),
        )
    console.print(table)


def markdown(results: list[dict]) -> str:
    """The figures as Markdown tables (for the README and docs/measurements)."""
    out = []

    def f(value, fmt="{:.3f}"):
        return "-" if value is None else fmt.format(value)

    for result in results:
        out.append(
            f"**{result['dataset']}**, {result['model']}: {result['labelled']} labelled, {result['test']} test "
            f"items "
            f"(seed {result['seed']})\n"
        )
        out.append(
            f"| method | variant | labels used | accuracy | macro-F1 | NLL | ECE | auto @ precision {TARGET} | their "
            f"precision |"
        )
        out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for row in result["rows"]:
            out.append(
                f"| {row['method']} | {row['variant']} | {row['labels_used']} | {f(row['accuracy'])} | "
                f"{f(row.get('macro_f1'))} | {f(row.get('nll'))} | {f(row.get('ece'))} | "
                f"{f(row.get('auto_coverage'), '{:.1%}')} | {f(row.get('auto_precision'))} |"
            )
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", nargs="+", default=["qwen2.5-coder-1.5b-instruct"], help="bundled model names or GGUF paths"
    )
    parser.add_argument(
        "--dataset",
        nargs="+",
        default=["agnews", "sst2", "banking77"],
        choices=list(DATASETS),
        help="data sets (banking77-phrases: Banking77 with its intents shown as plain phrases)",
    )
    parser.add_argument("--labelled", type=int, default=None, help="labelled (calibration) items; default per data set")
    parser.add_argument("--test", type=int, default=None, help="test items; default per data set")
    parser.add_argument("--rotations", type=int, default=4, help="labels-mode rotations (data sets with few options)")
    parser.add_argument(
        "--shots", type=int, default=0, help="also measure k-shot: this many labelled items shown before each question"
    )
    parser.add_argument(
        "--prompt-formats",
        "--layouts",
        nargs="+",
        default=list(PROMPT_FORMATS),
        choices=list(PROMPT_FORMATS),
        help="prompt formats to measure (question-first ones zero-shot and many-shot)",
    )
    parser.add_argument(
        "--shots-per-class",
        type=int,
        nargs="*",
        default=[1],
        help="question-first many-shot: demonstrations per class in the shared prefix (none: zero-shot only)",
    )
    parser.add_argument("--max-rotated-options", type=int, default=8)
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["text", "labels"],
        choices=["text", "labels"],
        help="scoring modes to measure (text alone halves the cost on many-option sets)",
    )
    parser.add_argument("--generate", type=int, default=100, help="test items for generate-and-parse (0: skip)")
    parser.add_argument(
        "--nested",
        action="store_true",
        help="also measure the chosen method by nested cross-validation on the labelled part "
        "(its threshold's guarantee on several times the items of the test part)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("runs/quality"))
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--markdown",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="print the saved --json results as Markdown tables and exit",
    )
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown([r for path in args.markdown for r in json.loads(path.read_text(encoding="utf-8"))]))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(width=170)
    results = []
    for model in args.model:
        engine = engine_for(model, n_ctx=8192, n_threads=args.threads)
        for name in args.dataset:
            label = model if model in BUNDLED else Path(model).stem
            results.append(run_one(engine, label, name, DATASETS[name], args, console))
            if args.json:
                args.json.write_text(json.dumps(results, indent=2, default=float), encoding="utf-8")
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
