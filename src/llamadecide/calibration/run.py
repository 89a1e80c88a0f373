"""One calibration run: score every item (cached, resumable), split, choose and fit a calibrator on
the calibration part, measure both parts, pick the threshold, write plots, report and profile."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from llamadecide.calibration import metrics
from llamadecide.calibration.backends import Backend
from llamadecide.calibration.cache import ScoreCache
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.fitting import Calibrator, candidates, cross_validated_nll, fit
from llamadecide.calibration.plots import reliability_diagram, risk_coverage_plot
from llamadecide.calibration.profile import CalibrationProfile
from llamadecide.calibration.report import write_html
from llamadecide.calibration.thresholds import conformal_quantile, conformal_report, evaluate_threshold, select_threshold
from llamadecide.decisions.maths import confidence
from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION
from llamadecide.errors import InvalidRequestError


@dataclass(frozen=True)
class RunConfig:
    out_dir: Path
    calibration_size: int | None = None
    test_size: int | None = None
    seed: int = 0
    target_precision: float = 0.95
    confidence_level: float = 0.95
    conformal_alpha: float = 0.1
    compare_modes: bool = False
    bins: int = 15
    bootstrap_rounds: int = 200
    profile_name: str | None = None
    dataset_fingerprint: str = ""
    show_progress: bool = True


def split(n: int, calibration_size: int | None, test_size: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded disjoint calibration and test indices."""
    cal = calibration_size if calibration_size is not None else max(2, n // 3)
    test = test_size if test_size is not None else n - cal
    if cal < 2 or test < 1 or cal + test > n:
        raise InvalidRequestError(f"cannot split {n} items into {cal} calibration and {test} test items")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[:cal]), np.sort(order[cal:cal + test])


def score_items(backend: Backend, task: Task, items: list[LabelledItem], mode: str, cache: ScoreCache,
                show_progress: bool) -> tuple[np.ndarray, np.ndarray | None]:
    question = task.question(mode)
    identity = backend.identity()
    rows, lengths = [], []
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  disable=not show_progress) as progress:
        bar = progress.add_task(f"scoring ({mode} mode)", total=len(items))
        for n, item in enumerate(items):
            key = cache.key(identity, PROMPT_FORMAT_VERSION, mode, task.fingerprint(), item.text)
            scores = cache.get(key)
            if scores is None:
                scores = backend.score(item.text, question)
                cache.put(key, scores)
                if n % 20 == 0:
                    cache.commit()
            rows.append(scores.logprobs)
            lengths.append(scores.n_tokens)
            progress.advance(bar)
    cache.commit()
    L = np.asarray(rows, dtype=float)
    has_lengths = all(x is not None for x in lengths)
    return L, (np.asarray(lengths, dtype=float) if has_lengths else None)


