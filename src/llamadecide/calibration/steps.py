"""The steps of a calibration run, each taking and returning values: split the items, score them
(cached, resumable), hold a share of the items of known chance out to certify on, choose a method by
cross-validation on the rest, fit it, certify a threshold on the held-out items with the fitted
model's own probabilities, measure the test part. `run.run_calibration` calls them in order, the
middle four as one (`fit_and_certify`), which the label replays (`labels.replay`) and the labelling
session (`labels.labelling`) call on cached scores."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamadecide.calibration.backends import Backend
from llamadecide.calibration.cache import ScoreCache
from llamadecide.calibration.calibrators import Calibrator, CrossFitted, HeadCalibrator
from llamadecide.calibration.certification import (
    Draws,
    certification_weights,
)
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.cross_validation import one_blas_thread
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.fitting import Candidate
from llamadecide.calibration.holdout import HoldOut, cross_fitting, held_out_counts, hold_out
from llamadecide.calibration.selection import (
    apply_variant,
    choose,
    cross_fit,
    fit_variant,
    out_of_fold,
    select,
    usable,
)
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


def split(n: int, calibration_size: int | None, test_size: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded disjoint calibration and test indices (a test size of 0: measured out of fold)."""
    cal = calibration_size if calibration_size is not None else max(2, n // 3)
    test = test_size if test_size is not None else n - cal
    if cal < 2 or test < 0 or cal + test > n:
        raise InvalidRequestError(f"cannot split {n} items into {cal} calibration and {test} test items")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[:cal]), np.sort(order[cal : cal + test])


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
    calibrator: Calibrator | HeadCalibrator | CrossFitted
    fit_on: np.ndarray  # the calibration items it has what it reads for
    y: np.ndarray  # their labels
    P: np.ndarray  # its probabilities on them (in sample; cross-fitted, out of fold)
    P_oof: np.ndarray | None  # their out-of-fold probabilities (when asked for; cross-fitted, P)


def fit_method(
    data: VariantScores,
    candidate: Candidate,
    cal_idx: np.ndarray,
    y: np.ndarray,
    config: RunConfig,
    *,
    with_out_of_fold: bool = True,
    cross_fitted: bool = False,
) -> Fit:
    """The chosen candidate fitted on the calibration items it has what it reads for (all of them,
    unless the run's budget scored answers on a subsample), and, `with_out_of_fold`, its out-of-fold
    probabilities: a fitted calibrator is over-confident on the very items it was fitted on. Their
    folds ignore the labels (`folds.certification_folds`), unlike the selection's. `cross_fitted`:
    `config.cross_fit` calibrators, one per fold of the items' routes (`selection.cross_fit`), whose
    probabilities for each item are out of fold and the served ones."""
    fit_on = usable(data, candidate, cal_idx)
    if cross_fitted:
        folded = cross_fit(candidate, data, fit_on, y[fit_on], config.cross_fit)
        P = apply_variant(folded, data, fit_on)
        return Fit(candidate, folded, fit_on, y[fit_on], P, P)
    with one_blas_thread():
        calibrator = fit_variant(candidate, data, fit_on, y[fit_on])
    P = apply_variant(calibrator, data, fit_on)
    P_oof = (
        out_of_fold(candidate, data, fit_on, y[fit_on], seed=config.seed, certifying=True) if with_out_of_fold else None
    )
    return Fit(candidate, calibrator, fit_on, y[fit_on], P, P_oof)


# -- certifying --------------------------------------------------------------------------------------


@dataclass
class Evidence:
    """What a threshold is certified on: probabilities, labels and weights of the certifying items."""

    items: np.ndarray  # which items (indices into the run's items)
    P: np.ndarray
    y: np.ndarray
    weights: np.ndarray  # `certification.certification_weights`: 0 for an item that only trains
    part: str  # "held out" or "cross-fitted" (the served model's probabilities), or "out of fold"


def evidence(
    data: VariantScores,
    fit: Fit,
    y: np.ndarray,
    held_idx: np.ndarray,
    held_draws: Sequence[Draws],
    fit_draws: Sequence[Draws],
) -> Evidence:
    """The held-out items the fitted model reads, with its probabilities for them; with none held
    out, every fitted item's out-of-fold probabilities (cross-fitted: the served ones). `y` holds
    every item's label, `held_draws` follow `held_idx` (with their chance of being held out:
    `HoldOut.draws`), `fit_draws` follow `fit.fit_on`."""
    if not len(held_idx):
        if fit.P_oof is None:
            raise ValueError("nothing held out and no out-of-fold probabilities to certify on")
        part = "cross-fitted" if isinstance(fit.calibrator, CrossFitted) else "out of fold"
        return Evidence(fit.fit_on, fit.P_oof, fit.y, certification_weights(list(fit_draws)), part)
    reads = np.isin(held_idx, usable(data, fit.candidate, held_idx))
    items = held_idx[reads]
    draws = [d for d, r in zip(held_draws, reads) if r]
    P = apply_variant(fit.calibrator, data, items)
    return Evidence(items, P, y[items], certification_weights(draws), "held out")


