"""The people in the loop over HTTP, testable without it: served decisions into the label store
and its review queue, labels in (`POST /v1/labels`), the queue out (`GET /v1/reviews`), and the
audited precision of each served profile."""

from __future__ import annotations

from collections.abc import Iterable

from llamadecide.decisions import Decision
from llamadecide.labels.audit import Audit, audit
from llamadecide.labels.queue import ReviewQueue, Served
from llamadecide.labels.records import Label, ReviewItem
from llamadecide.labels.store import LabelStore
from llamadecide.server.decision_serving import DecisionServing, Prepared
from llamadecide.server.protocol.labels import LabelsRequest


def question_key(name: str | None, index: int) -> str:
    """How a label names a question: its name, or its 0-based index when it has none."""
    return name if name is not None else str(index)


class ReviewServing:
    def __init__(self, store: LabelStore, queue: ReviewQueue) -> None:
        self.store, self.queue = store, queue

    def served(self, request_id: str, prepared: Prepared, decision: Decision) -> list[Served]:
        profile = prepared.profile
        return [
            Served(
                request_id,
                question_key(name, index),
                answer,
                DecisionServing.action(answer, prepared)[0],
                profile.name if profile is not None else None,
                profile.version_id if profile is not None else None,
                prepared.state,
            )
            for index, (answer, name) in enumerate(zip(decision.answers, prepared.names))
        ]

    def keep(self, request_id: str, prepared: Prepared, decision: Decision) -> list[ReviewItem]:
        """Record a served decision; escalations and the audited share enter the review queue."""
        return self.queue.keep(self.served(request_id, prepared, decision))

    def add_labels(self, body: LabelsRequest, source: str = "api") -> int:
        """Every label of the body or none (404 for an unknown decision, 422 for an undeclared label)."""
        return self.store.add_labels(
            [Label(label.id, str(label.question), label.label, source) for label in body.labels]
        )

    def reviews(self, *, limit: int, profile: str | None = None) -> dict:
        """The items still waiting for a label, oldest first, as a person sees them: nothing says
        whether an item was escalated or drawn for the audit."""
        return {
            "object": "list",
            "data": [review_view(item) for item in self.store.pending(limit=limit, task=profile)],
        }

    def audits(self, profiles: Iterable) -> list[Audit]:
        return [audit(self.store, profile) for profile in profiles]


def review_view(item: ReviewItem) -> dict:
    """One queued item for a reviewer or a team's own tool."""
    return {
        "id": item.id,
        "question": item.question,
        "type": item.kind,
        "instructions": item.instructions,
        "input": item.input,
        "options": list(item.options),
        "option_names": list(item.option_names or [str(o).lower() if isinstance(o, bool) else o for o in item.options]),
        "probabilities": list(item.probabilities),
        "profile": item.task,
    }
