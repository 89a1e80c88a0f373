"""Choosing how a task is best answered: every (variant, candidate) cross-validated on the same
folds of the calibration part, the simplest within one standard error of the best kept, and the
chosen one fitted, applied and measured out of fold."""

from __future__ import annotations

import numpy as np

from llamadecide.calibration.fitting import (Calibrator, Candidate, HeadCalibrator, candidates, content_free_prior_for,
                                             cross_validated, fit_candidate, splitter)
from llamadecide.calibration.variants import Variant, VariantScores
from llamadecide.decisions.maths import HIDDEN_ONLY


def select(scored: dict[Variant, VariantScores], cal_idx: np.ndarray, y_cal: np.ndarray, *,
           seed: int = 0) -> tuple[list[dict], dict[str, tuple[Variant, Candidate]]]:
    """Cross-validated NLL and accuracy of every (variant, candidate) on the calibration part."""
    results: list[dict] = []
    fitted: dict[str, tuple[Variant, Candidate]] = {}
    for variant, data in scored.items():
        lengths = None if data.lengths is None else data.lengths[cal_idx]
        hidden = None if data.hidden is None else data.hidden[cal_idx]
        texts = _texts(data, cal_idx)
        for candidate in candidates(data.lengths is not None, has_prior=data.content_free is not None,
                                    has_hidden=data.hidden is not None, has_texts=texts is not None):
            prior = content_free_prior_for(candidate, *(data.content_free or (None, None)))
            cv = cross_validated(data.L[cal_idx], lengths, y_cal, candidate, prior=prior, hidden=hidden, texts=texts,
                                 seed=seed)
            label = f"{variant.label}, {candidate.label}"
            fitted[label] = (variant, candidate)
            results.append({"mode": variant.mode, "rotations": variant.rotations, "shots": variant.shots,
                            "layout": variant.layout,
                            "method": candidate.method,
                            "kind": candidate.kind, "lexical": candidate.lexical, "features": candidate.features,
                            "length_normalize": candidate.length_normalize,
                            "prior_correction": candidate.prior_correction, "label": label,
                            "cv_nll": cv["nll"], "cv_nll_se": cv["nll_se"], "cv_accuracy": cv["accuracy"],
                            "cv_items": cv["items"], "complexity": list(complexity(variant, candidate))})
    return results, fitted


KIND_RANK = {"none": 0, "temperature": 1, "temperature+bias": 2, "head": 3}


def complexity(variant: Variant, candidate: Candidate) -> tuple:
    """How much a candidate fits and shows, simplest first: fewer fitted parameters (no calibrator,
    a temperature, a bias per option, a head; no lexical expert; a stronger penalty), fewer
    demonstrations and rotations, no prior correction or length normalisation; among heads, the one
    that reads the hidden state alone (it also scores no answer when served)."""
    return (KIND_RANK[candidate.kind], int(candidate.lexical), variant.shots, variant.rotations,
            int(candidate.prior_correction), int(candidate.length_normalize),
            0 if candidate.features == HIDDEN_ONLY else 1, candidate.C)


def choose(results: list[dict]) -> tuple[dict, dict]:
    """The simplest candidate whose cross-validated NLL is within one standard error of the lowest
    (the one-standard-error rule): with many candidates the lowest is partly luck, and the luck
    favours those that fit more. Returns it and how it was chosen."""
    best = min(results, key=lambda r: r["cv_nll"])
    margin = best["cv_nll"] + best["cv_nll_se"]
    eligible = [r for r in results if r["cv_nll"] <= margin]
    chosen = min(eligible, key=lambda r: (tuple(r["complexity"]), r["cv_nll"]))
    return chosen, {"rule": "the simplest candidate within one standard error of the lowest cross-validated NLL",
                    "lowest": {"label": best["label"], "cv_nll": best["cv_nll"], "cv_nll_se": best["cv_nll_se"]},
                    "within_one_se": len(eligible), "compared": len(results),
                    "items": sorted({r["cv_items"] for r in results})}


def fit_variant(candidate: Candidate, data: VariantScores, idx: np.ndarray, y: np.ndarray) -> Calibrator | HeadCalibrator:
    prior = content_free_prior_for(candidate, *(data.content_free or (None, None)))
    return fit_candidate(candidate, data.L[idx], None if data.lengths is None else data.lengths[idx], y, prior=prior,
                         hidden=None if data.hidden is None else data.hidden[idx], texts=_texts(data, idx))


def out_of_fold(candidate: Candidate, data: VariantScores, cal_idx: np.ndarray, y_cal: np.ndarray, *,
                folds: int = 5, seed: int = 0) -> np.ndarray:
    """Each calibration item's probabilities from a calibrator fitted on the other folds."""
    P = np.zeros((len(cal_idx), data.L.shape[1]))
    for train, held in splitter(data.L[cal_idx], y_cal, folds, seed):
        calibrator = fit_variant(candidate, data, cal_idx[train], y_cal[train])
        P[held] = apply_variant(calibrator, data, cal_idx[held])
    return P


def apply_variant(calibrator: Calibrator | HeadCalibrator, data: VariantScores, idx: np.ndarray) -> np.ndarray:
    return calibrator.apply(data.L[idx], None if data.lengths is None else data.lengths[idx],
                            None if data.hidden is None else data.hidden[idx], _texts(data, idx))


def _texts(data: VariantScores, idx: np.ndarray) -> list[str] | None:
    return None if data.texts is None else [data.texts[i] for i in idx]
