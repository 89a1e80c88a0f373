"""Where to act automatically: the lowest confidence threshold whose auto-handled answers meet a
target precision with a stated confidence, and split-conformal prediction sets."""

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


@dataclass(frozen=True)
class Threshold:
    threshold: float
    target_precision: float
    confidence_level: float
    auto: int  # calibration items at or above the threshold
    precision: float  # their observed precision
    lower_bound: float  # Clopper-Pearson lower bound at confidence_level
    coverage: float  # share of calibration items handled automatically

    def as_dict(self) -> dict:
        return asdict(self)


def smallest_passing_sample(target: float, confidence_level: float) -> int:
    """The fewest items that could clear the target at all (every one correct):
    (1 - confidence)^(1/n) >= target."""
    return int(np.ceil(np.log(1.0 - confidence_level) / np.log(target)))


def select_threshold(conf: np.ndarray, correct: np.ndarray, *, target: float, confidence_level: float,
                     grid: tuple[float, ...] = DEFAULT_GRID, min_auto: int | None = None) -> Threshold | None:
    """Learn-then-Test with fixed-sequence testing. For each threshold t of a fixed grid, from
    strictest to loosest, H_t says "precision of answers with confidence >= t is below target";
    it is rejected when the Clopper-Pearson lower bound clears the target. Testing stops at the
    first non-rejection, which controls the chance of choosing any threshold that misses the
    target at 1 - confidence_level without a multiplicity penalty. Thresholds that auto-handle
    fewer than `min_auto` items (default: twice the smallest sample that could clear the target
    at all) are not tested, since they could only stop the sequence; which ones that is depends on
    the confidences alone, not on the labels, so the error control holds. Returns the loosest
    rejected threshold, or None when even the strictest tested one fails."""
    if min_auto is None:
        min_auto = 2 * smallest_passing_sample(target, confidence_level)
    conf = np.asarray(conf, dtype=float)
    correct = np.asarray(correct, dtype=bool)
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


def evaluate_threshold(conf: np.ndarray, correct: np.ndarray, threshold: float) -> dict:
    mask = np.asarray(conf) >= threshold
    n = int(mask.sum())
    return {"threshold": threshold, "auto": n, "coverage": n / len(conf),
            "precision": float(np.asarray(correct)[mask].mean()) if n else None}


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
    return {"qhat": qhat, "coverage": float(covered.mean()), "mean_set_size": float(sizes.mean()),
            "singleton_rate": float(singleton.mean()), "singleton_precision": precision}
