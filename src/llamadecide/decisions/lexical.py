"""The lexical expert a head may carry: logistic regression on character n-gram TF-IDF of the
input text, as the model sees it (`prompt.render_state`).

It reads the words themselves (spellings, product names, fixed phrases) where the model's state
at the answer position summarises meaning; on Banking77 the two make different mistakes, and a
head that multiplies their probabilities (weights fitted by cross-validation) beats either.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llamadecide.decisions import maths

FEATURES = "char_wb-2-4-tfidf-1"  # the analyzer below; a profile names it, so a change is refused, not misread


def vectorizer(vocabulary: Sequence[str] | None = None, *, min_df: int = 2):
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(
        analyzer="char_wb",
        ngram_range=(2, 4),
        sublinear_tf=True,
        min_df=min_df,
        vocabulary=None if vocabulary is None else {term: i for i, term in enumerate(vocabulary)},
    )


@dataclass(frozen=True)
class LexicalModel:
    """softmax(W tfidf(text) + c); `vocabulary` and `idf` are the fitted vectorizer's."""

    vocabulary: tuple[str, ...] = field(compare=False)
    idf: np.ndarray = field(compare=False)
    weights: np.ndarray = field(compare=False)  # options x vocabulary
    intercept: np.ndarray = field(compare=False)  # options

    def __post_init__(self) -> None:
        if not (len(self.vocabulary) == len(self.idf) == self.weights.shape[1]):
            raise ValueError("the lexical expert's vocabulary, idf and weights disagree in size")
        built = vectorizer(self.vocabulary)
        built.idf_ = np.asarray(self.idf, dtype=np.float64)
        object.__setattr__(self, "_vectorizer", built)

    def log_probabilities(self, texts: Sequence[str]) -> np.ndarray:
        X = self._vectorizer.transform(list(texts))  # type: ignore[attr-defined]
        logits = np.asarray(X @ self.weights.T) + self.intercept
        logits = logits - logits.max(-1, keepdims=True)
        return logits - np.log(np.exp(logits).sum(-1, keepdims=True))

    def fuse(self, head: np.ndarray, texts: Sequence[str], mix: tuple[float, float]) -> np.ndarray:
        """softmax(a log p_head + b log p_lexical) for rows of head probabilities and their texts."""
        return maths.fuse_log_probabilities([np.log(np.clip(head, 1e-300, None)), self.log_probabilities(texts)], mix)


def fit_lexical(texts: Sequence[str], y: np.ndarray, k: int, *, C: float = 10.0) -> LexicalModel:
    """Fit on labelled texts; options absent from `y` get a very low intercept (never predicted)."""
    from sklearn.linear_model import LogisticRegression

    texts = list(texts)
    try:
        vec = vectorizer().fit(texts)
    except ValueError:  # too few texts for n-grams seen twice
        vec = vectorizer(min_df=1).fit(texts)
    vocabulary = tuple(sorted(vec.vocabulary_, key=vec.vocabulary_.get))
    X = vec.transform(texts)
    weights = np.zeros((k, len(vocabulary)))
    intercept = np.full(k, -30.0)
    classes = np.unique(y)
    if len(classes) == 1:
        intercept[classes[0]] = 0.0
    else:
        with warnings.catch_warnings():  # many options, few labels: y holds class indices
            warnings.filterwarnings("ignore", message="The number of unique classes is greater than 50%")
            model = LogisticRegression(C=C, max_iter=3000).fit(X, y)
        coef = np.atleast_2d(model.coef_)
        bias = np.atleast_1d(model.intercept_)
        if len(model.classes_) == 2:
            coef = np.vstack([-coef[0] / 2, coef[0] / 2])
            bias = np.array([-bias[0] / 2, bias[0] / 2])
        weights[model.classes_] = coef
        intercept[model.classes_] = bias
    return LexicalModel(vocabulary, vec.idf_.copy(), weights, intercept)
