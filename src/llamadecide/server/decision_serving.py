"""Decisions over HTTP, testable without it: validate and convert a wire request into the
decisions library's questions, run it on the engine thread, format the answers.
Both wire formats share this class and so the engine path."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llamadecide.decisions import (
    PROMPT_FORMAT_VERSION,
    Answer,
    Decider,
    Decision,
    DecisionInput,
    Question,
    Scoring,
    choice,
    predicate,
    score,
)
from llamadecide.decisions.work import Limits
from llamadecide.errors import InvalidRequestError, UnsupportedError
from llamadecide.server.input_text import content_text, openai_content_text, render_openai_input
from llamadecide.server.protocol import decisions as oa
from llamadecide.server.protocol import systemone as so
from llamadecide.server.protocol.common import Extension

DEFAULT_INSTRUCTIONS = {
    "choice": "Which option best describes the input?",
    "score": "Which level best describes the input?",
    "noul": "Does the input match the description of the true outcome?",
}


@dataclass
class Prepared:
    state: Any
    questions: list[Question]
    names: list[str | None]
    scoring: Scoring
    extension: Extension | None
    profile: Any = None  # CalibrationProfile applied to every question, if named
    ignored_fields: tuple[str, ...] = ()  # unknown top-level System One fields, accepted and reported


def _named(where: str, build: Callable[..., Question], *args: Any, **kwargs: Any) -> Question:
    """`build(*args, **kwargs)`, its refusal naming the request's question `where`."""
    try:
        return build(*args, **kwargs)
    except InvalidRequestError as exc:
        raise InvalidRequestError(exc.message, param=where) from exc


