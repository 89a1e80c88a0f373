"""Few labels an option: what `calibrate` chooses from N labels per option, against the best head
fitted on the same labels at any C, both measured on the same test part.

    python -m benchmarks.few_labels [--dataset banking77] [--per-option 2] [--test 300] [--out DIR]

The labelled part is N items of every option (seeded), the test part `--test` other items; scoring is
calibrate's own (default flags, cached in DIR), choosing and fitting `calibration.steps`'. The best
head is a logistic head on the hidden state of each scored prompt (and on its answers, where they
were scored), C over a grid, and the class-means head: the one with the best test accuracy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.datasets import DATASETS
from benchmarks.engines import engine_for
from llamadecide.calibration.backends import LocalBackend
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import load_task, read_labelled
from llamadecide.calibration.fitting import fit_class_means, fit_head
from llamadecide.calibration.selection import apply_variant
from llamadecide.calibration.steps import choose_method, fit_method, score_items
from llamadecide.calibration.variants import demonstration_items
from llamadecide.decisions.maths import HIDDEN_ONLY, LOGLIK_HIDDEN

C_GRID = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0)


def parts(y: np.ndarray, per_option: int, test: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labelled = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:per_option] for c in np.unique(y)])
    rest = np.setdiff1d(np.arange(len(y)), labelled)
    return np.sort(labelled), np.sort(rng.permutation(rest)[:test])


def best_head(scored, cal, test, y) -> dict:
    """The best test accuracy any head fitted on the labelled part reaches (any C, any prompt)."""
    best = {"accuracy": -1.0}
    for variant, data in scored.items():
        if data.hidden is None:
            continue
        has = data.has_hidden if data.has_hidden is not None else np.ones(len(y), bool)
        fit_on, measured = cal[has[cal]], test[has[test]]
        feature_sets = [HIDDEN_ONLY] + ([LOGLIK_HIDDEN] if data.answered is None and not data.hidden_only else [])
        for features in feature_sets:
            heads = [
                (f"C={c:g}", fit_head(data.L[fit_on], data.hidden[fit_on], y[fit_on], C=c, features=features))
                for c in C_GRID
            ]
            if features == HIDDEN_ONLY:
                heads.append(("class means", fit_class_means(data.hidden[fit_on], y[fit_on], data.L.shape[1])))
            for name, head in heads:
                P = apply_variant(head, data, measured)
                accuracy = float((P.argmax(1) == y[measured]).mean())
                if accuracy > best["accuracy"]:
                    best = {
                        "accuracy": accuracy,
                        "head": f"{variant.label}, {features}, {name}",
                        "items": len(measured),
                    }
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="banking77", choices=sorted(DATASETS))
    parser.add_argument("--per-option", type=int, default=2)
    parser.add_argument("--test", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=Path("runs/few-labels"))
    args = parser.parse_args(argv)
    dataset = DATASETS[args.dataset]
    task = load_task(dataset.task)
    items = read_labelled(dataset.path, text_column=dataset.text_column, label_column=dataset.label_column)
    y = np.array([task.gold_index(item.label) for item in items])
    cal, test = parts(y, args.per_option, args.test, args.seed)
    config = RunConfig(out_dir=args.out, seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    engine = engine_for(args.model, n_ctx=8192)
    try:
        backend = LocalBackend(engine)
        scored, _ = score_items(backend, task, items, (cal, test), y, config)
        held = np.setdiff1d(cal, demonstration_items(scored))
        choice = choose_method(scored, held, y, config)
        if scored[choice.variant].answered is not None and choice.candidate.reads_answers:
            scored, _ = score_items(backend, task, items, (cal, test), y, config, deferred=False)
        fit = fit_method(scored[choice.variant], choice.candidate, held, y, config)
        data = scored[choice.variant]
        has = data.answered if choice.candidate.reads_answers and data.answered is not None else None
        measured = test if has is None else test[has[test]]
        P = apply_variant(fit.calibrator, data, measured)
        chosen = float((P.argmax(1) == y[measured]).mean())
        best = best_head(scored, held, test, y)
    finally:
        engine.close()
    result = {
        "dataset": args.dataset,
        "per_option": args.per_option,
        "labelled": int(len(cal)),
        "test": int(len(test)),
        "chosen": {
            "label": choice.chosen["label"],
            "test_accuracy": chosen,
            "cv_accuracy": choice.chosen["cv_accuracy"],
        },
        "best_head": best,
        "gap_points": 100 * (best["accuracy"] - chosen),
    }
    (args.out / "few-labels.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
