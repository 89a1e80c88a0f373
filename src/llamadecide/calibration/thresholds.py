"""Where to act automatically: the lowest confidence threshold whose auto-handled answers meet a
target precision with a stated confidence, and split-conformal prediction sets. Items may carry
certification weights (`certification.certification_weights`: the inverse of each item's chance of
having been labelled); items of weight 0 train but never certify."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import beta

DEFAULT_GRID = tuple(round(1.0 - i / 100, 2) + 0.0 for i in range(101))  # 1.00, 0.99, ..., 0.00


def clopper_pearson_lower(successes: int, trials: int, confidence: float) -> float:
    """One-sided exact binomial lower bound: P(true rate >= bound) >= confidence."""
    if trials == 0 or successes == 0:
        return 0.0
    return float(beta.ppf(1.0 - confidence, successes, trials - successes + 1))


def weighted_lower_bound(correct: np.ndarray, weights: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """The precision of a weighted sample, its one-sided lower bound at `confidence` and its effective
    size: Clopper-Pearson at the Kish effective sample size n = (sum w)^2 / sum w^2 with p n successes
    (Korn and Graubard's bound for weighted survey samples). With equal weights it is the exact
    Clopper-Pearson bound of `clopper_pearson_lower`."""
    weights = np.asarray(weights, dtype=float)
    total = float(weights.sum())
    if total <= 0:
        return 0.0, 0.0, 0.0
    precision = float(weights[np.asarray(correct, dtype=bool)].sum()) / total
    n = total**2 / float((weights**2).sum())
    successes = precision * n
    if successes <= 0:
        return precision, 0.0, n
    return precision, float(beta.ppf(1.0 - confidence, successes, n - successes + 1)), n


@dataclass(frozen=True)
class Threshold:
    threshold: float
    target_precision: float
    confidence_level: float
    auto: int  # certifying calibration items at or above the threshold
    precision: float  # their observed (weighted) precision
    lower_bound: float  # Clopper-Pearson lower bound at confidence_level (at the effective size, when weighted)
    coverage: float  # (weighted) share of certifying calibration items handled automatically
    effective_auto: float | None = None  # the Kish effective size of the items at the threshold, when weighted

    def as_dict(self) -> dict:
        return asdict(self)


def smallest_passing_sample(target: float, confidence_level: float) -> int:
    """The fewest items that could clear the target at all (every one correct):
    (1 - confidence)^(1/n) >= target."""
    return int(np.ceil(np.log(1.0 - confidence_level) / np.log(target)))


def fewest_tested(target: float, confidence_level: float) -> int:
    """The fewest automatic items a threshold is tested with by default (`select_threshold`'s
    `min_auto`): twice the smallest sample that could clear the target at all."""
    return 2 * smallest_passing_sample(target, confidence_level)


def select_threshold(
    conf: np.ndarray,
    correct: np.ndarray,
    *,
    target: float,
    confidence_level: float,
    grid: tuple[float, ...] = DEFAULT_GRID,
    min_auto: int | None = None,
    weights: np.ndarray | None = None,
) -> Threshold | None:
    """Learn-then-Test with fixed-sequence testing. For each threshold t of a fixed grid, from
    strictest to loosest, H_t says "precision of answers with confidence >= t is below target";
    it is rejected when the Clopper-Pearson lower bound clears the target. Testing stops at the
    first non-rejection, which controls the chance of choosing any threshold that misses the
    target at 1 - confidence_level without a multiplicity penalty. Thresholds that auto-handle
    fewer than `min_auto` items (default: twice the smallest sample that could clear the target
    at all) are not tested, since they could only stop the sequence; which ones that is depends on
    the confidences alone, not on the labels, so the error control holds. Returns the loosest
    rejected threshold, or None when even the strictest tested one fails. With `weights`, only items
    of positive weight are tested, each counting its weight (`weighted_lower_bound`; `min_auto` is
    then an effective size)."""
    if min_auto is None:
        min_auto = fewest_tested(target, confidence_level)
    conf = np.asarray(conf, dtype=float)
    correct = np.asarray(correct, dtype=bool)
    if weights is not None:
        return _select_weighted(
            conf, correct, np.asarray(weights, dtype=float), target, confidence_level, grid, min_auto
        )
    chosen: Threshold | None = None
    for t in sorted(grid, reverse=True):
        mask = conf >= t
        n = int(mask.sum())
        if n < min_auto:
            continue
        k = int(correct[mask].sum())
        bound = clopper_pearson_lower(k, n, confidence_level)
        if bound < target:
            break
        chosen = Threshold(float(t), target, confidence_level, n, k / n, bound, n / len(conf))
    return chosen


def _select_weighted(
    conf: np.ndarray,
    correct: np.ndarray,
    weights: np.ndarray,
    target: float,
    confidence_level: float,
    grid: tuple[float, ...],
    min_auto: float,
) -> Threshold | None:
    """`select_threshold` on a weighted sample: the same fixed sequence, each test at the effective size."""
    certify = weights > 0
    conf, correct, weights = conf[certify], correct[certify], weights[certify]
    total = float(weights.sum())
    chosen: Threshold | None = None
    for t in sorted(grid, reverse=True):
        mask = conf >= t
        if not mask.any():
            continue
        precision, bound, n = weighted_lower_bound(correct[mask], weights[mask], confidence_level)
        if n < min_auto:
            continue
        if bound < target:
            break
        share = float(weights[mask].sum()) / total
        chosen = Threshold(float(t), target, confidence_level, int(mask.sum()), precision, bound, share, n)
    return chosen


def evaluate_threshold(conf: np.ndarray, correct: np.ndarray, threshold: float) -> dict:
    mask = np.asarray(conf) >= threshold
    n = int(mask.sum())
    return {
        "threshold": threshold,
        "auto": n,
        "coverage": n / len(conf),
        "precision": float(np.asarray(correct)[mask].mean()) if n else None,
    }


def conformal_quantile(P: np.ndarray, y: np.ndarray, alpha: float) -> float:
    """Split conformal: the (1 - alpha) adjusted quantile of the scores 1 - p(gold)."""
    scores = 1.0 - P[np.arange(len(y)), y]
    n = len(scores)
    level = min(1.0, np.ceil((n + 1) * (1 - alpha)) / n)
    return float(np.quantile(scores, level, method="higher"))


def conformal_report(P: np.ndarray, y: np.ndarray, qhat: float) -> dict:
    """Sets {k : p_k >= 1 - qhat}; acting only on singleton sets."""
    sets = P >= 1.0 - qhat
    sizes = sets.sum(1)
    singleton = sizes == 1
    covered = sets[np.arange(len(y)), y]
    precision = float((P.argmax(1)[singleton] == y[singleton]).mean()) if singleton.any() else None
    return {
        "qhat": qhat,
        "coverage": float(covered.mean()),
        "mean_set_size": float(sizes.mean()),
        "singleton_rate": float(singleton.mean()),
        "singleton_precision": precision,
    }


REACHABLE_TARGETS = (0.80, 0.90, 0.95)


def reachable(
    conf: np.ndarray,
    correct: np.ndarray,
    *,
    target: float,
    confidence_level: float,
    targets: tuple[float, ...] = REACHABLE_TARGETS,
    weights: np.ndarray | None = None,
    labels: float | None = None,
) -> dict:
    """What the labelled items support when a target is out of reach: the guaranteed coverage at
    other precisions (each chosen as `select_threshold` would, so each is a guarantee of its own),
    and roughly how many labels the target would need at the precision the most confident answers
    show now (`labels_needed`; None when none of them is above the target: more labels would not
    help). `weights` and `labels` as `labels_needed` takes them."""
    conf = np.asarray(conf, dtype=float)
    correct = np.asarray(correct, dtype=bool)
    at = []
    for goal in sorted({*targets, target}):
        found = select_threshold(conf, correct, target=goal, confidence_level=confidence_level, weights=weights)
        at.append(
            {
                "precision": goal,
                "threshold": found.threshold if found else None,
                "coverage": found.coverage if found else 0.0,
            }
        )
    return {
        "at_precision": at,
        "labels_needed": labels_needed(
            conf, correct, target=target, confidence_level=confidence_level, weights=weights, labels=labels
        ),
    }


def labels_needed(
    conf: np.ndarray,
    correct: np.ndarray,
    *,
    target: float,
    confidence_level: float,
    weights: np.ndarray | None = None,
    labels: float | None = None,
    grid: tuple[float, ...] = DEFAULT_GRID,
    min_items: int = 10,
) -> dict | None:
    """The fewest labels with which some threshold's answers, at their observed precision and at the
    effective items a label gives there now, would clear `target` at `confidence_level` (the bound of
    `select_threshold`), over the thresholds that hold at least `min_items` certifying items now.
    `conf` and `correct` are the certifying items', `weights` their certification weights (items of
    weight 0 do not certify; unequal weights count at their effective size), and `labels` how many
    labels they stand for (default: as many as the items; with half the labels held out to certify,
    twice as many): `labelled` is then labels in all, and `more` beyond `labels`."""
    weights = np.ones(len(conf)) if weights is None else np.asarray(weights, dtype=float)
    certify = weights > 0
    conf = np.asarray(conf, dtype=float)[certify]
    correct = np.asarray(correct, dtype=bool)[certify]
    weights = weights[certify]
    labels = float(len(conf)) if labels is None else float(labels)
    best: dict | None = None
    for t in sorted(grid, reverse=True):
        mask = conf >= t
        if int(mask.sum()) < min_items:
            continue
        precision, _, effective = weighted_lower_bound(correct[mask], weights[mask], confidence_level)
        if precision <= target:
            continue
        auto = _auto_items_needed(precision, target, confidence_level)
        if auto is None:
            continue
        needed = int(np.ceil(auto * labels / effective))
        if best is None or needed < best["labelled"]:
            best = {
                "threshold": float(t),
                "coverage": float(weights[mask].sum() / weights.sum()),
                "observed_precision": precision,
                "labelled": needed,
                "more": max(0, needed - int(round(labels))),
            }
    return best


def _auto_items_needed(precision: float, target: float, confidence_level: float, limit: int = 10**7) -> int | None:
    """Smallest m whose bound at `precision` (rounded down to whole successes) clears `target`."""

    def clears(m: int) -> bool:
        return clopper_pearson_lower(int(np.floor(precision * m)), m, confidence_level) >= target

    high = 1
    while not clears(high):
        high *= 2
        if high > limit:
            return None
    low = high // 2
    while high - low > 1:  # clears(high), and low does not (or is 0)
        middle = (low + high) // 2
        low, high = (low, middle) if clears(middle) else (middle, high)
    return high
