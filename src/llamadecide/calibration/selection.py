"""Choosing how a task is best answered: every (variant, candidate) cross-validated on the same
folds of the calibration part, the simplest within one standard error of the best kept, and the
chosen one fitted, applied and measured out of fold."""

from __future__ import annotations

import numpy as np

from llamadecide.calibration.calibrators import Calibrator, CrossFitted, HeadCalibrator
from llamadecide.calibration.cross_validation import cross_validated, held_out_figures, in_parallel, pooled
from llamadecide.calibration.fitting import (
    Candidate,
    candidates,
    content_free_prior_for,
    fit_candidate,
)
from llamadecide.calibration.folds import certification_folds, splitter
from llamadecide.calibration.variants import Variant, VariantScores


def usable(data: VariantScores, candidate: Candidate, idx: np.ndarray) -> np.ndarray:
    """Of these items, those a candidate has what it reads for: its variant's answer scores, or, for a
    head on the hidden state alone, the hidden state (`VariantScores.answered`, `has_hidden`)."""
    if candidate.reads_answers:
        mask = data.answered
    else:
        mask = data.has_hidden if data.has_hidden is not None else data.answered
    return idx if mask is None else idx[mask[idx]]


def select(
    scored: dict[Variant, VariantScores], cal_idx: np.ndarray, y_cal: np.ndarray, *, seed: int = 0
) -> tuple[list[dict], dict[str, tuple[Variant, Candidate]]]:
    """Cross-validated NLL and accuracy of every (variant, candidate) on the calibration part, every
    one measured on the same held-out folds: of the items every variant has answer scores for (all of
    them unless the run's budget scored answers on a subsample), each candidate fitted on the other
    items it has what it reads for (a head on the hidden state alone: every item). When answers were
    scored on a subsample and every candidate reading them is behind (`answers_behind`), those are
    marked `behind` and the others measured again on every calibration item they have."""
    y_of = {int(i): int(y) for i, y in zip(cal_idx, y_cal)}
    common = cal_idx
    for data in scored.values():
        if data.answered is not None and not data.hidden_only:
            common = common[data.answered[common]]
    results: list[dict] = []
    fitted: dict[str, tuple[Variant, Candidate]] = {}
    for variant, data in scored.items():
        for candidate in candidates(
            data.lengths is not None,
            has_prior=data.content_free is not None,
            has_hidden=data.hidden is not None,
            has_texts=data.texts is not None,
        ):
            if data.hidden_only and candidate.reads_answers:
                continue  # no answer was scored under this prompt format
            prior = content_free_prior_for(candidate, *(data.content_free or (None, None)))
            fit_on = usable(data, candidate, cal_idx)
            cv = _cross_validated(data, candidate, common, fit_on, y_of, prior, seed)
            label = f"{variant.label}, {candidate.label}"
            fitted[label] = (variant, candidate)
            results.append(
                {
                    "mode": variant.mode,
                    "rotations": variant.rotations,
                    "shots": variant.shots,
                    "prompt_format": variant.prompt_format,
                    "method": candidate.method,
                    "kind": candidate.kind,
                    "lexical": candidate.lexical,
                    "features": candidate.features,
                    "fit": candidate.fit,
                    "reads_answers": candidate.reads_answers,
                    "length_normalize": candidate.length_normalize,
                    "prior_correction": candidate.prior_correction,
                    "label": label,
                    "cv_nll": cv["nll"],
                    "cv_nll_se": cv["nll_se"],
                    "cv_accuracy": cv["accuracy"],
                    "cv_items": cv["items"],
                    "fit_items": int(len(fit_on)),
                    "served_rows": served_rows(data, candidate),
                    "complexity": list(complexity(variant, candidate, served_rows(data, candidate))),
                    "cv_losses": cv["losses"],
                }
            )
    if len(common) < len(cal_idx) and answers_behind(results):
        # The candidates that read answers are out of the running on the items with answers; the rest
        # are compared on every calibration item they have what they read for.
        for r in results:
            if r["reads_answers"]:
                r["behind"] = True
            else:
                variant, candidate = fitted[r["label"]]
                fit_on = usable(scored[variant], candidate, cal_idx)
                cv = _out_of_fold_figures(scored[variant], candidate, fit_on, fit_on, y_of, seed)
                r.update(cv_nll=cv["nll"], cv_nll_se=cv["nll_se"], cv_accuracy=cv["accuracy"])
                r.update(cv_items=cv["items"], cv_losses=cv["losses"])
    return results, fitted


BEHIND_BY = 3.0  # standard errors of the item-by-item difference


