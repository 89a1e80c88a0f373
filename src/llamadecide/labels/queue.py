"""What enters the review queue, and with what chance: every escalated decision (chance 1) and a
uniformly random share of automatic decisions (chance: the audit rate), the person blind to which is
which. The chance is recorded when the item enters, since a refit's guarantee weighs each label by
its inverse (`calibration.certification`). A decision with no action (no threshold applied) is kept
for labels posted by hand but never queued."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llamadecide.decisions import Answer
from llamadecide.labels.records import ReviewItem, state_sha256
from llamadecide.labels.store import LabelStore


@dataclass(frozen=True)
class Served:
    """One answer of a served decision, with what it was served under."""

    request_id: str
    question: str  # the question's name, or its 0-based index
    answer: Answer
    action: str | None  # auto, escalate, or None (no threshold applied)
    task: str | None  # the profile's name
    version: str | None  # the profile's version_id
    state: Any  # the request's input


def draw_for_review(action: str | None, audit_rate: float, rng: random.Random) -> tuple[str, bool, float | None]:
    """(origin, queued, chance) of a decision with this action: an escalation enters the queue with
    chance 1; an automatic decision with chance `audit_rate`, drawn here; anything else never."""
    if action == "escalate":
        return "escalated", True, 1.0
    if action == "auto" and audit_rate > 0 and rng.random() < audit_rate:
        return "audited", True, audit_rate
    return "served", False, None


def served_frame(task: str | None, version: str | None) -> str:
    """The frame of the decisions one profile version served: drawn under one design."""
    return f"served:{task or '-'}:{version or '-'}"


def input_text(state: Any) -> str:
    """The input as a person reads it (and as a refit gives it to the model again)."""
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, default=str)


class ReviewQueue:
    def __init__(
        self,
        store: LabelStore,
        audit_rate: float,
        *,
        rng: random.Random | None = None,
        on_queued: Callable[[Sequence[ReviewItem]], None] | None = None,
    ) -> None:
        """`on_queued` is told of the items that entered the queue (an A2I human loop starts for each)."""
        self.store, self.audit_rate = store, audit_rate
        self.rng = rng or random.SystemRandom()
        self.on_queued = on_queued

    def item(self, served: Served, now: float | None = None) -> ReviewItem:
        """The store's record of one served answer, drawn into the queue (or not) by its action."""
        answer = served.answer
        origin, queued, chance = draw_for_review(served.action, self.audit_rate, self.rng)
        names = tuple(option.text for option in answer.question.options) if answer.question.type == "score" else None
        return ReviewItem(
            id=served.request_id,
            question=served.question,
            kind=answer.question.type,
            instructions=answer.question.instructions,
            options=tuple(option.value for option in answer.options),
            probabilities=tuple(float(p) for p in answer.probabilities),
            confidence=float(answer.confidence),
            input_sha256=state_sha256(served.state),
            origin=origin,
            created=time.time() if now is None else now,
            queued=queued,
            chance=chance,
            frame=served_frame(served.task, served.version),
            input=input_text(served.state) if queued else None,
            task=served.task,
            version=served.version,
            action=served.action,
            option_names=names,
        )

    def keep(self, served: Sequence[Served]) -> list[ReviewItem]:
        """Record a decision's answers (durably: a label may follow at once); returns them."""
        items = [self.item(s) for s in served]
        self.store.record(items)
        queued = [item for item in items if item.queued]
        if queued and self.on_queued is not None:
            self.on_queued(queued)
        return items
