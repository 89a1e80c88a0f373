"""The arithmetic of answers, as small pure functions.

Contracts: probabilities are non-negative and sum to 1; confidence is in [0, 1] and 0 exactly when
all K options are equally likely: confidence = (p_max - 1/K) / (1 - 1/K).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def normalise(
    logprobs: Sequence[float],
    *,
    temperature: float = 1.0,
    lengths: Sequence[int] | None = None,
    bias: Sequence[float] | None = None,
) -> np.ndarray:
    """Softmax over the declared options of (log p_k / n_k + b_k) / T, where n_k is the option's
    token count when `lengths` is given (length normalisation) and b_k an optional per-option
    bias (prior correction fitted by calibration)."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    scores = np.asarray(logprobs, dtype=np.float64)
    if lengths is not None:
        scores = scores / np.asarray(lengths, dtype=np.float64)
    if bias is not None:
        scores = scores + np.asarray(bias, dtype=np.float64)
    scores = scores / temperature
    scores = scores - scores.max()
    weights = np.exp(scores)
    return weights / weights.sum()


def label_mass(logprobs: Sequence[float]) -> float:
    """Total probability the model gave to the declared options (exact sequences, end marker
    included) before normalising: low when the model wanted to say something else."""
    return float(np.exp(np.asarray(logprobs, dtype=np.float64)).sum())


def confidence(probabilities: Sequence[float] | np.ndarray) -> float | np.ndarray:
    """Chance-corrected top probability: 0 for a uniform answer, 1 for a certain one. One answer
    (a vector) gives a float; a matrix of answers (one per row) gives an array."""
    p = np.asarray(probabilities, dtype=np.float64)
    k = p.shape[-1]
    if k < 2:
        raise ValueError("confidence needs at least two options")
    value = np.clip((p.max(-1) - 1.0 / k) / (1.0 - 1.0 / k), 0.0, 1.0)
    return float(value) if p.ndim == 1 else value


def expected_score(probabilities: Sequence[float]) -> float:
    """Expected level index for ordered levels 0..K-1 (lowest first)."""
    p = np.asarray(probabilities, dtype=np.float64)
    return float(np.dot(np.arange(p.size), p))