class DecisionServing:
    def __init__(
        self,
        decider: Decider,
        *,
        model_name: str,
        max_questions: int,
        max_options: int,
        profiles: Callable[[str], None] | None = None,
        model_sha256: Callable[[], str] = lambda: "",
        systemone_extensions: bool = True,
        max_request_rows: int | None = None,
        max_rotations: int = 8,
        on_batch: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.systemone_extensions = systemone_extensions
        self.on_batch = on_batch  # told how many decisions each shared engine run (`run_many`) serves
        self.decider = decider
        self.model_sha256 = model_sha256
        self.model_name = model_name
        self.max_questions = max_questions
        self.max_options = max_options
        self.max_request_rows = max_request_rows
        self.max_rotations = max_rotations
        self.profiles = profiles

    # -- validate and convert ---------------------------------------------------------------

    def _limits(self, count: int, option_counts: Sequence[int]) -> None:
        if count > self.max_questions:
            raise InvalidRequestError(
                f"at most {self.max_questions} questions per request, got {count}", param="questions"
            )
        for i, n in enumerate(option_counts):
            if n > self.max_options:
                raise InvalidRequestError(
                    f"at most {self.max_options} options per question, got {n}", param=f"questions[{i}]"
                )

    def _profile(self, extension: Extension | None):
        """The named calibration profile; it fixes the scoring mode, so it is resolved first."""
        if not (extension and extension.profile):
            return None
        if self.profiles is None:
            raise InvalidRequestError(
                f"unknown calibration profile {extension.profile!r}: no profiles are loaded",
                param="llamadecide.profile",
            )
        profile = self.profiles(extension.profile)
        if extension.mode and extension.mode != profile.mode:
            raise InvalidRequestError(
                f"profile {profile.name!r} was fitted in {profile.mode} mode; drop `mode` or use {profile.mode!r}",
                param="llamadecide.mode",
            )
        if extension.length_normalize and not profile.length_normalize:
            raise InvalidRequestError(
                f"profile {profile.name!r} was fitted without length normalisation",
                param="llamadecide.length_normalize",
            )
        if extension.prior_correction and not profile.prior_correction:
            raise InvalidRequestError(
                f"profile {profile.name!r} was fitted without prior correction ({profile.method})",
                param="llamadecide.prior_correction",
            )
        if extension.rotations != 1 and extension.rotations != profile.rotations:
            raise InvalidRequestError(
                f"profile {profile.name!r} was fitted with {profile.rotations} rotation(s)",
                param="llamadecide.rotations",
            )
        return profile

    @staticmethod
    def _mode(extension: Extension | None, profile) -> str | None:
        if profile is not None:
            return profile.mode
        return extension.mode if extension and extension.mode else None

    def _scoring(self, extension: Extension | None, profile, questions: list[Question]) -> Scoring:
        if extension is not None and extension.rotations > self.max_rotations:
            raise InvalidRequestError(
                f"at most {self.max_rotations} rotations (max_rotations), got {extension.rotations}",
                param="llamadecide.rotations",
            )
        if profile is None:
            if extension is None:
                return Scoring()
            return Scoring(
                length_normalize=extension.length_normalize,
                prior_correction=extension.prior_correction,
                rotations=extension.rotations,
            )
        for question in questions:
            values = (
                [o.text for o in question.options] if question.type == "score" else [o.value for o in question.options]
            )
            profile.check_options(question.type, values)
        return profile.scoring()

    def prepare_openai(self, request: oa.DecisionRequest) -> Prepared:
        counts = [
            len(q.choices)
            if isinstance(q, oa.ChoiceQuestion)
            else len(q.levels)
            if isinstance(q, oa.ScoreQuestion)
            else 2
            for q in request.questions
        ]
        self._limits(len(request.questions), counts)
        ext = request.llamadecide
        profile = self._profile(ext)
        state = render_openai_input(request.input)
        questions: list[Question] = []
        mode = self._mode(ext, profile)
        for i, q in enumerate(request.questions):
            where = f"questions[{i}]"
            text = openai_content_text(q.instructions, f"{where}.instructions")
            if isinstance(q, oa.PredicateQuestion):
                questions.append(_named(where, predicate, text, name=q.name, mode=mode or "text"))
            elif isinstance(q, oa.ChoiceQuestion):
                items = [(c.value, c.description) for c in q.choices]
                questions.append(_named(where, choice, text, items, name=q.name, mode=mode or "text"))
            else:
                levels = [(lv.label, lv.description) for lv in q.levels]
                questions.append(_named(where, score, text, levels, name=q.name, mode=mode or "labels"))
        return Prepared(
            state, questions, [q.name for q in request.questions], self._scoring(ext, profile, questions), ext, profile
        )

    def prepare_systemone(self, request: so.SystemOneRequest) -> tuple[Prepared, list[str], dict[str, list]]:
        if request.images or request.assets:
            raise UnsupportedError("image input is not supported: this server runs a text-only model", param="images")
        ids = list(request.questions)
        counts = [
            len(q.criteria) if isinstance(q, (so.ChoiceQuestion, so.ScoreQuestion)) else 2
            for q in request.questions.values()
        ]
        self._limits(len(ids), counts)
        ext = request.llamadecide
        profile = self._profile(ext)
        mode = self._mode(ext, profile)
        questions: list[Question] = []
        legends: dict[str, list] = {}
        for qid, q in request.questions.items():
            where = f"questions.{qid}"
            if isinstance(q, so.BoxQuestion):
                raise UnsupportedError(
                    "box questions locate things in images; this server runs a text-only model", param=where
                )
            text = content_text(q.instructions) if q.instructions is not None else None
            if isinstance(q, so.NoulQuestion):
                criteria = q.criteria or so.NoulCriteria()
                if text is None and criteria.true is None and criteria.false is None:
                    raise InvalidRequestError("a noul question needs instructions or a described outcome", param=where)
                true_d = content_text(criteria.true) if criteria.true is not None else None
                false_d = content_text(criteria.false) if criteria.false is not None else None
                questions.append(
                    _named(
                        where,
                        predicate,
                        text or DEFAULT_INSTRUCTIONS["noul"],
                        name=qid,
                        true_description=true_d,
                        false_description=false_d,
                        mode=mode or "text",
                    )
                )
            elif isinstance(q, so.ChoiceQuestion):
                items = [(key, content_text(d) if d is not None else None) for key, d in q.criteria.items()]
                questions.append(
                    _named(where, choice, text or DEFAULT_INSTRUCTIONS["choice"], items, name=qid, mode=mode or "text")
                )
            else:
                legends[qid] = list(q.criteria)
                levels = [(content_text(c), None) for c in q.criteria]
                questions.append(
                    _named(where, score, text or DEFAULT_INSTRUCTIONS["score"], levels, name=qid, mode=mode or "labels")
                )
        ignored = tuple(sorted(request.model_extra or {}))
        return (
            Prepared(request.state, questions, ids, self._scoring(ext, profile, questions), ext, profile, ignored),
            ids,
            legends,
        )

    # -- run ----------------------------------------------------------------------------------

    def run_many(self, prepared: Sequence[Prepared], jobs: Sequence[Any]) -> list[Decision | Exception]:
        """Many requests' decisions in shared engine calls (`Decider.decide_many`), each what it is
        alone, with its own work bound and cancellation (`jobs[i].cancelled`)."""
        self.on_batch(len(prepared))
        return self.decider.decide_many(
            [
                DecisionInput(p.state, p.questions, p.scoring, Limits(self.max_request_rows, job.cancelled.is_set))
                for p, job in zip(prepared, jobs)
            ]
        )

    # -- format -------------------------------------------------------------------------------

    @staticmethod
    def action(answer: Answer, prepared: Prepared) -> tuple[str | None, float | None]:
        """What the policy says of an answer: auto (its confidence at or above the request's threshold,
        else the profile's) or escalate, with that threshold; (None, None) when no threshold applies."""
        ext, profile = prepared.extension, prepared.profile
        threshold = (
            ext.threshold if ext and ext.threshold is not None else (profile.threshold if profile is not None else None)
        )
        if threshold is not None:
            return ("auto" if answer.confidence >= threshold else "escalate"), threshold
        if profile is not None:
            return "escalate", None  # no threshold met the profile's precision target
        return None, None

    @classmethod
    def _extension_fields(cls, answer: Answer, prepared: Prepared) -> dict[str, Any]:
        profile = prepared.profile
        fields: dict[str, Any] = {
            "label_mass": answer.label_mass,
            "prompt_format": answer.prompt_format,
            "calibrated": profile is not None,
            "probability_bound": answer.probability_bound,
        }
        if profile is not None:
            fields["profile"] = profile.name
            fields["method"] = profile.method_label
        action, threshold = cls.action(answer, prepared)
        if action is not None:
            fields["action"] = action
        if threshold is not None:
            fields["threshold"] = threshold
        if answer.question.type == "predicate":
            fields["confidence"] = answer.confidence
        return fields

    @staticmethod
    def _usage_openai(decision: Decision) -> dict[str, Any]:
        cached = decision.extra.get("cached_tokens", 0)
        return {
            "input_tokens": decision.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": decision.prompt_tokens,
        }

    def format_openai(self, prepared: Prepared, decision: Decision) -> dict[str, Any]:
        answers = []
        for answer, name in zip(decision.answers, prepared.names):
            body: dict[str, Any] = {"type": answer.question.type, "name": name}
            if answer.question.type == "predicate":
                body["probability"] = answer.probability
            elif answer.question.type == "choice":
                body.update(
                    choice=answer.choice,
                    confidence=answer.confidence,
                    probabilities=[{"value": o.value, "probability": o.probability} for o in answer.options],
                )
            else:
                body.update(
                    score=answer.score,
                    confidence=answer.confidence,
                    probabilities=[
                        {"value": o.value, "label": q.text, "probability": o.probability}
                        for o, q in zip(answer.options, answer.question.options)
                    ],
                )
            body.update(self._extension_fields(answer, prepared))
            answers.append(body)
        formats = sorted({answer.prompt_format for answer in decision.answers}) or [PROMPT_FORMAT_VERSION]
        return {
            "object": "decision",
            "model": self.model_name,
            "answers": answers,
            "usage": self._usage_openai(decision),
            "llamadecide": {
                "model_sha256": self.model_sha256(),
                "prompt_format": formats[0] if len(formats) == 1 else formats,
            },
        }

    def format_systemone(
        self, prepared: Prepared, ids: list[str], legends: dict[str, list], decision: Decision
    ) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        for qid, answer in zip(ids, decision.answers):
            if answer.question.type == "predicate":
                body: dict[str, Any] = {"type": "noul", "noul": answer.probability}
            elif answer.question.type == "choice":
                body = {
                    "type": "choice",
                    "choice": answer.choice,
                    "confidence": answer.confidence,
                    "probabilities": {str(o.value): o.probability for o in answer.options},
                }
            else:
                body = {
                    "type": "score",
                    "score": answer.score,
                    "confidence": answer.confidence,
                    "legend": {str(i): level for i, level in enumerate(legends[qid])},
                    "probabilities": {str(o.value): o.probability for o in answer.options},
                }
            if self.systemone_extensions:
                # TypeSafe clients reserve unprefixed names: extensions there carry the x_ prefix.
                body.update({f"x_{key}": value for key, value in self._extension_fields(answer, prepared).items()})
            answers[qid] = body
        body = {
            "model": self.model_name,
            "answers": answers,
            "usage": {"input_tokens": decision.prompt_tokens, "output_tokens": 0},
        }
        if prepared.ignored_fields:  # accepted as the spec asks, never silently
            body["x_ignored_fields"] = list(prepared.ignored_fields)
        return body
