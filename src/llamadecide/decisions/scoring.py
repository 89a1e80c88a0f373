"""The scoring rules a question is asked under (what a calibration profile fixes), and the one
place that decides how a question is evaluated: exactly, with a bound on its answers, or its
hidden state alone."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from llamadecide.decisions import maths
from llamadecide.decisions.lexical import LexicalModel
from llamadecide.decisions.prompt import INPUT_ONLY, PROMPT_FORMAT_VERSION, QUESTION_FIRST_FORMATS, check_prompt_format
from llamadecide.errors import InvalidRequestError


@dataclass(frozen=True)
class Head:
    """A fitted multinomial logistic head over `maths.head_features` (standardisation folded in),
    optionally fused with a lexical expert on the input text: softmax(a log p_head + b log p_lexical),
    `mix` = (a, b). `layer`: the block whose output is the hidden state it reads (None: the final
    state, after the output norm)."""

    weights: np.ndarray = field(compare=False)  # K x (K + hidden size), or K x hidden size (`hidden-1`)
    intercept: np.ndarray = field(compare=False)  # K
    lexical: LexicalModel | None = field(default=None, compare=False)
    mix: tuple[float, float] = (1.0, 0.0)
    features: str = maths.LOGLIK_HIDDEN
    layer: int | None = None

    @property
    def reads_logprobs(self) -> bool:
        """False for a head on the hidden state alone: its questions' answers are never scored."""
        return self.features != maths.HIDDEN_ONLY

    def probabilities(
        self, logprobs: Sequence[float] | None, hidden: np.ndarray, text: str | None = None
    ) -> np.ndarray:
        """One answer's probabilities."""
        rows = None if logprobs is None else np.asarray(logprobs)[None, :]
        return self.probabilities_of_rows(rows, np.asarray(hidden)[None, :], None if text is None else [text])[0]

    def probabilities_of_rows(
        self, logprobs: np.ndarray | None, hidden: np.ndarray, texts: Sequence[str] | None = None
    ) -> np.ndarray:
        """Many answers' probabilities (one per row): what calibration measures a fitted head with
        and what the server applies are this one method."""
        features = maths.head_features(logprobs, hidden, self.features)
        if features.shape[-1] != self.weights.shape[1]:
            raise InvalidRequestError(
                f"the calibration head reads {self.weights.shape[1]} features, this model gives {features.shape[-1]}; "
                "it was fitted for another model",
                param="calibration",
            )
        P = maths.head_probabilities(features, self.weights, self.intercept)
        if self.lexical is None:
            return P
        if texts is None:
            raise ValueError("a head with a lexical expert needs the input text")
        return self.lexical.fuse(P, list(texts), self.mix)


@dataclass(frozen=True)
class Demonstration:
    """A labelled example shown to the model before the question (k-shot): an input and the index
    of its option in the question's own option order."""

    input: str
    option: int