def answers_behind(results: list[dict]) -> bool:
    """Whether every candidate that reads answers is behind the best candidate that reads none by more
    than `BEHIND_BY` standard errors of their item-by-item difference, on the items both were measured
    on: scoring more answers (the dearest rows of a many-option task) would not change the choice."""
    free = [r for r in results if not r["reads_answers"]]
    readers = [r for r in results if r["reads_answers"]]
    if not free or not readers:
        return False
    best = min(free, key=lambda r: r["cv_nll"])
    return all(r["cv_nll"] - best["cv_nll"] > BEHIND_BY * _difference_se(r, best) for r in readers)


def _out_of_fold_figures(
    data: VariantScores, candidate: Candidate, held_out: np.ndarray, fit_on: np.ndarray, y_of: dict[int, int], seed: int
) -> dict:
    """`out_of_fold` over `fit_on`, measured on its items in `held_out`."""
    P = out_of_fold(candidate, data, fit_on, np.array([y_of[int(i)] for i in fit_on]), seed=seed)
    position = {int(i): row for row, i in enumerate(fit_on)}
    y_held = np.array([y_of[int(i)] for i in held_out])
    everything = (np.array([], dtype=int), np.arange(len(held_out)))
    return pooled([everything], [held_out_figures(P[[position[int(i)] for i in held_out]], y_held)])


