"""One calibration run: score every item (cached, resumable), split, choose and fit a calibrator on
the calibration part, measure both parts, pick the threshold, write plots, report and profile."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import numpy as np

from llamadecide.calibration import metrics
from llamadecide.calibration.backends import Backend
from llamadecide.calibration.cache import ScoreCache
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.cross_validation import one_blas_thread
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.fitting import Calibrator, Candidate, HeadCalibrator
from llamadecide.calibration.plots import reliability_diagram, risk_coverage_plot
from llamadecide.calibration.profile import CalibrationProfile, DemonstrationParams, HeadParams
from llamadecide.calibration.report import write_html
from llamadecide.calibration.selection import (
    apply_variant,
    choose,
    fit_variant,
    out_of_fold,
    public,
    select,
    usable,
)
from llamadecide.calibration.thresholds import (
    conformal_quantile,
    conformal_report,
    evaluate_threshold,
    reachable,
    select_threshold,
)
from llamadecide.calibration.variant_scoring import score_variants
from llamadecide.calibration.variants import Variant, VariantScores, demonstration_items
from llamadecide.decisions.maths import confidence
from llamadecide.errors import InvalidRequestError


def split(n: int, calibration_size: int | None, test_size: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded disjoint calibration and test indices."""
    cal = calibration_size if calibration_size is not None else max(2, n // 3)
    test = test_size if test_size is not None else n - cal
    if cal < 2 or test < 1 or cal + test > n:
        raise InvalidRequestError(f"cannot split {n} items into {cal} calibration and {test} test items")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[:cal]), np.sort(order[cal : cal + test])