@dataclass
class Certified:
    threshold: Threshold | None
    reachable: dict
    qhat: float


def certify(found: Evidence, config: RunConfig, labels: int | None = None) -> Certified:
    """The loosest threshold whose automatic answers clear the target precision at the confidence
    level, on the certifying items (each with its weight), what the items support when none does,
    and the conformal quantile. Where a share was to be held out and too few items were to hold
    (`hold_out`), out-of-fold probabilities say what is reachable but certify nothing. `labels`: how
    many labels the run had (default: the certifying items), so that the labels the target needs are
    counted in labels, of which only the held-out share certifies."""
    P, y, weights = found.P, found.y, found.weights
    conf, correct = confidence(P), P.argmax(1) == y
    uniform = bool(np.all(weights == 1.0))
    threshold = (
        select_threshold(
            conf,
            correct,
            target=config.target_precision,
            confidence_level=config.confidence_level,
            weights=None if uniform else weights,
        )
        if found.part in ("held out", "cross-fitted") or config.certify_share == 0
        else None
    )
    if labels is not None and found.part == "out of fold" and config.certify_share > 0:
        labels = labels / config.certify_share  # every label reads out of fold now; a share will certify
    supported = reachable(
        conf,
        correct,
        target=config.target_precision,
        confidence_level=config.confidence_level,
        weights=None if uniform else weights,
        labels=labels,
    )
    return Certified(threshold, supported, conformal_quantile(P, y, config.conformal_alpha))


# -- the steps together -----------------------------------------------------------------------------


@dataclass
class Calibrated:
    """What the steps from labelled items to a certified threshold give."""

    scored: dict[Variant, VariantScores]  # as the choice left them (`rescore`)
    split: HoldOut
    choice: Choice
    fit: Fit
    found: Evidence
    certified: Certified
    counts: dict  # `held_out_counts`, and the folds cross-fitted (0: none)

    @property
    def data(self) -> VariantScores:
        return self.scored[self.choice.variant]


def fit_and_certify(
    scored: dict[Variant, VariantScores],
    idx: np.ndarray,
    draws: Sequence[Draws],
    y: np.ndarray,
    config: RunConfig,
    *,
    rescore: Callable[[Choice], dict[Variant, VariantScores]] | None = None,
    out_of_fold: bool = False,
) -> Calibrated:
    """Hold out, choose on the rest, fit, certify on the held-out items (cross-fitted: hold nothing
    out, choose on every label, fit one calibration per fold, certify on every label with the
    probabilities served for it). `draws` follow `idx` (the
    labelled items, demonstrations excluded); `y` holds every item's label. `rescore`: the scores
    again once the choice is known (calibrate scores the test part's answers only for a candidate
    that reads them). `out_of_fold`: out-of-fold probabilities even where items are held out (a
    refit compares itself with its parent on them)."""
    split = hold_out(draws, config)
    train = idx[~split.held]
    choice = choose_method(scored, train, y, config)
    if rescore is not None:
        scored = rescore(choice)
    data = scored[choice.variant]
    fit = fit_method(
        data,
        choice.candidate,
        train,
        y,
        config,
        with_out_of_fold=out_of_fold or not split.held.any(),
        cross_fitted=cross_fitting(draws, config),
    )
    position = {int(i): n for n, i in enumerate(idx)}
    found = evidence(data, fit, y, idx[split.held], split.draws(draws), [draws[position[int(i)]] for i in fit.fit_on])
    certified = certify(found, config, labels=len(idx))
    folds = len(fit.calibrator.folds) if isinstance(fit.calibrator, CrossFitted) else 0
    counts = {**held_out_counts(draws, split), "cross_fitted": folds}
    return Calibrated(scored, split, choice, fit, found, certified, counts)


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
    part: str  # test, or (no test part) the certifying items': "held out" or "out of fold"
    threshold: dict | None  # the certified threshold's figures on them
    conformal: dict


def measure(
    scored: dict[Variant, VariantScores],
    choice: Choice,
    fit: Fit,
    found: Evidence,
    parts: tuple[np.ndarray, np.ndarray],
    y: np.ndarray,
    certified: Certified,
    alpha: float,
) -> Measured:
    """The chosen calibrator, its threshold and conformal sets, and the raw answers on the test part;
    with no test part, the certifying items' probabilities stand in (said as such: held out, or out
    of fold)."""
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
        items, P, part = found.items, found.P, found.part
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