def calibrate(backend: Backend, task: Task, items: list[LabelledItem], config: RunConfig) -> dict:
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    y_all = np.array([task.gold_index(item.label) for item in items])
    cal_idx, test_idx = split(len(items), config.calibration_size, config.test_size, config.seed)
    used = np.concatenate([cal_idx, test_idx])
    default_mode = task.question().mode
    modes = [default_mode] + ([m for m in ("text", "labels") if m != default_mode] if config.compare_modes else [])
    cache = ScoreCache(out / "cache.sqlite")
    scored: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    try:
        for mode in modes:
            L_used, len_used = score_items(backend, task, [items[i] for i in used], mode, cache, config.show_progress)
            L = np.zeros((len(items), L_used.shape[1]))
            L[used] = L_used
            lengths = None
            if len_used is not None:
                lengths = np.ones_like(L)
                lengths[used] = len_used
            scored[mode] = (L, lengths)
    finally:
        cache.close()
    y_cal, y_test = y_all[cal_idx], y_all[test_idx]

    # Choose mode, calibrator and normalisation on the calibration part only.
    results = []
    for mode, (L, lengths) in scored.items():
        for candidate in candidates(lengths is not None):
            cv = cross_validated_nll(L[cal_idx], None if lengths is None else lengths[cal_idx], y_cal, candidate, seed=config.seed)
            results.append({"mode": mode, "kind": candidate.kind, "length_normalize": candidate.length_normalize,
                            "label": f"{mode} mode, {candidate.label}", "cv_nll": cv})
    best = min(results, key=lambda r: r["cv_nll"])
    L, lengths = scored[best["mode"]]
    lengths_cal = None if lengths is None else lengths[cal_idx]
    lengths_test = None if lengths is None else lengths[test_idx]
    chosen = fit(L[cal_idx], lengths_cal, y_cal, kind=best["kind"], length_normalize=best["length_normalize"])
    raw_L, raw_lengths = scored[default_mode]
    raw = Calibrator()
    P_raw_test = raw.apply(raw_L[test_idx], None)
    P_cal_test = chosen.apply(L[test_idx], lengths_test)
    P_cal_cal = chosen.apply(L[cal_idx], lengths_cal)

    threshold = select_threshold(confidence(P_cal_cal), P_cal_cal.argmax(1) == y_cal,
                                 target=config.target_precision, confidence_level=config.confidence_level)
    test_threshold = (evaluate_threshold(confidence(P_cal_test), P_cal_test.argmax(1) == y_test, threshold.threshold)
                      if threshold else None)
    qhat = conformal_quantile(P_cal_cal, y_cal, config.conformal_alpha)
    conformal = {"alpha": config.conformal_alpha, **conformal_report(P_cal_test, y_test, qhat)}

    reliability_diagram({"raw": P_raw_test, "calibrated": P_cal_test}, y_test, out / "reliability.png", bins=config.bins,
                        title=f"Reliability: {task.name}")
    risk_coverage_plot({"raw": P_raw_test, "calibrated": P_cal_test}, y_test, out / "risk_coverage.png",
                       threshold_coverage=test_threshold["coverage"] if test_threshold else None)

    identity = backend.identity()
    summary = {
        "task": {"name": task.name, "type": task.type, "instructions": task.instructions,
                 "options": [o for o in task.options], "fingerprint": task.fingerprint()},
        "backend": backend.description,
        "model_sha256": identity,
        "prompt_format": PROMPT_FORMAT_VERSION,
        "dataset_fingerprint": config.dataset_fingerprint,
        "split": {"seed": config.seed, "calibration": int(len(cal_idx)), "test": int(len(test_idx))},
        "candidates": results,
        "chosen": {**best, "temperature": chosen.temperature, "bias": list(chosen.bias) if chosen.bias else None},
        "calibration_part": {"raw": metrics.summary(raw.apply(raw_L[cal_idx], None), y_cal, bins=config.bins, rounds=0),
                             "calibrated": metrics.summary(P_cal_cal, y_cal, bins=config.bins, rounds=0)},
        "test": {"raw": metrics.summary(P_raw_test, y_test, bins=config.bins, seed=config.seed, rounds=config.bootstrap_rounds),
                 "calibrated": metrics.summary(P_cal_test, y_test, bins=config.bins, seed=config.seed, rounds=config.bootstrap_rounds)},
        "threshold": {"target": config.target_precision, "confidence_level": config.confidence_level,
                      "calibration": threshold.as_dict() if threshold else None, "test": test_threshold},
        "conformal": conformal,
    }

    profile = CalibrationProfile(
        name=config.profile_name or task.name,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        model_sha256=identity, prompt_format=PROMPT_FORMAT_VERSION,
        task=summary["task"], mode=best["mode"], calibrator=chosen.kind, length_normalize=chosen.length_normalize,
        temperature=chosen.temperature, bias=list(chosen.bias) if chosen.bias else None,
        threshold=threshold.threshold if threshold else None, target_precision=config.target_precision,
        confidence_level=config.confidence_level, dataset_fingerprint=config.dataset_fingerprint,
        metrics={"test_raw": _headline(summary["test"]["raw"]), "test_calibrated": _headline(summary["test"]["calibrated"]),
                 "threshold_test": test_threshold},
    )
    profile.save(out / "profile.json")
    with (out / "predictions.jsonl").open("w", encoding="utf-8") as handle:
        for row, i in enumerate(test_idx):
            handle.write(json.dumps({"id": items[i].id, "label": int(y_all[i]), "options": [str(o) for o in task.options],
                                     "probabilities": P_cal_test[row].tolist(), "raw_probabilities": P_raw_test[row].tolist()}) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float), encoding="utf-8")
    write_html(summary, out)
    return summary


def _headline(m: dict) -> dict:
    return {k: m[k] for k in ("accuracy", "nll", "brier", "ece_width", "ece_mass", "aurc")}