def calibrate(backend: Backend, task: Task, items: list[LabelledItem], config: RunConfig) -> dict:
    if config.shots and not backend.supports_demonstrations:
        raise InvalidRequestError(
            f"--shots needs the local backend: {backend.description} cannot be shown demonstrations", param="shots"
        )
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    y_all = np.array([task.gold_index(item.label) for item in items])
    cal_idx, test_idx = split(len(items), config.calibration_size, config.test_size, config.seed)
    used = np.concatenate([cal_idx, test_idx])
    began = time.perf_counter()
    scoring_plan: dict = {}
    parts = (cal_idx, test_idx)  # as split: both scoring calls plan (and choose demonstrations) alike

    def scores(**deferral) -> dict[Variant, VariantScores]:
        cache = ScoreCache(out / "cache.sqlite")
        try:
            return score_variants(
                backend,
                task,
                items,
                used,
                config,
                cache,
                pool=parts[0],
                split_parts=parts,
                report=scoring_plan,
                **deferral,
            )
        finally:
            cache.close()

    comparing_s = 0.0  # of the scoring time, spent comparing candidates between rounds of answers

    def settled(scored: dict[Variant, VariantScores]) -> bool:
        nonlocal comparing_s
        started = time.perf_counter()
        held = np.setdiff1d(parts[0], demonstration_items(scored))
        behind = any(r.get("behind") for r in select(scored, held, y_all[held], seed=config.seed)[0])
        comparing_s += time.perf_counter() - started
        return behind

    # Answers on a subsample stop once every candidate reading them is behind; the test part's wait
    # until the chosen candidate turns out to read them.
    scored = scores(defer_answers=test_idx, settled=settled)
    scoring_s = time.perf_counter() - began
    shown = demonstration_items(scored)
    cal_idx = np.setdiff1d(cal_idx, shown)

    # Choose variant, method and calibrator on the calibration part only.
    results, fitted = select(scored, cal_idx, y_all[cal_idx], seed=config.seed)
    best, selection = choose(results)
    variant, candidate = fitted[best["label"]]
    if scored[variant].answered is not None and candidate.reads_answers:
        began_test = time.perf_counter()
        scored = scores()
        scoring_s += time.perf_counter() - began_test
    data = scored[variant]
    # Each fitted and measured on the items it has what it reads for (all of them, unless the run's
    # budget scored answers on a subsample).
    fit_on = usable(data, candidate, cal_idx)
    y_cal = y_all[fit_on]
    with one_blas_thread():
        chosen = fit_variant(candidate, data, fit_on, y_cal)
    default = next(iter(scored))
    raw = Calibrator()
    raw_cal, raw_test = (usable(scored[default], Candidate("none", False), idx) for idx in (cal_idx, test_idx))
    # Raw answers fit nothing, so where the test part has none (their scoring waited on a choice that
    # read none) they are measured on the calibration items that have them.
    raw_part = "test" if len(raw_test) else "calibration"
    raw_test = raw_test if len(raw_test) else raw_cal
    P_raw_test = raw.apply(scored[default].L[raw_test], None)
    measured = usable(data, candidate, test_idx)
    y_test, y_raw = y_all[measured], y_all[raw_test]
    P_cal_test = apply_variant(chosen, data, measured)
    P_cal_cal = apply_variant(chosen, data, fit_on)
    # The threshold and conformal sets are chosen on held-out probabilities: a head (or any fitted
    # calibrator) is over-confident on the very items it was fitted on.
    P_cal_oof = out_of_fold(candidate, data, fit_on, y_cal, seed=config.seed)

    threshold = select_threshold(
        confidence(P_cal_oof),
        P_cal_oof.argmax(1) == y_cal,
        target=config.target_precision,
        confidence_level=config.confidence_level,
    )
    test_threshold = (
        evaluate_threshold(confidence(P_cal_test), P_cal_test.argmax(1) == y_test, threshold.threshold)
        if threshold
        else None
    )
    qhat = conformal_quantile(P_cal_oof, y_cal, config.conformal_alpha)
    conformal = {"alpha": config.conformal_alpha, **conformal_report(P_cal_test, y_test, qhat)}

    curves, labels = {"raw": P_raw_test, "calibrated": P_cal_test}, {"raw": y_raw, "calibrated": y_test}
    reliability_diagram(curves, labels, out / "reliability.png", bins=config.bins, title=f"Reliability: {task.name}")
    risk_coverage_plot(
        curves,
        labels,
        out / "risk_coverage.png",
        threshold_coverage=test_threshold["coverage"] if test_threshold else None,
    )

    identity = backend.identity()
    summary = {
        "task": {
            "name": task.name,
            "type": task.type,
            "instructions": task.instructions,
            "options": [o for o in task.options],
            "descriptions": list(task.descriptions),
            "fingerprint": task.fingerprint(),
        },
        "backend": backend.description,
        "model_sha256": identity,
        "prompt_format": variant.prompt_format,
        "dataset_fingerprint": config.dataset_fingerprint,
        "split": {
            "seed": config.seed,
            "calibration": int(len(cal_idx)),
            "test": int(len(test_idx)),
            "shown_as_demonstrations": int(len(shown)),
        },
        "candidates": [public(r) for r in results],
        "selection": selection,
        "chosen": {
            **public(best),
            "temperature": getattr(chosen, "temperature", None),
            "bias": list(chosen.bias) if getattr(chosen, "bias", None) else None,
            "prior": list(chosen.prior) if chosen.prior else None,
        },
        "scoring": scoring_plan,
        "calibration_part": {
            "raw": metrics.summary(
                raw.apply(scored[default].L[raw_cal], None), y_all[raw_cal], bins=config.bins, rounds=0
            ),
            "calibrated": metrics.summary(P_cal_cal, y_cal, bins=config.bins, rounds=0),
        },
        "test": {
            "raw": {
                **metrics.summary(
                    P_raw_test, y_raw, bins=config.bins, seed=config.seed, rounds=config.bootstrap_rounds
                ),
                "part": raw_part,
            },
            "calibrated": metrics.summary(
                P_cal_test, y_test, bins=config.bins, seed=config.seed, rounds=config.bootstrap_rounds
            ),
        },
        "threshold": {
            "target": config.target_precision,
            "confidence_level": config.confidence_level,
            "calibration": threshold.as_dict() if threshold else None,
            "test": test_threshold,
            "reachable": reachable(
                confidence(P_cal_oof),
                P_cal_oof.argmax(1) == y_cal,
                target=config.target_precision,
                confidence_level=config.confidence_level,
            ),
        },
        "conformal": conformal,
    }

    total_s = time.perf_counter() - began
    summary["cost"] = {
        "items": int(len(used)),
        "variants": len(scored),
        "scoring_s": scoring_s,
        "comparing_while_scoring_s": comparing_s,  # part of scoring_s (the fits it makes, selection reuses)
        "total_s": total_s,
        "scoring_s_per_item": scoring_s / max(len(used), 1),
        "total_s_per_item": total_s / max(len(used), 1),
    }
    profile = CalibrationProfile(
        name=config.profile_name or task.name,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        model_sha256=identity,
        prompt_format=variant.prompt_format,
        task=summary["task"],
        mode=variant.mode,
        calibrator=chosen.kind,
        length_normalize=chosen.length_normalize,
        temperature=getattr(chosen, "temperature", 1.0),
        bias=list(chosen.bias) if getattr(chosen, "bias", None) else None,
        method=candidate.method,
        prior_correction=candidate.prior_correction,
        prior=summary["chosen"]["prior"],
        rotations=variant.rotations,
        demonstrations=[DemonstrationParams(input=d.input, option=d.option) for d in data.demonstrations] or None,
        head=HeadParams.from_calibrator(chosen, data.hidden_layer) if isinstance(chosen, HeadCalibrator) else None,
        threshold=threshold.threshold if threshold else None,
        target_precision=config.target_precision,
        confidence_level=config.confidence_level,
        dataset_fingerprint=config.dataset_fingerprint,
        metrics={
            "test_raw": _headline(summary["test"]["raw"]),
            "test_calibrated": _headline(summary["test"]["calibrated"]),
            "threshold_test": test_threshold,
        },
    )
    profile.save(out / "profile.json")
    with (out / "predictions.jsonl").open("w", encoding="utf-8") as handle:
        raw_rows = {int(i): row for row, i in enumerate(raw_test)}
        for row, i in enumerate(measured):
            raw_p = P_raw_test[raw_rows[int(i)]].tolist() if int(i) in raw_rows else None
            handle.write(
                json.dumps(
                    {
                        "id": items[i].id,
                        "label": int(y_all[i]),
                        "options": [str(o) for o in task.options],
                        "probabilities": P_cal_test[row].tolist(),
                        "raw_probabilities": raw_p,
                    }
                )
                + "\n"
            )
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float), encoding="utf-8")
    write_html(summary, out)
    return summary


def _headline(m: dict) -> dict:
    return {k: m[k] for k in ("accuracy", "nll", "brier", "ece_width", "ece_mass", "aurc", "part") if k in m}
