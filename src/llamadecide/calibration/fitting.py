"""Calibrators fitted on the calibration part: temperature scaling, optionally with a per-option
bias (prior correction), optionally on length-normalised log-likelihoods; chosen by
cross-validated NLL on the calibration part alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import minimize, minimize_scalar
from sklearn.model_selection import StratifiedKFold

Kind = Literal["none", "temperature", "temperature+bias"]


@dataclass(frozen=True)
class Calibrator:
    kind: Kind = "none"
    length_normalize: bool = False
    temperature: float = 1.0
    bias: tuple[float, ...] | None = None

    def scores(self, L: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
        S = L / lengths if self.length_normalize else L
        if self.bias is not None:
            S = S + np.asarray(self.bias)
        return S / self.temperature

    def apply(self, L: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
        return softmax(self.scores(L, lengths))


def softmax(S: np.ndarray) -> np.ndarray:
    S = S - S.max(1, keepdims=True)
    W = np.exp(S)
    return W / W.sum(1, keepdims=True)


def _nll(S: np.ndarray, y: np.ndarray) -> float:
    S = S - S.max(1, keepdims=True)
    return float(-(S[np.arange(len(y)), y] - np.log(np.exp(S).sum(1))).mean())


def fit(L: np.ndarray, lengths: np.ndarray | None, y: np.ndarray, *, kind: Kind, length_normalize: bool,
        l2: float = 1e-3) -> Calibrator:
    if length_normalize and lengths is None:
        raise ValueError("length normalisation needs token counts (the local backend provides them)")
    base = L / lengths if length_normalize else L
    if kind == "none":
        return Calibrator("none", length_normalize)
    if kind == "temperature":
        result = minimize_scalar(lambda log_t: _nll(base / np.exp(log_t), y), bounds=(-4.0, 4.0), method="bounded")
        return Calibrator("temperature", length_normalize, float(np.exp(result.x)))
    k = L.shape[1]

    def objective(theta: np.ndarray) -> float:
        bias = np.concatenate([[0.0], theta[1:]])
        return _nll((base + bias) / np.exp(theta[0]), y) + l2 * float((theta[1:] ** 2).sum())

    start = fit(L, lengths, y, kind="temperature", length_normalize=length_normalize)
    theta0 = np.concatenate([[np.log(start.temperature)], np.zeros(k - 1)])
    result = minimize(objective, theta0, method="L-BFGS-B")
    bias = tuple(float(b) for b in np.concatenate([[0.0], result.x[1:]]))
    return Calibrator("temperature+bias", length_normalize, float(np.exp(result.x[0])), bias)


@dataclass(frozen=True)
class Candidate:
    kind: Kind
    length_normalize: bool

    @property
    def label(self) -> str:
        return f"{self.kind}{' + length norm' if self.length_normalize else ''}"


def candidates(has_lengths: bool) -> list[Candidate]:
    kinds: list[Kind] = ["none", "temperature", "temperature+bias"]
    norms = [False, True] if has_lengths else [False]
    return [Candidate(k, n) for n in norms for k in kinds]


def cross_validated_nll(L: np.ndarray, lengths: np.ndarray | None, y: np.ndarray, candidate: Candidate, *,
                        folds: int = 5, seed: int = 0) -> float:
    counts = np.bincount(y, minlength=L.shape[1])
    usable = max(2, min(folds, int(counts[counts > 0].min()) if counts.any() else 2))
    splitter = StratifiedKFold(n_splits=usable, shuffle=True, random_state=seed) if usable >= 2 and counts[counts > 0].min() >= usable else None
    if splitter is None:
        from sklearn.model_selection import KFold

        splitter = KFold(n_splits=folds, shuffle=True, random_state=seed)
    losses = []
    for train, held in splitter.split(L, y):
        calibrator = fit(L[train], None if lengths is None else lengths[train], y[train],
                         kind=candidate.kind, length_normalize=candidate.length_normalize)
        P = calibrator.apply(L[held], None if lengths is None else lengths[held])
        losses.append(-np.log(np.clip(P[np.arange(len(held)), y[held]], 1e-12, 1.0)).mean())
    return float(np.mean(losses))
