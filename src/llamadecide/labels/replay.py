"""A labelled file replayed (the stream simulation's and the labelling orders'): its parts, every
item scored once as a pool, and a refit from the labels so far, certified as `calibrate` does it and
measured on a test part never labelled."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from llamadecide.calibration.backends import Backend
from llamadecide.calibration.cache import ScoreCache
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.selection import apply_variant, fit_variant
from llamadecide.calibration.steps import fit_and_certify
from llamadecide.calibration.variant_scoring import score_variants
from llamadecide.calibration.variants import Variant, VariantScores, demonstration_items
from llamadecide.decisions.maths import confidence
from llamadecide.errors import InvalidRequestError

if TYPE_CHECKING:
    from llamadecide.labels.simulate import SimulationConfig


@dataclass(frozen=True)
class Split:
    test: np.ndarray
    start: np.ndarray
    stream: np.ndarray  # in replay order


def universe(n: int, config: SimulationConfig) -> np.ndarray:
    """The items every replay draws from (scored once): a seeded sample of the file."""
    size = config.start_labels + config.stream + config.test_size
    if size > n or config.start_labels < 2 or config.test_size < 1 or config.stream < 1:
        raise InvalidRequestError(
            f"cannot draw {config.start_labels} start, {config.stream} streamed and {config.test_size} test items "
            f"from {n}"
        )
    return np.sort(np.random.default_rng(config.run.seed).permutation(n)[:size])


def split(items: np.ndarray, config: SimulationConfig, seed: int) -> Split:
    order = np.random.default_rng(seed).permutation(items)
    k, n = config.test_size, config.start_labels
    return Split(np.sort(order[:k]), np.sort(order[k : k + n]), order[k + n : k + n + config.stream])


def score_pool(
    backend: Backend, task: Task, items: list[LabelledItem], used: np.ndarray, run: RunConfig, cache_path: Path
) -> dict[Variant, VariantScores]:
    """Every used item scored once, as a pool is: where the row budget scored a variant's answers on a
    subsample, not every item can be answered with them, so that variant keeps its hidden states only;
    question-first formats zero-shot (demonstrations would come from labels not given yet)."""
    run = dataclasses.replace(run, shots=0, shots_per_class=(0,))
    cache = ScoreCache(cache_path)
    try:
        scored = score_variants(backend, task, items, used, run, cache, pool=used, split_parts=(used,))
    finally:
        cache.close()
    return {
        v: dataclasses.replace(data, hidden_only=True) if data.answered is not None and not data.hidden_only else data
        for v, data in scored.items()
        if not (data.answered is not None and data.hidden is None)
    }


def refit(
    scored: dict[Variant, VariantScores],
    idx: np.ndarray,
    draws: list,
    y: np.ndarray,
    test: np.ndarray,
    run: RunConfig,
) -> tuple:
    """A profile refitted on the labelled items (`calibration.run`'s choose, fit and certify steps),
    and its point: the labels, the certified share and the true precision on the test part. Returns
    also how it answers an item (its probabilities and the action its threshold gives)."""
    order = np.argsort(idx)
    idx, draws = idx[order], [draws[i] for i in order]
    keep = ~np.isin(idx, demonstration_items(scored))
    idx, draws = idx[keep], [d for d, k in zip(draws, keep) if k]
    steps = fit_and_certify(scored, idx, draws, y, run)
    choice, fit, certified, data = steps.choice, steps.fit, steps.certified, steps.data
    threshold = certified.threshold.threshold if certified.threshold else None
    P_test = apply_variant(fit.calibrator, data, test)
    conf_test = confidence(P_test)
    auto = conf_test >= threshold if threshold is not None else np.zeros(len(test), bool)
    correct = P_test.argmax(1) == y[test]
    counts = steps.counts
    point = {
        "labels": int(len(idx)),
        "certify": counts["certify"],
        "train_only": counts["train_only"],
        "method": choice.chosen["label"],
        "threshold": threshold,
        "auto_share": float(auto.mean()),
        "true_precision": float(correct[auto].mean()) if auto.any() else None,
        "test_accuracy": float(correct.mean()),
        "certified_lower_bound": certified.threshold.lower_bound if certified.threshold else None,
    }

    return Refitted(fit.calibrator, data, threshold, OrderingModel(choice.candidate, data, y)), point


@dataclass
class Refitted:
    """A refit as served: an item's probabilities and the action its threshold gives; and the model
    a labelling round reads (`orders.OrderingModel`)."""

    calibrator: object
    data: VariantScores
    threshold: float | None
    model: OrderingModel

    def __call__(self, i: int) -> tuple[np.ndarray, str]:
        P = apply_variant(self.calibrator, self.data, np.array([i]))[0]
        conf = float(confidence(P[None])[0])
        return P, "auto" if self.threshold is not None and conf >= self.threshold else "escalate"


class OrderingModel:
    """The model a round's draw reads: the last refit's chosen method, refitted (without its
    cross-validation) on every label so far."""

    def __init__(self, candidate, data: VariantScores, y: np.ndarray) -> None:
        self.candidate, self.data, self.y = candidate, data, y
        self.calibrator = None

    def refitted(self, idx: np.ndarray) -> OrderingModel:
        fitted = OrderingModel(self.candidate, self.data, self.y)
        fitted.calibrator = fit_variant(self.candidate, self.data, idx, self.y[idx])
        return fitted

    def probabilities(self, pool: np.ndarray) -> np.ndarray:
        return apply_variant(self.calibrator, self.data, pool)


def honesty(replays: list[dict], target: float) -> dict:
    """How often the true precision of automatic decisions on the test part fell below the target,
    over every refit of every replay that certified a threshold."""
    certified = [
        p for r in replays for p in r["points"] if p["threshold"] is not None and p["true_precision"] is not None
    ]
    below = [p for p in certified if p["true_precision"] < target]
    return {
        "certified_refits": len(certified),
        "below_target": len(below),
        "share_below": len(below) / max(len(certified), 1),
    }
