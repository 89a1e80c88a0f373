"""Calibration profiles: the fitted parameters and policy, bound to the model file and prompt
format they were fitted on. The server loads them from a directory and applies them by name."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from llamadecide.decisions import lexical
from llamadecide.errors import ProfileMismatchError

PROFILE_FILE = "profile.json"  # what `calibrate --out DIR` writes beside its summary.json and report


class LexicalParams(BaseModel):
    """A head's lexical expert (`decisions.lexical`): the fitted vectorizer's vocabulary and idf, the
    logistic regression over it, and the fusion weights (head, lexical)."""

    model_config = ConfigDict(extra="forbid")

    features: Literal["char_wb-2-4-tfidf-1"] = lexical.FEATURES
    vocabulary: list[str]
    idf: list[float]
    weights: list[list[float]]  # options x vocabulary
    intercept: list[float]
    mix: tuple[float, float]

    @model_validator(mode="after")
    def _sizes(self) -> LexicalParams:
        if len(self.idf) != len(self.vocabulary) or any(len(row) != len(self.vocabulary) for row in self.weights):
            raise ValueError("the lexical expert's vocabulary, idf and weights disagree in size")
        if len(self.intercept) != len(self.weights):
            raise ValueError("the lexical expert has one intercept per option")
        return self


class HeadParams(BaseModel):
    """A fitted head: softmax(weights @ features + intercept), features as `maths.head_features`,
    optionally fused with a lexical expert."""

    model_config = ConfigDict(extra="forbid")

    features: Literal["loglik+hidden-1", "hidden-1"] = "loglik+hidden-1"  # maths.HEAD_FEATURES
    hidden_size: int
    weights: list[list[float]]  # options x (options + hidden_size), or options x hidden_size (hidden-1)
    intercept: list[float]
    C: float
    lexical: Optional[LexicalParams] = None
    # The block whose output the head reads (None: the final state, after the output norm).
    layer: Optional[int] = Field(default=None, ge=0)
    fit: Literal["logistic", "class-means"] = "logistic"  # how the weights were fitted (served alike)

    @classmethod
    def from_calibrator(cls, head, layer: int | None = None) -> HeadParams:
        k = head.weights.shape[0]
        expert = None
        if head.lexical is not None:
            expert = LexicalParams(
                vocabulary=list(head.lexical.vocabulary),
                idf=head.lexical.idf.tolist(),
                weights=head.lexical.weights.tolist(),
                intercept=head.lexical.intercept.tolist(),
                mix=head.mix,
            )
        width = int(head.weights.shape[1]) - (0 if head.features == "hidden-1" else k)
        return cls(
            features=head.features,
            hidden_size=width,
            weights=head.weights.tolist(),
            intercept=head.intercept.tolist(),
            C=head.C,
            lexical=expert,
            layer=layer,
            fit=getattr(head, "fit", "logistic"),
        )

    def build(self):
        """The decisions library's Head."""
        import numpy as np

        from llamadecide.decisions.scoring import Head

        if self.lexical is None:
            return Head(np.asarray(self.weights), np.asarray(self.intercept), features=self.features, layer=self.layer)
        expert = lexical.LexicalModel(
            tuple(self.lexical.vocabulary),
            np.asarray(self.lexical.idf),
            np.asarray(self.lexical.weights),
            np.asarray(self.lexical.intercept),
        )
        return Head(
            np.asarray(self.weights),
            np.asarray(self.intercept),
            expert,
            tuple(self.lexical.mix),
            self.features,
            self.layer,
        )


