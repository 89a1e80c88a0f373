"""Calibrators fitted on the calibration part, chosen by cross-validated NLL on the calibration
part alone: temperature scaling, optionally with a per-option bias, on raw, length-normalised or
content-free-prior-corrected log-likelihoods; or a head (multinomial logistic regression on the
option log-likelihoods and the model's hidden state at the answer position), alone or fused with a
lexical expert on the input text."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize, minimize_scalar

from llamadecide.calibration.calibrators import Calibrator, HeadCalibrator, Kind
from llamadecide.calibration.folds import ignore_class_count_warning, splitter
from llamadecide.calibration.memo import FitMemo, digest
from llamadecide.decisions.lexical import LexicalModel, fit_lexical
from llamadecide.decisions.maths import (
    HIDDEN_ONLY,
    LOGLIK_HIDDEN,
    calibrated_scores,
    content_free_prior,
    head_features,
)

HEAD_FITS = FitMemo(96)  # a Banking77 head is about 1 MB
LEXICAL_FITS = FitMemo(48)  # a lexical expert holds its n-gram vocabulary's weights (about 10 MB)


def fit_head(
    L: np.ndarray,
    hidden: np.ndarray,
    y: np.ndarray,
    *,
    C: float,
    texts: Sequence[str] | None = None,
    seed: int = 0,
    features: str = LOGLIK_HIDDEN,
    fit: str = "logistic",
) -> HeadCalibrator:
    """Multinomial logistic regression on standardised features (or, `fit="class-means"`, the
    options' mean hidden states: `fit_class_means`); classes absent from `y` get a very low intercept
    (never predicted), so the head always has one row per option. With `texts`, also a lexical expert
    (`decisions.lexical`), fused with weights that minimise the held-out NLL of both experts'
    out-of-fold probabilities (3 folds of the same items; each fold's logistic head starts from the
    whole head, which it differs little from)."""
    k = L.shape[1]

    def core(rows: np.ndarray, start: HeadCalibrator | None = None) -> HeadCalibrator:
        if fit == "class-means":
            return fit_class_means(hidden[rows], y[rows], k)
        return _fit_logistic(L[rows], hidden[rows], y[rows], C=C, features=features, start=start)

    head = core(np.arange(len(y)))
    if texts is None:
        return head
    texts = list(texts)
    lexical = _fit_lexical(texts, y, k)
    head_oof = np.zeros_like(L, dtype=np.float64)
    lexical_oof = np.zeros_like(head_oof)
    for train, held in splitter(L, y, 3, seed):
        inner = core(train, start=head)
        head_oof[held] = np.log(np.clip(inner.apply(L[held], None, hidden[held]), 1e-300, None))
        lexical_oof[held] = _fit_lexical([texts[i] for i in train], y[train], k).log_probabilities(
            [texts[i] for i in held]
        )
    w = minimize(
        lambda w: _nll(w[0] * head_oof + w[1] * lexical_oof, y),
        np.array([0.5, 0.5]),
        method="L-BFGS-B",
        bounds=[(0.0, 5.0)] * 2,
    ).x
    return HeadCalibrator(
        head.weights, head.intercept, head.C, lexical, (float(w[0]), float(w[1])), head.features, fit=head.fit
    )


def fit_class_means(hidden: np.ndarray, y: np.ndarray, k: int) -> HeadCalibrator:
    """A head from one or two labels an option: each option's mean hidden state (standardised), and
    softmax(-|h - mean|^2 / t) over the options, the temperature t minimising the leave-one-out NLL
    (each item against the means of the others). Linear in h (the |h|^2 term is the same for every
    option), so it is served as any head on the hidden state alone. An option without a label is
    never predicted; one with a single label is its own mean (it has no leave-one-out score)."""
    mean, scale = hidden.mean(0), hidden.std(0)
    scale[scale < 1e-8] = 1.0
    Z = (hidden - mean) / scale
    present = np.unique(y)
    counts = np.bincount(y, minlength=k).astype(float)
    sums = np.zeros((k, Z.shape[1]))
    np.add.at(sums, y, Z)
    means = sums / np.maximum(counts, 1.0)[:, None]
    # Squared distances to each option's mean (|z|^2 - 2 z.m + |m|^2: no items x options x width array),
    # each item against its own option's mean without it (leave one out).
    squares = (Z**2).sum(1)
    distances = squares[:, None] - 2 * Z @ means[present].T + (means[present] ** 2).sum(1)[None, :]
    own = np.searchsorted(present, y)
    alone = counts[y] > 1
    loo_mean = (sums[y] - Z) / np.maximum(counts[y] - 1.0, 1.0)[:, None]
    rows = np.arange(len(y))
    distances[rows, own] = np.where(alone, ((Z - loo_mean) ** 2).sum(-1), distances[rows, own])
    usable = alone & (len(present) > 1)
    if usable.any():
        result = minimize_scalar(
            lambda log_t: _nll(-distances[usable] / np.exp(log_t), own[usable]), bounds=(-2.0, 12.0), method="bounded"
        )
        temperature = float(np.exp(result.x))
    else:
        temperature = float(np.median(distances)) or 1.0
    weights = np.zeros((k, Z.shape[1]))
    bias = np.full(k, -30.0)
    weights[present] = 2.0 * means[present] / temperature / scale
    bias[present] = -((means[present] ** 2).sum(-1)) / temperature - weights[present] @ mean
    return HeadCalibrator(weights, bias, 0.0, features=HIDDEN_ONLY, fit="class-means")


def _fit_logistic(
    L: np.ndarray,
    hidden: np.ndarray,
    y: np.ndarray,
    *,
    C: float,
    features: str = LOGLIK_HIDDEN,
    start: HeadCalibrator | None = None,
) -> HeadCalibrator:
    X = head_features(L, hidden, features)
    return HEAD_FITS.get(
        digest(X, y, C, features, L.shape[1], start is not None),
        lambda: _fit_logistic_on(X, y, k=L.shape[1], C=C, features=features, start=start),
    )


def _fit_lexical(texts: list[str], y: np.ndarray, k: int) -> LexicalModel:
    return LEXICAL_FITS.get(digest(texts, y, k), lambda: fit_lexical(texts, y, k))


def _fit_logistic_on(
    X: np.ndarray, y: np.ndarray, *, k: int, C: float, features: str, start: HeadCalibrator | None = None
) -> HeadCalibrator:
    """The logistic regression on standardised X, from `start` (a head on similar items: L-BFGS then
    takes a few steps instead of a hundred) or from zero."""
    from sklearn.linear_model import LogisticRegression

    classes = np.unique(y)
    if len(classes) == 1:  # e.g. an inner fold of a small sample: that option, always
        bias = np.full(k, -30.0)
        bias[classes[0]] = 0.0
        return HeadCalibrator(np.zeros((k, X.shape[1])), bias, C, features=features)
    mean = X.mean(0)
    scale = X.std(0)
    scale[scale < 1e-8] = 1.0
    model = LogisticRegression(C=C, max_iter=2000, warm_start=start is not None)
    if start is not None:  # the same function of the features, in this fit's standardised coordinates
        W, b = start.weights[classes], start.intercept[classes]
        if len(classes) == 2:
            W, b = W[1:] - W[:1], b[1:] - b[:1]
        model.coef_, model.intercept_ = W * scale, b + W @ mean
    with warnings.catch_warnings():
        ignore_class_count_warning()
        model.fit((X - mean) / scale, y)
    coef = np.atleast_2d(model.coef_)
    intercept = np.atleast_1d(model.intercept_)
    if len(model.classes_) == 2 and coef.shape[0] == 1:
        coef = np.vstack([np.zeros_like(coef[0]), coef[0]])
        intercept = np.array([0.0, intercept[0]])
    weights = np.zeros((k, X.shape[1]))
    bias = np.full(k, -30.0)
    for row, cls in enumerate(model.classes_):
        weights[cls] = coef[row] / scale
        bias[cls] = intercept[row] - float(np.dot(coef[row] / scale, mean))
    return HeadCalibrator(weights, bias, C, features=features)


def _nll(S: np.ndarray, y: np.ndarray) -> float:
    S = S - S.max(1, keepdims=True)
    return float(-(S[np.arange(len(y)), y] - np.log(np.exp(S).sum(1))).mean())


def fit(
    L: np.ndarray,
    lengths: np.ndarray | None,
    y: np.ndarray,
    *,
    kind: Kind,
    length_normalize: bool,
    l2: float = 1e-3,
    prior: np.ndarray | None = None,
) -> Calibrator:
    if length_normalize and lengths is None:
        raise ValueError("length normalisation needs token counts (the local backend provides them)")
    prior_t = tuple(float(p) for p in prior) if prior is not None else None
    # The objective reads the scores as served (`maths.calibrated_scores`), temperature and bias apart.
    base = calibrated_scores(L, lengths=lengths if length_normalize else None, prior=prior)
    if kind == "none":
        return Calibrator("none", length_normalize, prior=prior_t)
    if kind == "temperature":
        result = minimize_scalar(lambda log_t: _nll(base / np.exp(log_t), y), bounds=(-4.0, 4.0), method="bounded")
        return Calibrator("temperature", length_normalize, float(np.exp(result.x)), prior=prior_t)
    k = L.shape[1]

    def objective(theta: np.ndarray) -> float:
        bias = np.concatenate([[0.0], theta[1:]])
        return _nll((base + bias) / np.exp(theta[0]), y) + l2 * float((theta[1:] ** 2).sum())

    start = fit(L, lengths, y, kind="temperature", length_normalize=length_normalize, prior=prior)
    theta0 = np.concatenate([[np.log(start.temperature)], np.zeros(k - 1)])
    # The log-temperature stays within the temperature fit's own range: unbounded, the optimiser can
    # step to exp(-10^4) = 0 on separable data (and divide by it).
    bounds = [(-4.0, 4.0)] + [(None, None)] * (k - 1)
    result = minimize(objective, theta0, method="L-BFGS-B", bounds=bounds)
    bias = tuple(float(b) for b in np.concatenate([[0.0], result.x[1:]]))
    return Calibrator("temperature+bias", length_normalize, float(np.exp(result.x[0])), bias, prior=prior_t)


@dataclass(frozen=True)
class Candidate:
    kind: Kind
    length_normalize: bool
    prior_correction: bool = False
    C: float = 0.0  # heads only: inverse regularisation strength
    lexical: bool = False  # heads only: fused with a lexical expert on the input text
    features: str = LOGLIK_HIDDEN  # heads only: `hidden-1` reads the hidden state alone (no answer scored)
    fit: str = "logistic"  # heads only: or "class-means", from one or two labels an option

    @property
    def reads_answers(self) -> bool:
        """Whether it reads its variant's answer scores: all but a head on the hidden state alone."""
        return not (self.kind == "head" and self.features == HIDDEN_ONLY)

    @property
    def label(self) -> str:
        if self.kind == "head":
            reads = "hidden state" if self.features == HIDDEN_ONLY else ""
            fitted = "class means" if self.fit == "class-means" else f"C={self.C:g}"
            return f"head ({reads + ', ' if reads else ''}{fitted})" + (" + lexical" if self.lexical else "")
        parts = [self.kind]
        if self.prior_correction:
            parts.append("prior-corrected")
        if self.length_normalize:
            parts.append("length norm")
        return " + ".join(parts)

    @property
    def method(self) -> str:
        """The family the issue tracker and README talk about: zero-shot, prior-corrected, head."""
        return "head" if self.kind == "head" else ("prior-corrected" if self.prior_correction else "zero-shot")


HEAD_C_GRID = (0.05, 0.5)


def candidates(
    has_lengths: bool, *, has_prior: bool = False, has_hidden: bool = False, has_texts: bool = False
) -> list[Candidate]:
    kinds: list[Kind] = ["none", "temperature", "temperature+bias"]
    norms = [False, True] if has_lengths else [False]
    priors = [False, True] if has_prior else [False]
    found = [Candidate(k, n, p) for p in priors for n in norms for k in kinds]
    if has_hidden:
        lexical = [False, True] if has_texts else [False]
        found.extend(
            Candidate("head", False, C=c, lexical=x, features=f)
            for f in (LOGLIK_HIDDEN, HIDDEN_ONLY)
            for x in lexical
            for c in HEAD_C_GRID
        )
        found.extend(Candidate("head", False, lexical=x, features=HIDDEN_ONLY, fit="class-means") for x in lexical)
    return found


def fit_candidate(
    candidate: Candidate,
    L: np.ndarray,
    lengths: np.ndarray | None,
    y: np.ndarray,
    *,
    prior: np.ndarray | None = None,
    hidden: np.ndarray | None = None,
    texts: Sequence[str] | None = None,
) -> Calibrator | HeadCalibrator:
    if candidate.kind == "head":
        if hidden is None:
            raise ValueError("a head needs hidden states")
        if candidate.lexical and texts is None:
            raise ValueError("a lexical expert needs the input texts")
        return fit_head(
            L,
            hidden,
            y,
            C=candidate.C,
            texts=texts if candidate.lexical else None,
            features=candidate.features,
            fit=candidate.fit,
        )
    if candidate.prior_correction and prior is None:
        raise ValueError("prior correction needs the content-free prior")
    return fit(
        L,
        lengths,
        y,
        kind=candidate.kind,
        length_normalize=candidate.length_normalize,
        prior=prior if candidate.prior_correction else None,
    )


def content_free_prior_for(
    candidate: Candidate, rows: np.ndarray | None, lengths: np.ndarray | None
) -> np.ndarray | None:
    """The prior a candidate subtracts: from the content-free rows, normalised the same way."""
    if rows is None or not candidate.prior_correction:
        return None
    return content_free_prior(rows, lengths if candidate.length_normalize else None)
