"""What a fitted calibration is, as served: temperature scaling (with an optional per-option bias
and prior correction), a head on the hidden state (optionally fused with a lexical expert), or one of
them per fold, cross-fitted. `fitting` fits them; `profile` saves and loads them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from llamadecide.decisions.lexical import LexicalModel
from llamadecide.decisions.maths import HIDDEN_ONLY, LOGLIK_HIDDEN, normalise
from llamadecide.decisions.scoring import Head

Kind = Literal["none", "temperature", "temperature+bias", "head"]


@dataclass(frozen=True)
class Calibrator:
    kind: Kind = "none"
    length_normalize: bool = False
    temperature: float = 1.0
    bias: tuple[float, ...] | None = None
    prior: tuple[float, ...] | None = None  # content-free log prior, subtracted (prior correction)

    def apply(
        self,
        L: np.ndarray,
        lengths: np.ndarray | None,
        hidden: np.ndarray | None = None,
        texts: Sequence[str] | None = None,
    ) -> np.ndarray:
        """Its probabilities, by the served maths (`maths.normalise`)."""
        return normalise(
            L,
            temperature=self.temperature,
            lengths=lengths if self.length_normalize else None,
            bias=self.bias,
            prior=self.prior,
        )


@dataclass(frozen=True)
class HeadCalibrator:
    """softmax(W f + c) over `maths.head_features`; the standardisation is folded into W and c, so
    serving needs no scikit-learn. With a lexical expert: softmax(a log p_head + b log p_lexical)."""

    weights: np.ndarray
    intercept: np.ndarray
    C: float
    lexical: LexicalModel | None = None
    mix: tuple[float, float] = (1.0, 0.0)
    features: str = LOGLIK_HIDDEN
    kind: Kind = "head"
    length_normalize: bool = False
    prior: None = None
    fit: str = "logistic"  # or "class-means" (`fit_class_means`)

    def apply(
        self,
        L: np.ndarray,
        lengths: np.ndarray | None,
        hidden: np.ndarray | None = None,
        texts: Sequence[str] | None = None,
    ) -> np.ndarray:
        if hidden is None:
            raise ValueError("a head needs hidden states (the local backend provides them)")
        return self.served().probabilities_of_rows(None if self.features == HIDDEN_ONLY else L, hidden, texts)

    def served(self) -> Head:
        """The decisions library's head with these parameters: what a profile of it serves."""
        return Head(self.weights, self.intercept, self.lexical, self.mix, self.features)


@dataclass(frozen=True)
class CrossFitted:
    """One calibrator per fold, each fitted without its fold's labels; an input is answered by the
    fold `scoring.route` gives its text, so every labelled item's out-of-fold probabilities are the
    ones served for it, and a threshold certified on them holds for what is served."""

    folds: tuple[Calibrator | HeadCalibrator, ...]

    @property
    def kind(self) -> Kind:
        return self.folds[0].kind

    @property
    def length_normalize(self) -> bool:
        return self.folds[0].length_normalize

    @property
    def prior(self) -> tuple[float, ...] | None:
        return self.folds[0].prior

    def apply(
        self,
        L: np.ndarray,
        lengths: np.ndarray | None,
        hidden: np.ndarray | None = None,
        texts: Sequence[str] | None = None,
        *,
        routes: np.ndarray | None = None,
    ) -> np.ndarray:
        """Each row's probabilities from its fold (`routes`: each row's fold, `scoring.route`)."""
        if routes is None:
            raise ValueError("a cross-fitted calibrator answers each input with its fold; no routes were given")
        P = np.zeros(L.shape, dtype=np.float64)
        for k, calibrator in enumerate(self.folds):
            rows = np.flatnonzero(routes == k)
            if len(rows):
                P[rows] = calibrator.apply(
                    L[rows],
                    None if lengths is None else lengths[rows],
                    None if hidden is None else hidden[rows],
                    None if texts is None else [texts[i] for i in rows],
                )
        return P
