"""One calibration run, as a list of steps (`steps`): split, score every item (cached, resumable),
choose and fit a calibrator on the calibration part, certify a threshold on the items of known
chance, measure the test part; then the summary and the profile, and the files: plots, report,
summary, predictions and profile. Computing (`run_calibration`) stays apart from writing (`write_run`)."""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llamadecide.calibration import metrics
from llamadecide.calibration.backends import Backend
from llamadecide.calibration.calibrators import Calibrator
from llamadecide.calibration.compare import Record, compare
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.fitting import Candidate
from llamadecide.calibration.plots import reliability_diagram, risk_coverage_plot
from llamadecide.calibration.profile import PROFILE_FILE, CalibrationProfile, DemonstrationParams, method_fields
from llamadecide.calibration.report import write_html
from llamadecide.calibration.selection import public, usable
from llamadecide.calibration.steps import (
    Certified,
    Choice,
    Evidence,
    Fit,
    Measured,
    fit_and_certify,
    measure,
    score_items,
    split,
)
from llamadecide.calibration.thresholds import (
    Threshold,
)
from llamadecide.calibration.variants import Variant, VariantScores, demonstration_items
from llamadecide.errors import InvalidRequestError

UNCERTIFIED_FILE = "profile.uncertified.json"  # a refit that certifies nothing where its parent did: not served


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
    draws = [items[i].draws for i in cal_idx]

    def rescore(choice: Choice) -> dict:
        """The test part's answers, where scoring waited on a choice that reads them."""
        if scored[choice.variant].answered is None or not choice.candidate.reads_answers:
            return scored
        rescored, more = score_items(backend, task, items, parts, y, config, deferred=False)
        scoring.update(seconds=scoring["seconds"] + more["seconds"], plan=more["plan"])
        return rescored

    # Out-of-fold probabilities compare a refit with its parent.
    steps = fit_and_certify(scored, cal_idx, draws, y, config, rescore=rescore, out_of_fold=lineage is not None)
    scored, choice, fit, found, certified = steps.scored, steps.choice, steps.fit, steps.found, steps.certified
    measured = measure(scored, choice, fit, found, (cal_idx, test_idx), y, certified, config.conformal_alpha)
    summary = summarise(backend, task, config, scored, choice, fit, certified, measured, (cal_idx, test_idx), y)
    summary["certification"] = steps.counts
    summary["split"]["items"] = len(items)  # with the sizes as split, `split` gives the parts back
    summary["split"]["as_split"] = {"calibration": int(len(parts[0])), "test": int(len(parts[1]))}
    profile = build_profile(summary, config, choice, fit, scored[choice.variant], certified.threshold, lineage)
    summary["profile"] = {
        "name": profile.name,
        "version": profile.version,
        "parent": profile.parent,
        "file": profile_file(profile, lineage),
    }
    if lineage is not None:
        summary["parent"] = compare_with_parent(lineage, items, fit, found, task)
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


def profile_file(profile: CalibrationProfile, lineage: Lineage | None) -> str:
    """Where the profile is written: profile.json, which a server reading the folder takes in, unless
    it is a refit that certifies no threshold where its parent served one. That version would send
    every decision to review, so the parent stays served and the new version waits beside it, under
    a name no server reads (rename it to profile.json to serve it all the same)."""
    if lineage is not None and profile.threshold is None and lineage.parent.threshold is not None:
        return UNCERTIFIED_FILE
    return PROFILE_FILE


def compare_with_parent(lineage: Lineage, items: list[LabelledItem], fit: Fit, found: Evidence, task: Task) -> dict:
    """The new version against its parent on the labelled items the parent served: what the parent
    answered then (its served probabilities) and what the new version answers on items it did not
    fit (out of fold for those it fitted, its own probabilities for those held out to certify)."""
    options = [json.dumps(o) if not isinstance(o, str) else o for o in task.options]
    answered = [(fit.fit_on, fit.P_oof, fit.y)] + (
        [(found.items, found.P, found.y)] if found.part == "held out" else []
    )
    new = {
        items[i].id: Record(items[i].id, options, P.tolist(), int(label))
        for idx, probabilities, labels in answered
        for i, P, label in zip(idx, probabilities, labels)
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
    result.profile.save(out / result.summary["profile"]["file"])
    with (out / "predictions.jsonl").open("w", encoding="utf-8") as handle:
        for row in result.predictions:
            handle.write(json.dumps(row) + "\n")
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2, default=float), encoding="utf-8")
    write_html(result.summary, out)


def _headline(m: dict) -> dict:
    return {k: m[k] for k in ("accuracy", "nll", "brier", "ece_width", "ece_mass", "aurc", "part") if k in m}
