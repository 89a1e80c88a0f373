"""Metrics of probabilistic classifiers, as pure functions of P (n x K probabilities) and
y (n gold indices). Confidence for ECE and reliability is the top probability."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from sklearn.metrics import accuracy_score, log_loss

EPS = 1e-12


def accuracy(P: np.ndarray, y: np.ndarray) -> float:
    return float(accuracy_score(y, P.argmax(1)))


def nll(P: np.ndarray, y: np.ndarray) -> float:
    return float(log_loss(y, np.clip(P, EPS, 1.0), labels=np.arange(P.shape[1])))


def brier(P: np.ndarray, y: np.ndarray) -> float:
    """Multi-class Brier score: mean over items of sum_k (p_k - [y = k])^2 (0 best, 2 worst)."""
    onehot = np.eye(P.shape[1])[y]
    return float(((P - onehot) ** 2).sum(1).mean())


@dataclass(frozen=True)
class Bin:
    lower: float
    upper: float
    count: int
    confidence: float  # mean top probability in the bin
    accuracy: float


def reliability(
    conf: np.ndarray, correct: np.ndarray, bins: int = 15, strategy: Literal["width", "mass"] = "width"
) -> list[Bin]:
    """Bins of confidence: equal width on [0, 1], or equal mass (quantiles, about n/bins items each)."""
    conf = np.asarray(conf, dtype=float)
    correct = np.asarray(correct, dtype=float)
    if strategy == "width":
        edges = np.linspace(0.0, 1.0, bins + 1)
        index = np.clip(np.digitize(conf, edges[1:-1], right=True), 0, bins - 1)
    else:
        order = np.argsort(conf, kind="stable")
        index = np.empty(len(conf), dtype=int)
        index[order] = np.arange(len(conf)) * bins // max(len(conf), 1)
        edges = None
    out = []
    for b in range(bins):
        mask = index == b
        if not mask.any():
            continue
        lower = edges[b] if edges is not None else float(conf[mask].min())
        upper = edges[b + 1] if edges is not None else float(conf[mask].max())
        out.append(
            Bin(float(lower), float(upper), int(mask.sum()), float(conf[mask].mean()), float(correct[mask].mean()))
        )
    return out


def ece_from_conf(
    conf: np.ndarray, correct: np.ndarray, bins: int = 15, strategy: Literal["width", "mass"] = "width"
) -> float:
    n = len(conf)
    return float(sum(b.count / n * abs(b.accuracy - b.confidence) for b in reliability(conf, correct, bins, strategy)))


def ece(P: np.ndarray, y: np.ndarray, bins: int = 15, strategy: Literal["width", "mass"] = "width") -> float:
    """Expected calibration error of the top probability."""
    return ece_from_conf(P.max(1), P.argmax(1) == y, bins, strategy)


def per_class_ece(P: np.ndarray, y: np.ndarray, bins: int = 15) -> list[float]:
    """One-vs-rest ECE of each class's probability against whether the item is of that class."""
    return [ece_from_conf(P[:, k], y == k, bins, "width") for k in range(P.shape[1])]


def bootstrap_interval(
    metric: Callable[[np.ndarray, np.ndarray], float],
    P: np.ndarray,
    y: np.ndarray,
    *,
    rounds: int = 200,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of a metric, resampling items."""
    rng = np.random.default_rng(seed)
    n = len(y)
    values = [metric(P[idx], y[idx]) for idx in (rng.integers(0, n, n) for _ in range(rounds))]
    tail = (1 - level) / 2
    return float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))


def risk_coverage(conf: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Answering only the most confident items first: coverage k/n and error rate among them."""
    order = np.argsort(-np.asarray(conf), kind="stable")
    errors = np.cumsum(~np.asarray(correct, dtype=bool)[order])
    k = np.arange(1, len(order) + 1)
    return k / len(order), errors / k


def aurc(conf: np.ndarray, correct: np.ndarray) -> float:
    """Area under the risk-coverage curve (mean risk over coverage levels; lower is better)."""
    _, risk = risk_coverage(conf, correct)
    return float(risk.mean())


def summary(P: np.ndarray, y: np.ndarray, *, bins: int = 15, seed: int = 0, rounds: int = 200) -> dict:
    """Every metric; bootstrap intervals for both ECEs when rounds > 0."""
    conf, correct = P.max(1), P.argmax(1) == y
    out = {
        "n": int(len(y)),
        "accuracy": accuracy(P, y),
        "nll": nll(P, y),
        "brier": brier(P, y),
        "ece_width": ece(P, y, bins, "width"),
        "ece_mass": ece(P, y, bins, "mass"),
        "per_class_ece": per_class_ece(P, y, bins),
        "aurc": aurc(conf, correct),
    }
    if rounds > 0:
        out["ece_width_ci"] = bootstrap_interval(lambda p, t: ece(p, t, bins, "width"), P, y, rounds=rounds, seed=seed)
        out["ece_mass_ci"] = bootstrap_interval(lambda p, t: ece(p, t, bins, "mass"), P, y, rounds=rounds, seed=seed)
    return out