def _cross_validated(
    data: VariantScores,
    candidate: Candidate,
    held_out: np.ndarray,
    fit_on: np.ndarray,
    y_of: dict[int, int],
    prior,
    seed: int,
) -> dict:
    """5-fold cross-validation whose held-out folds split `held_out`; each fold fitted on the items of
    `fit_on` outside it (when both are the calibration part: plain cross-validation). A candidate
    that has what it reads for every held-out item (a head on the hidden state alone, when answers
    were scored on a subsample) is cross-validated on folds of all its items and measured on the
    held-out ones: those folds are `out_of_fold`'s, so the chosen candidate's are not fitted twice."""
    y_held = np.array([y_of[int(i)] for i in held_out])
    if not np.array_equal(held_out, fit_on) and np.isin(held_out, fit_on).all():
        return _out_of_fold_figures(data, candidate, held_out, fit_on, y_of, seed)
    if np.array_equal(held_out, fit_on):
        return cross_validated(
            data.L[held_out],
            None if data.lengths is None else data.lengths[held_out],
            y_held,
            candidate,
            prior=prior,
            hidden=None if data.hidden is None else data.hidden[held_out],
            texts=_texts(data, held_out),
            seed=seed,
        )

    def fold(split: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        held = split[1]
        train = np.setdiff1d(fit_on, held_out[held])
        calibrator = fit_candidate(
            candidate,
            data.L[train],
            None if data.lengths is None else data.lengths[train],
            np.array([y_of[int(i)] for i in train]),
            prior=prior,
            hidden=None if data.hidden is None else data.hidden[train],
            texts=_texts(data, train),
        )
        P = apply_variant(calibrator, data, held_out[held])
        return held_out_figures(P, y_held[held])

    splits = list(splitter(data.L[held_out], y_held, 5, seed))
    return pooled(splits, in_parallel(fold, splits))


KIND_RANK = {"none": 0, "temperature": 1, "temperature+bias": 2, "head": 3}


def served_rows(data: VariantScores, candidate: Candidate) -> float | None:
    """What serving the candidate costs per decision, in weighted evaluated rows: its prompt alone for a
    head on the hidden state alone, else the prompt and every answer. None when the backend cannot tell."""
    if data.served_rows is None:
        return None
    answers, hidden = data.served_rows
    return float(answers if candidate.reads_answers else hidden)


def complexity(variant: Variant, candidate: Candidate, cost: float | None = None) -> tuple:
    """How much a candidate fits and costs, simplest first: fewer fitted parameters (no calibrator,
    a temperature, a bias per option, a head; no lexical expert), then the cheaper to serve (weighted
    rows per decision, in steps of a tenth: a cheaper head prompt is preferred when its NLL is within
    one standard error), fewer demonstrations and rotations, no prior correction or length
    normalisation; among heads, the one that reads the hidden state alone (it also scores no answer
    when served); a stronger penalty."""
    cost_step = 0 if not cost else round(float(np.log(cost) / np.log(1.1)))
    return (
        KIND_RANK[candidate.kind],
        # A class-means head is a fallback for few labels: any logistic head within one standard
        # error comes first (on AG News with 300 labels it was, and did better on the test part).
        int(candidate.fit == "class-means"),
        int(candidate.lexical),
        cost_step,
        variant.shots,
        variant.rotations,
        int(candidate.prior_correction),
        int(candidate.length_normalize),
        int(candidate.reads_answers),
        candidate.C,
    )


def choose(results: list[dict]) -> tuple[dict, dict]:
    """The simplest candidate whose cross-validated NLL is within one standard error of the lowest
    (the one-standard-error rule): with many candidates the lowest is partly luck, and the luck
    favours those that fit more. Every candidate is measured on the same held-out items, so the
    standard error is that of the item-by-item difference from the lowest (the spread of a single
    candidate's losses over items is mostly the items' difficulty, shared by every candidate, and
    would let far worse candidates through). Candidates `select` left behind are out of the running.
    Returns it and how it was chosen."""
    running = [r for r in results if not r.get("behind")]
    best = min(running, key=lambda r: r["cv_nll"])
    eligible = [r for r in running if r["cv_nll"] - best["cv_nll"] <= _difference_se(r, best)]
    chosen = min(eligible, key=lambda r: (tuple(r["complexity"]), r["cv_nll"]))
    return chosen, {
        "rule": "the simplest candidate within one standard error (of the item-by-item difference) "
        "of the lowest cross-validated NLL",
        "lowest": {"label": best["label"], "cv_nll": best["cv_nll"], "cv_nll_se": best["cv_nll_se"]},
        "within_one_se": len(eligible),
        "compared": len(results),
        "behind": len(results) - len(running),  # read answers, left behind on the items with them
        "behind_by": BEHIND_BY,
        "items": sorted({r["cv_items"] for r in results}),
    }


def _difference_se(result: dict, best: dict) -> float:
    a, b = result.get("cv_losses"), best.get("cv_losses")
    if a is None or b is None or len(a) != len(b) or len(a) < 2:
        return best["cv_nll_se"]
    difference = np.asarray(a) - np.asarray(b)
    return float(difference.std(ddof=1) / np.sqrt(len(difference)))


def public(result: dict) -> dict:
    """A candidate's figures as reports keep them (without its per-item losses)."""
    return {k: v for k, v in result.items() if k != "cv_losses"}


def fit_variant(
    candidate: Candidate, data: VariantScores, idx: np.ndarray, y: np.ndarray
) -> Calibrator | HeadCalibrator:
    prior = content_free_prior_for(candidate, *(data.content_free or (None, None)))
    return fit_candidate(
        candidate,
        data.L[idx],
        None if data.lengths is None else data.lengths[idx],
        y,
        prior=prior,
        hidden=None if data.hidden is None else data.hidden[idx],
        texts=_texts(data, idx),
    )


def out_of_fold(
    candidate: Candidate,
    data: VariantScores,
    cal_idx: np.ndarray,
    y_cal: np.ndarray,
    *,
    folds: int = 5,
    seed: int = 0,
    certifying: bool = False,
) -> np.ndarray:
    """Each calibration item's probabilities from a calibrator fitted on the other folds: the
    selection's stratified folds, or, `certifying`, folds that ignore the labels
    (`folds.certification_folds`: stratified ones make the held-out precision optimistic)."""
    P = np.zeros((len(cal_idx), data.L.shape[1]))
    if certifying:
        splits = certification_folds(len(cal_idx), folds, seed)
    else:
        splits = list(splitter(data.L[cal_idx], y_cal, folds, seed))
    fitted = in_parallel(lambda split: fit_variant(candidate, data, cal_idx[split[0]], y_cal[split[0]]), splits)
    for (_, held), calibrator in zip(splits, fitted):
        P[held] = apply_variant(calibrator, data, cal_idx[held])
    return P


def cross_fit(
    candidate: Candidate, data: VariantScores, cal_idx: np.ndarray, y_cal: np.ndarray, folds: int
) -> CrossFitted:
    """One calibrator per fold, each fitted on the items the other folds answer (`VariantScores.routes`):
    each item's probabilities from it are out of fold and the ones served."""
    routes = data.routes(cal_idx, folds)
    fitted = in_parallel(lambda k: fit_variant(candidate, data, cal_idx[routes != k], y_cal[routes != k]), range(folds))
    return CrossFitted(tuple(fitted))


def apply_variant(
    calibrator: Calibrator | HeadCalibrator | CrossFitted, data: VariantScores, idx: np.ndarray
) -> np.ndarray:
    """The calibrator's probabilities for the items `idx`, as served (a cross-fitted one's from each
    item's fold)."""
    parts = (
        data.L[idx],
        None if data.lengths is None else data.lengths[idx],
        None if data.hidden is None else data.hidden[idx],
        _texts(data, idx),
    )
    if isinstance(calibrator, CrossFitted):
        return calibrator.apply(*parts, routes=data.routes(idx, len(calibrator.folds)))
    return calibrator.apply(*parts)


def _texts(data: VariantScores, idx: np.ndarray) -> list[str] | None:
    return None if data.texts is None else [data.texts[i] for i in idx]
