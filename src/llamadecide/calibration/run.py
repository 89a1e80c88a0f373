"""One calibration run, as a list of steps: split, score every item (cached, resumable), choose and
fit a calibrator on the calibration part, certify a threshold on the items of known chance, measure
the test part, and build the profile; then write plots, report, summary, predictions and profile.
Computing (`run_calibration`) stays apart from writing files (`write_run`)."""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llamadecide.calibration import metrics
from llamadecide.calibration.backends import Backend
from llamadecide.calibration.cache import ScoreCache
from llamadecide.calibration.certification import certification_counts, certification_weights
from llamadecide.calibration.compare import Record, compare
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.cross_validation import one_blas_thread
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.fitting import Calibrator, Candidate, HeadCalibrator
from llamadecide.calibration.plots import reliability_diagram, risk_coverage_plot
from llamadecide.calibration.profile import CalibrationProfile, DemonstrationParams, method_fields
from llamadecide.calibration.report import write_html
from llamadecide.calibration.selection import apply_variant, choose, fit_variant, out_of_fold, public, select, usable
from llamadecide.calibration.thresholds import (
    Threshold,
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


@dataclass(frozen=True)
class Lineage:
    """A refit's parent: the profile it follows, and what that profile served on the labelled items
    (`Record`s keyed by item id), which the new version is compared with."""

    parent: CalibrationProfile
    served: dict[str, Record] = field(default_factory=dict)


@dataclass
class CalibrationResult:
    summary: dict
    profile: CalibrationProfile
    predictions: list[dict]
    curves: tuple[dict, dict]  # probabilities and labels per curve (raw, calibrated) for the plots
    threshold_coverage: float | None


def split(n: int, calibration_size: int | None, test_size: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded disjoint calibration and test indices (a test size of 0: measured out of fold)."""
    cal = calibration_size if calibration_size is not None else max(2, n // 3)
    test = test_size if test_size is not None else n - cal
    if cal < 2 or test < 0 or cal + test > n:
        raise InvalidRequestError(f"cannot split {n} items into {cal} calibration and {test} test items")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[:cal]), np.sort(order[cal : cal + test])


def calibrate(
    backend: Backend, task: Task, items: list[LabelledItem], config: RunConfig, lineage: Lineage | None = None
) -> dict:
    """Run, write every output to `config.out_dir`, return the summary."""
    result = run_calibration(backend, task, items, config, lineage)
    write_run(result, items, Path(config.out_dir), config.bins)
    return result.summary


def run_calibration(
    backend: Backend, task: Task, items: list[LabelledItem], config: RunConfig, lineage: Lineage | None = None
) -> CalibrationResult:
    if config.shots and not backend.supports_demonstrations:
        raise InvalidRequestError(
            f"--shots needs the local backend: {backend.description} cannot be shown demonstrations", param="shots"
        )
    Path(config.out_dir).mkdir(parents=True, exist_ok=True)  # the score cache lives there
    began = time.perf_counter()
    y = np.array([task.gold_index(item.label) for item in items])
    parts = split(len(items), config.calibration_size, config.test_size, config.seed)
    scored, scoring = score_items(backend, task, items, parts, y, config)
    cal_idx, test_idx = np.setdiff1d(parts[0], demonstration_items(scored)), parts[1]
    choice = choose_method(scored, cal_idx, y, config)
    if scored[choice.variant].answered is not None and choice.candidate.reads_answers:  # the test part's waited
        scored, more = score_items(backend, task, items, parts, y, config, deferred=False)
        scoring.update(seconds=scoring["seconds"] + more["seconds"], plan=more["plan"])
    fit = fit_method(scored[choice.variant], choice.candidate, cal_idx, y, config)
    draws = [items[i].draw for i in fit.fit_on]
    certified = certify(fit.P_oof, fit.y, certification_weights(draws), config)
    measured = measure(scored, choice, fit, (cal_idx, test_idx), y, certified, config.conformal_alpha)
    summary = summarise(backend, task, config, scored, choice, fit, certified, measured, (cal_idx, test_idx), y)
    summary["certification"] = certification_counts(draws)
    summary["split"]["items"] = len(items)  # with the sizes as split, `split` gives the parts back
    summary["split"]["as_split"] = {"calibration": int(len(parts[0])), "test": int(len(parts[1]))}
    profile = build_profile(summary, config, choice, fit, scored[choice.variant], certified.threshold, lineage)
    summary["profile"] = {"name": profile.name, "version": profile.version, "parent": profile.parent}
    if lineage is not None:
        summary["parent"] = compare_with_parent(lineage, items, fit, task)
    summary["scoring"] = scoring["plan"]
    summary["cost"] = _cost(len(cal_idx) + len(test_idx), len(scored), scoring, time.perf_counter() - began)
    curves = ({"raw": measured.P_raw, "calibrated": measured.P}, {"raw": measured.y_raw, "calibrated": measured.y})
    coverage = measured.threshold["coverage"] if measured.threshold else None
    return CalibrationResult(summary, profile, prediction_rows(items, task, y, measured), curves, coverage)


def _cost(items: int, variants: int, scoring: dict, total_s: float) -> dict:
    return {
        "items": int(items),
        "variants": variants,
        "scoring_s": scoring["seconds"],
        "comparing_while_scoring_s": scoring["comparing_s"],  # part of scoring_s (its fits, selection reuses)
        "total_s": total_s,
        "scoring_s_per_item": scoring["seconds"] / max(items, 1),
        "total_s_per_item": total_s / max(items, 1),
    }


# -- scoring -----------------------------------------------------------------------------------------


def score_items(
    backend: Backend,
    task: Task,
    items: list[LabelledItem],
    parts: tuple[np.ndarray, np.ndarray],
    y: np.ndarray,
    config: RunConfig,
    *,
    deferred: bool = True,
) -> tuple[dict[Variant, VariantScores], dict]:
    """Every used item's scores per variant. `deferred`: answers on a subsample stop once every
    candidate reading them is behind, and the test part's wait until the chosen candidate reads them
    (a later call without deferral scores them, the rest from the cache)."""
    cal_idx, test_idx = parts
    plan: dict = {}
    timing = {"comparing_s": 0.0}

    def settled(scored: dict[Variant, VariantScores]) -> bool:
        started = time.perf_counter()
        held = np.setdiff1d(cal_idx, demonstration_items(scored))
        behind = any(r.get("behind") for r in select(scored, held, y[held], seed=config.seed)[0])
        timing["comparing_s"] += time.perf_counter() - started
        return behind

    began = time.perf_counter()
    cache = ScoreCache(Path(config.out_dir) / "cache.sqlite")
    try:
        scored = score_variants(
            backend,
            task,
            items,
            np.concatenate([cal_idx, test_idx]),
            config,
            cache,
            pool=cal_idx,
            split_parts=parts,  # as split: both scoring calls plan (and choose demonstrations) alike
            report=plan,
            **({"defer_answers": test_idx, "settled": settled} if deferred else {}),
        )
    finally:
        cache.close()
    return scored, {"seconds": time.perf_counter() - began, "comparing_s": timing["comparing_s"], "plan": plan}


# -- choosing and fitting ----------------------------------------------------------------------------


@dataclass
class Choice:
    results: list[dict]  # every candidate's cross-validated figures
    selection: dict  # how the chosen one was chosen
    chosen: dict  # its figures
    variant: Variant
    candidate: Candidate


def choose_method(
    scored: dict[Variant, VariantScores], cal_idx: np.ndarray, y: np.ndarray, config: RunConfig
) -> Choice:
    """Every (variant, candidate) cross-validated on the calibration part; the chosen one (`choose`)."""
    results, fitted = select(scored, cal_idx, y[cal_idx], seed=config.seed)
    best, selection = choose(results)
    return Choice(results, selection, best, *fitted[best["label"]])


@dataclass
class Fit:
    candidate: Candidate
    calibrator: Calibrator | HeadCalibrator
    fit_on: np.ndarray  # the calibration items it has what it reads for
    y: np.ndarray  # their labels
    P: np.ndarray  # its probabilities on them (in sample)
    P_oof: np.ndarray  # their out-of-fold probabilities: what thresholds and conformal sets are set on


def fit_method(data: VariantScores, candidate: Candidate, cal_idx: np.ndarray, y: np.ndarray, config: RunConfig) -> Fit:
    """The chosen candidate fitted on the calibration items it has what it reads for (all of them,
    unless the run's budget scored answers on a subsample), and its out-of-fold probabilities: a
    fitted calibrator is over-confident on the very items it was fitted on."""
    fit_on = usable(data, candidate, cal_idx)
    with one_blas_thread():
        calibrator = fit_variant(candidate, data, fit_on, y[fit_on])
    P = apply_variant(calibrator, data, fit_on)
    P_oof = out_of_fold(candidate, data, fit_on, y[fit_on], seed=config.seed)
    return Fit(candidate, calibrator, fit_on, y[fit_on], P, P_oof)


# -- certifying --------------------------------------------------------------------------------------


@dataclass
class Certified:
    threshold: Threshold | None
    reachable: dict
    qhat: float


def certify(P_oof: np.ndarray, y: np.ndarray, weights: np.ndarray, config: RunConfig) -> Certified:
    """The loosest threshold whose automatic answers clear the target precision at the confidence
    level, on the out-of-fold probabilities of the items that certify (each with its weight), what
    the items support when none does, and the conformal quantile."""
    conf, correct = confidence(P_oof), P_oof.argmax(1) == y
    uniform = bool(np.all(weights == 1.0))
    threshold = select_threshold(
        conf,
        correct,
        target=config.target_precision,
        confidence_level=config.confidence_level,
        weights=None if uniform else weights,
    )
    certifying = weights > 0
    supported = reachable(
        conf[certifying],
        correct[certifying],
        target=config.target_precision,
        confidence_level=config.confidence_level,
    )
    return Certified(threshold, supported, conformal_quantile(P_oof, y, config.conformal_alpha))


# -- measuring ---------------------------------------------------------------------------------------


@dataclass
class Measured:
    P: np.ndarray  # calibrated probabilities on the measured items
    y: np.ndarray
    items: np.ndarray  # which items (indices into the run's items)
    P_raw: np.ndarray  # the default variant's raw probabilities
    y_raw: np.ndarray
    raw_items: np.ndarray
    raw_part: str  # test, calibration (raw answers only there), or out of fold
    part: str  # test, or "out of fold" (no test part: the calibration part's held-out probabilities)
    threshold: dict | None  # the certified threshold's figures on them
    conformal: dict


def measure(
    scored: dict[Variant, VariantScores],
    choice: Choice,
    fit: Fit,
    parts: tuple[np.ndarray, np.ndarray],
    y: np.ndarray,
    certified: Certified,
    alpha: float,
) -> Measured:
    """The chosen calibrator, its threshold and conformal sets, and the raw answers on the test part;
    with no test part, the calibration part's out-of-fold probabilities stand in (said as such)."""
    cal_idx, test_idx = parts
    data, default = scored[choice.variant], next(iter(scored))
    raw_cal, raw_test = (usable(scored[default], Candidate("none", False), idx) for idx in (cal_idx, test_idx))
    # Raw answers fit nothing, so where the test part has none (their scoring waited on a choice that
    # read none) they are measured on the calibration items that have them.
    raw_part = "test" if len(raw_test) else "calibration"
    raw_items = raw_test if len(raw_test) else raw_cal
    if len(test_idx):
        items = usable(data, choice.candidate, test_idx)
        P, part = apply_variant(fit.calibrator, data, items), "test"
    else:
        items, P, part = fit.fit_on, fit.P_oof, "out of fold"
    threshold = (
        evaluate_threshold(confidence(P), P.argmax(1) == y[items], certified.threshold.threshold)
        if certified.threshold
        else None
    )
    return Measured(
        P,
        y[items],
        items,
        Calibrator().apply(scored[default].L[raw_items], None),
        y[raw_items],
        raw_items,
        raw_part,
        part,
        threshold,
        {"alpha": alpha, **conformal_report(P, y[items], certified.qhat)},
    )


# -- the summary and the profile ---------------------------------------------------------------------


def summarise(
    backend: Backend,
    task: Task,
    config: RunConfig,
    scored: dict[Variant, VariantScores],
    choice: Choice,
    fit: Fit,
    certified: Certified,
    measured: Measured,
    parts: tuple[np.ndarray, np.ndarray],
    y: np.ndarray,
) -> dict:
    """What the run found, as summary.json keeps it and the report shows it."""
    calibrator = fit.calibrator
    default = next(iter(scored))
    raw_cal = usable(scored[default], Candidate("none", False), parts[0])
    bootstrap = {"bins": config.bins, "seed": config.seed, "rounds": config.bootstrap_rounds}
    return {
        "task": {
            "name": task.name,
            "type": task.type,
            "instructions": task.instructions,
            "options": list(task.options),
            "descriptions": list(task.descriptions),
            "fingerprint": task.fingerprint(),
        },
        "backend": backend.description,
        "model_sha256": backend.identity(),
        "prompt_format": choice.variant.prompt_format,
        "dataset_fingerprint": config.dataset_fingerprint,
        "split": {
            "seed": config.seed,
            "calibration": int(len(parts[0])),
            "test": int(len(parts[1])),
            "shown_as_demonstrations": int(len(demonstration_items(scored))),
        },
        "candidates": [public(r) for r in choice.results],
        "selection": choice.selection,
        "chosen": {
            **public(choice.chosen),
            "temperature": getattr(calibrator, "temperature", None),
            "bias": list(calibrator.bias) if getattr(calibrator, "bias", None) else None,
            "prior": list(calibrator.prior) if calibrator.prior else None,
        },
        "calibration_part": {
            "raw": metrics.summary(
                Calibrator().apply(scored[default].L[raw_cal], None), y[raw_cal], bins=config.bins, rounds=0
            ),
            "calibrated": metrics.summary(fit.P, fit.y, bins=config.bins, rounds=0),
        },
        "test": {
            "raw": {**metrics.summary(measured.P_raw, measured.y_raw, **bootstrap), "part": measured.raw_part},
            "calibrated": {**metrics.summary(measured.P, measured.y, **bootstrap), "part": measured.part},
        },
        "threshold": {
            "target": config.target_precision,
            "confidence_level": config.confidence_level,
            "calibration": certified.threshold.as_dict() if certified.threshold else None,
            "test": measured.threshold,
            "reachable": certified.reachable,
        },
        "conformal": measured.conformal,
    }


def build_profile(
    summary: dict,
    config: RunConfig,
    choice: Choice,
    fit: Fit,
    data: VariantScores,
    threshold: Threshold | None,
    lineage: Lineage | None,
) -> CalibrationProfile:
    """The profile the server applies: the chosen method's parameters, its threshold, and, for a
    refit, the version after its parent's, naming it."""
    parent = lineage.parent if lineage else None
    return CalibrationProfile(
        name=config.profile_name or (parent.name if parent else summary["task"]["name"]),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        version=parent.version + 1 if parent else 1,
        parent=parent.version_id if parent else None,
        model_sha256=summary["model_sha256"],
        prompt_format=choice.variant.prompt_format,
        task=summary["task"],
        mode=choice.variant.mode,
        **method_fields(fit.calibrator, choice.candidate, data.hidden_layer),
        rotations=choice.variant.rotations,
        demonstrations=[DemonstrationParams(input=d.input, option=d.option) for d in data.demonstrations] or None,
        threshold=threshold.threshold if threshold else None,
        target_precision=config.target_precision,
        confidence_level=config.confidence_level,
        dataset_fingerprint=config.dataset_fingerprint,
        metrics={
            "test_raw": _headline(summary["test"]["raw"]),
            "test_calibrated": _headline(summary["test"]["calibrated"]),
            "threshold_test": summary["threshold"]["test"],
            "certification": summary.get("certification"),
            # Which items of its data it was calibrated on (`bench --profile` measures accuracy on the others).
            "split": {
                "seed": summary["split"]["seed"],
                "items": summary["split"]["items"],
                **summary["split"]["as_split"],
            },
        },
    )


def compare_with_parent(lineage: Lineage, items: list[LabelledItem], fit: Fit, task: Task) -> dict:
    """The new version against its parent on the labelled items the parent served: what the parent
    answered then (its served probabilities) and what the new version answers held out (out of fold)."""
    options = [json.dumps(o) if not isinstance(o, str) else o for o in task.options]
    new = {
        items[i].id: Record(items[i].id, options, P.tolist(), int(label))
        for i, P, label in zip(fit.fit_on, fit.P_oof, fit.y)
    }
    served = {k: Record(k, options, r.probabilities, new[k].label) for k, r in lineage.served.items() if k in new}
    if not served:
        return {"parent": lineage.parent.version_id, "matched": 0}
    return {"parent": lineage.parent.version_id, **compare(served, new, max_flips=10)}


def prediction_rows(items: list[LabelledItem], task: Task, y: np.ndarray, measured: Measured) -> list[dict]:
    """One row per measured item: its label, the calibrated and the raw probabilities."""
    raw_rows = {int(i): row for row, i in enumerate(measured.raw_items)}
    rows = []
    for row, i in enumerate(measured.items):
        raw = measured.P_raw[raw_rows[int(i)]].tolist() if int(i) in raw_rows else None
        rows.append(
            {
                "id": items[i].id,
                "label": int(y[i]),
                "options": [str(o) for o in task.options],
                "probabilities": measured.P[row].tolist(),
                "raw_probabilities": raw,
            }
        )
    return rows


def write_run(result: CalibrationResult, items: list[LabelledItem], out: Path, bins: int) -> None:
    """Plots, the profile, predictions, summary and report."""
    out.mkdir(parents=True, exist_ok=True)
    curves, labels = result.curves
    name = result.summary["task"]["name"]
    reliability_diagram(curves, labels, out / "reliability.png", bins=bins, title=f"Reliability: {name}")
    risk_coverage_plot(curves, labels, out / "risk_coverage.png", threshold_coverage=result.threshold_coverage)
    result.profile.save(out / "profile.json")
    with (out / "predictions.jsonl").open("w", encoding="utf-8") as handle:
        for row in result.predictions:
            handle.write(json.dumps(row) + "\n")
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2, default=float), encoding="utf-8")
    write_html(result.summary, out)


def _headline(m: dict) -> dict:
    return {k: m[k] for k in ("accuracy", "nll", "brier", "ece_width", "ece_mass", "aurc", "part") if k in m}