class FoldParams(BaseModel):
    """What one fold of a cross-fitted profile fitted (the rest of the method is the profile's)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float
    bias: Optional[list[float]] = None
    head: Optional[HeadParams] = None

    def build(self):
        from llamadecide.decisions.scoring import Fold

        return Fold(self.temperature, tuple(self.bias) if self.bias else None, self.head.build() if self.head else None)


def _fold_fields(calibrator, hidden_layer: int | None) -> dict[str, Any]:
    is_head = getattr(calibrator, "kind", None) == "head"
    return {
        "temperature": getattr(calibrator, "temperature", 1.0),
        "bias": list(calibrator.bias) if getattr(calibrator, "bias", None) else None,
        "head": HeadParams.from_calibrator(calibrator, hidden_layer) if is_head else None,
    }


def method_fields(calibrator, candidate, hidden_layer: int | None = None) -> dict[str, Any]:
    """A profile's fields for a fitted calibrator (`calibration.fitting`) of a candidate: what
    `CalibrationProfile.scoring()` turns back into the served maths. A cross-fitted one's first fold
    fills the profile's own fields, the others `folds`."""
    folds = getattr(calibrator, "folds", None)
    if folds is not None:
        return {
            **method_fields(folds[0], candidate, hidden_layer),
            "folds": [FoldParams(**_fold_fields(fold, hidden_layer)) for fold in folds[1:]],
        }
    return {
        "calibrator": calibrator.kind,
        "length_normalize": calibrator.length_normalize,
        "method": candidate.method,
        "prior_correction": candidate.prior_correction,
        "prior": list(calibrator.prior) if calibrator.prior else None,
        **_fold_fields(calibrator, hidden_layer),
    }


class DemonstrationParams(BaseModel):
    """A labelled example shown before every question (k-shot): its input text and the index of its
    answer in the task's option order."""

    model_config = ConfigDict(extra="forbid")

    input: str
    option: int


class CalibrationProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    created: str
    version: int = Field(default=1, ge=1)  # a refit from labels is its parent's version + 1
    parent: Optional[str] = None  # the parent's `version_id`
    model_sha256: str
    prompt_format: str
    task: dict[str, Any]  # type, instructions, options, fingerprint
    mode: Literal["text", "labels"]
    calibrator: Literal["none", "temperature", "temperature+bias", "head"]
    length_normalize: bool
    temperature: float
    bias: Optional[list[float]] = None
    method: Literal["zero-shot", "prior-corrected", "head"] = "zero-shot"
    prior_correction: bool = False
    prior: Optional[list[float]] = None  # the content-free log prior fitted with (prior correction)
    rotations: int = 1
    head: Optional[HeadParams] = None
    # Cross-fitted (`RunConfig.cross_fit`): the other folds' parameters; a decision is answered by the
    # fold `scoring.route` gives its input, fold 0 being the profile's own temperature, bias and head.
    folds: Optional[list[FoldParams]] = None
    demonstrations: Optional[list[DemonstrationParams]] = None  # k-shot: shown before every question
    threshold: Optional[float] = None  # act automatically when confidence >= threshold; None: always escalate
    target_precision: float
    confidence_level: float
    dataset_fingerprint: str
    metrics: dict[str, Any]
    _scoring: Any = PrivateAttr(default=None)
    _version_id: Optional[str] = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _consistent(self) -> CalibrationProfile:
        if (self.calibrator == "head") != (self.head is not None):
            raise ValueError("a profile has head parameters exactly when its calibrator is 'head'")
        if self.head is not None and len(self.head.weights) != len(self.task["options"]):
            raise ValueError("the head has one row per option")
        if self.prior is not None and (not self.prior_correction or len(self.prior) != len(self.task["options"])):
            raise ValueError("a profile has one prior value per option, and only with prior correction")
        if (
            self.head is not None
            and self.head.lexical is not None
            and len(self.head.lexical.weights) != len(self.head.weights)
        ):
            raise ValueError("the head's lexical expert has one row per option")
        for fold in self.folds or ():
            if (fold.head is None) != (self.head is None):
                raise ValueError("every fold of a cross-fitted profile has a head exactly when the profile does")
            if fold.head is not None and len(fold.head.weights) != len(self.task["options"]):
                raise ValueError("every fold's head has one row per option")
            if fold.bias is not None and len(fold.bias) != len(self.task["options"]):
                raise ValueError("every fold's bias has one value per option")
        for demonstration in self.demonstrations or ():
            if not 0 <= demonstration.option < len(self.task["options"]):
                raise ValueError(
                    f"a demonstration answers option {demonstration.option}; the task has "
                    f"{len(self.task['options'])} options"
                )
        return self

    @property
    def version_id(self) -> str:
        """This version of the profile, as decisions served with it and refits record it: its name,
        version and a digest of its contents (two runs that both wrote version 1 stay apart)."""
        if self._version_id is None:
            digest = hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]
            self._version_id = f"{self.name}@{self.version}-{digest}"
        return self._version_id

    @property
    def method_label(self) -> str:
        """The method as served: e.g. 'prior-corrected', 'head + lexical', 'head (hidden state) + lexical',
        '4-shot' or '4-shot, prior-corrected'."""
        method = self.method
        if self.head is not None:
            method += (" (hidden state)" if self.head.features == "hidden-1" else "") + (
                ", class means" if self.head.fit == "class-means" else ""
            )
            method += " + lexical" if self.head.lexical else ""
        if self.folds:
            method += f", cross-fitted ({len(self.folds) + 1} folds)"
        shots = len(self.demonstrations or ())
        if not shots:
            return method
        return f"{shots}-shot" if method == "zero-shot" else f"{shots}-shot, {method}"

    def scoring(self):
        """The decisions library's Scoring for this profile (built once)."""
        if self._scoring is None:
            from llamadecide.decisions import Scoring
            from llamadecide.decisions.scoring import Demonstration, Fold

            head = self.head.build() if self.head else None
            bias = tuple(self.bias) if self.bias else None
            folds = (Fold(self.temperature, bias, head), *(f.build() for f in self.folds)) if self.folds else ()
            self._scoring = Scoring(
                temperature=self.temperature,
                length_normalize=self.length_normalize,
                bias=bias,
                prior_correction=self.prior_correction,
                prior=tuple(self.prior) if self.prior is not None else None,
                rotations=self.rotations,
                head=head,
                demonstrations=tuple(Demonstration(d.input, d.option) for d in self.demonstrations or ()),
                prompt_format=self.prompt_format,
                cross_fitted=folds,
            )
        return self._scoring

    def save(self, path: Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> CalibrationProfile:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def check_bound_to(self, model_sha256: str, prompt_formats: tuple[str, ...]) -> None:
        if self.model_sha256 != model_sha256:
            raise ProfileMismatchError(
                f"profile {self.name!r} was fitted for model {self.model_sha256[:12]}…, this server runs "
                f"{model_sha256[:12]}…; recalibrate for this model",
                param="llamadecide.profile",
            )
        if self.prompt_format not in prompt_formats:
            raise ProfileMismatchError(
                f"profile {self.name!r} was fitted with prompt format {self.prompt_format!r}, this server knows "
                f"{', '.join(prompt_formats)}; recalibrate",
                param="llamadecide.profile",
            )

    def question(self):
        """The profile's question as it was calibrated (option descriptions where the profile records
        them: profiles written before they did ask without)."""
        from llamadecide.decisions import choice, predicate, score

        kind, instructions, options = self.task["type"], self.task["instructions"], self.task["options"]
        descriptions = self.task.get("descriptions") or [None] * len(options)
        if kind == "predicate":
            return predicate(
                instructions, true_description=descriptions[0], false_description=descriptions[1], mode=self.mode
            )
        return (score if kind == "score" else choice)(instructions, list(zip(options, descriptions)), mode=self.mode)

    def check_options(self, kind: str, values: list[Any]) -> None:
        expected = [json.dumps(v) for v in self.task["options"]]
        if self.task["type"] != kind or [json.dumps(v) for v in values] != expected:
            raise ProfileMismatchError(
                f"profile {self.name!r} is for a {self.task['type']} question with options {self.task['options']}; "
                f"the question has {values}",
                param="llamadecide.profile",
            )


def profile_files(directory: Path) -> list[Path]:
    """The profiles in a directory: a `calibrate --out` folder is one profile (its profile.json; its
    summary.json is not a profile), and so is each such folder inside it; any other *.json file
    directly in it is a profile file of its own (a folder of copied profiles)."""
    directory = Path(directory)
    if (directory / PROFILE_FILE).is_file():
        return [directory / PROFILE_FILE]
    return sorted([*directory.glob("*.json"), *directory.glob(f"*/{PROFILE_FILE}")])
