"""The arithmetic of answers, as small pure functions.

Contracts: probabilities are non-negative and sum to 1; confidence is in [0, 1] and 0 exactly when
all K options are equally likely: confidence = (p_max - 1/K) / (1 - 1/K).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def calibrated_scores(
    logprobs: Sequence[float] | np.ndarray,
    *,
    temperature: float = 1.0,
    lengths: Sequence[int] | np.ndarray | None = None,
    bias: Sequence[float] | None = None,
    prior: Sequence[float] | None = None,
) -> np.ndarray:
    """(log p_k / n_k - prior_k + b_k) / T, where n_k is the option's token count when `lengths` is
    given (length normalisation), prior_k the log content-free probability of the option
    (`content_free_prior`) when prior correction is on, and b_k an optional per-option bias fitted
    by calibration. One answer or a matrix of answers (one per row): what calibration fits and what
    the server applies are this one function."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    scores = np.asarray(logprobs, dtype=np.float64)
    if lengths is not None:
        scores = scores / np.asarray(lengths, dtype=np.float64)
    if prior is not None:
        scores = scores - np.asarray(prior, dtype=np.float64)
    if bias is not None:
        scores = scores + np.asarray(bias, dtype=np.float64)
    return scores / temperature


def softmax(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """Probabilities over the last axis (rows in, rows out)."""
    S = np.asarray(scores, dtype=np.float64)
    S = S - S.max(-1, keepdims=True)
    weights = np.exp(S)
    return weights / weights.sum(-1, keepdims=True)


def normalise(
    logprobs: Sequence[float] | np.ndarray,
    *,
    temperature: float = 1.0,
    lengths: Sequence[int] | np.ndarray | None = None,
    bias: Sequence[float] | None = None,
    prior: Sequence[float] | None = None,
) -> np.ndarray:
    """Softmax over the declared options of `calibrated_scores` (one answer, or one per row)."""
    return softmax(calibrated_scores(logprobs, temperature=temperature, lengths=lengths, bias=bias, prior=prior))


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


# Inputs that carry no content: the model's answer distribution on them is its prior over the
# options for this question (contextual calibration, Zhao et al. 2021).
CONTENT_FREE_INPUTS = ("N/A", "[MASK]")


def content_free_prior(rows: Sequence[Sequence[float]], lengths: Sequence[int] | None = None) -> np.ndarray:
    """log of the mean normalised answer distribution over the content-free inputs (one row of
    option log-likelihoods each). Subtracting it divides every option's probability by the
    probability the model gives it when there is nothing to read."""
    S = np.asarray(rows, dtype=np.float64)
    if lengths is not None:
        S = S / np.asarray(lengths, dtype=np.float64)
    S = S - S.max(-1, keepdims=True)
    P = np.exp(S)
    P = P / P.sum(-1, keepdims=True)
    return np.log(P.mean(0))


def log_softmax(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    S = np.asarray(scores, dtype=np.float64)
    S = S - S.max(-1, keepdims=True)
    return S - np.log(np.exp(S).sum(-1, keepdims=True))


LOGLIK_HIDDEN = "loglik+hidden-1"
HIDDEN_ONLY = "hidden-1"
HEAD_FEATURES = (LOGLIK_HIDDEN, HIDDEN_ONLY)


def head_features(
    logprobs: Sequence[float] | np.ndarray | None, hidden: Sequence[float] | np.ndarray, features: str = LOGLIK_HIDDEN
) -> np.ndarray:
    """What a fitted head reads. `loglik+hidden-1`: the options' normalised log-likelihoods, then the
    model's final hidden state at the answer position. `hidden-1`: the hidden state alone (the
    answers are then never scored: the prompt is all a decision evaluates). Rows in, rows out."""
    H = np.asarray(hidden, dtype=np.float64)
    if features == HIDDEN_ONLY:
        return H
    if features != LOGLIK_HIDDEN:
        raise ValueError(f"unknown head feature set {features!r}")
    L = log_softmax(logprobs)
    return np.concatenate([L, H], axis=-1)


def fuse_log_probabilities(parts: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """softmax(sum_i w_i log p_i): a weighted product of experts (rows in, rows out)."""
    S = sum(float(w) * np.asarray(part, dtype=np.float64) for w, part in zip(weights, parts))
    S = S - S.max(-1, keepdims=True)
    P = np.exp(S)
    return P / P.sum(-1, keepdims=True)


def head_probabilities(features: np.ndarray, weights: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    """A multinomial logistic head: softmax(W f + c). Rows in, rows out."""
    logits = np.asarray(features, dtype=np.float64) @ np.asarray(weights, dtype=np.float64).T + np.asarray(intercept)
    logits = logits - logits.max(-1, keepdims=True)
    P = np.exp(logits)
    return P / P.sum(-1, keepdims=True)