def route(text: str, folds: int) -> int:
    """The fold of a cross-fitted rule that answers an input: a hash of its text, so the same input
    always gets the same answer and the inputs each fold answers are a random share of the traffic,
    whatever they hold."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") % folds


@dataclass(frozen=True)
class Fold:
    """What one fold of a cross-fitted rule fitted: the parameters fitting sets (the rest of the rule
    is the same for every fold)."""

    temperature: float = 1.0
    bias: tuple[float, ...] | None = None
    head: Head | None = None


@dataclass(frozen=True)
class Scoring:
    """How a question is scored and its log-likelihoods become probabilities. Calibration fits
    these per task.

    rotations > 1 asks the question that many times with the option list cyclically rotated
    (evenly spaced shifts), every rotation sharing the state's evaluated prefix in the same batch,
    and averages each option's log-likelihood over them: position bias cancels out.
    prior_correction divides out the model's answer distribution on content-free inputs; `prior`
    fixes that distribution (a calibration profile stores the one it was fitted with, so serving
    does not recompute it).
    A head replaces the softmax by a fitted classifier over the log-likelihoods and hidden state.
    cross_fitted holds the folds of a cross-fitted calibration (each fitted without the labels of the
    inputs it answers, `route` choosing the fold by the input); empty, the rule's own parameters
    answer every input.
    demonstrations are answered examples put before the question (see `prompt.build_messages`).
    prompt_format is the prompt format the question is asked in (`prompt.PROMPT_FORMATS`): it belongs to
    the question (its profile), never to one request, so an answer does not depend on what else
    was asked."""

    temperature: float = 1.0
    length_normalize: bool = False
    bias: tuple[float, ...] | None = None
    prior_correction: bool = False
    prior: tuple[float, ...] | None = None  # the content-free log prior to subtract (else computed)
    rotations: int = 1
    head: Head | None = None
    demonstrations: tuple[Demonstration, ...] = ()
    prompt_format: str = PROMPT_FORMAT_VERSION
    cross_fitted: tuple[Fold, ...] = field(default=(), compare=False)

    def routed(self, text: str | None) -> Scoring:
        """The rule that answers `text`: its fold's parameters, for a cross-fitted rule."""
        if not self.cross_fitted:
            return self
        if text is None:
            raise ValueError("a cross-fitted rule routes by the input; none was given")
        fold = self.cross_fitted[route(text, len(self.cross_fitted))]
        return replace(self, temperature=fold.temperature, bias=fold.bias, head=fold.head, cross_fitted=())

    @property
    def pins_prefix(self) -> bool:
        """Whether every prompt of this rule starts with a part that is the same for every state (the
        question block of a question-first prompt format, demonstrations, the input-only format's
        system text), which the engine keeps evaluated."""
        return bool(self.demonstrations) or self.prompt_format in (*QUESTION_FIRST_FORMATS, INPUT_ONLY)

    def raw(self) -> Scoring:
        """The same prompt (format, demonstrations, rotations), its answers read raw: no calibration,
        prior or head. What calibration measures a prompt with."""
        return Scoring(rotations=self.rotations, demonstrations=self.demonstrations, prompt_format=self.prompt_format)

    def check(self) -> None:
        if check_prompt_format(self.prompt_format) != PROMPT_FORMAT_VERSION and self.rotations > 1:
            raise InvalidRequestError(
                f"rotations need the state-first prompt format {PROMPT_FORMAT_VERSION!r}: "
                f"in {self.prompt_format!r} the options are shown once in a shared prefix, or not at "
                "all",
                param="rotations",
            )


class Evaluation(Enum):
    EXACT = "exact"  # every answer scored exactly
    BOUNDED = "bounded"  # a large answer trie may be expanded best-first, within a stated bound
    HIDDEN_ONLY = "hidden state"  # no answer scored: the head reads the hidden state alone


def evaluation(rule: Scoring, max_bound: float) -> Evaluation:
    """How a question under `rule` is evaluated when the server allows answers within `max_bound`
    of exact. A bound on the unexpanded answers' total probability carries over only to
    probabilities that are the softmax of the raw log-likelihoods: a head reads every option's
    exact log-likelihood; a prior, bias, temperature or length normalisation reweights them one by
    one; rotations average them."""
    if rule.head is not None and not rule.head.reads_logprobs:
        return Evaluation.HIDDEN_ONLY
    plain = (
        rule.head is None
        and not rule.prior_correction
        and rule.bias is None
        and rule.temperature == 1.0
        and not rule.length_normalize
        and rule.rotations == 1
    )
    return Evaluation.BOUNDED if plain and max_bound > 0 else Evaluation.EXACT


def per_question(scoring: Sequence[Scoring | None] | Scoring | None, count: int) -> list[Scoring]:
    if scoring is None or isinstance(scoring, Scoring):
        return [scoring or Scoring()] * count
    if len(scoring) != count:
        raise ValueError("one scoring rule per question is required")
    return [s or Scoring() for s in scoring]
