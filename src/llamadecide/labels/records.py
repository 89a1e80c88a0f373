"""What the label store holds: the items people may label (a served decision's question, or an item
of a file drawn for labelling), the labels they give, and how each item came to be reviewed.

An item *certifies* (may stand in a threshold's guarantee) only when it entered the review queue by
a draw of known probability (`chance`): an escalation (1), an audited automatic decision (the audit
rate), an item drawn from a file. Every labelled item with its input *trains*."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

# How an item came to be in the store.
Origin = Literal[
    "escalated",  # its action was escalate: it enters the queue with chance 1
    "audited",  # an automatic decision drawn for the random audit: chance = the audit rate
    "served",  # an automatic decision not drawn, or one without an action: never queued
    "drawn",  # an item of a file drawn for labelling with a recorded chance (`llamadecide label`)
    "picked",  # put in the queue by hand: trains, never certifies
    "file",  # an item of a labelled file taken whole (every item labelled: chance 1)
]


def state_sha256(state: object) -> str:
    """The hash of a request's input that the probability log and the store keep for automatic
    decisions (joins two runs on the same items without writing the caller's text to disk)."""
    text = state if isinstance(state, str) else json.dumps(state, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


@dataclass(frozen=True)
class ReviewItem:
    """One question of one decision (or one item of a file), as the store keeps it."""

    id: str  # the decision's request id, or the file item's id
    question: str  # the question's name, or its 0-based index when it has none
    kind: str  # choice, predicate or score
    instructions: str
    options: tuple[Any, ...]  # the declared option values, as answers carry them
    probabilities: tuple[float, ...]
    confidence: float
    input_sha256: str
    origin: Origin
    created: float
    queued: bool = False  # in the review queue (a person is asked for its label)
    chance: float | None = None  # probability it entered the queue; None: not a random draw
    frame: str = ""  # items drawn under one design (a served profile version, a file): see certification
    input: str | None = None  # its input text: kept only while queued or labelled, within the retention
    task: str | None = None  # the profile it was served with (the task its labels train)
    version: str | None = None  # that profile's version
    action: str | None = None  # auto or escalate, when a threshold applied
    option_names: tuple[str, ...] | None = None  # what a person reads for each option (a score's levels)

    @property
    def key(self) -> tuple[str, str]:
        return (self.id, self.question)

    @property
    def chosen(self) -> Any:
        return self.options[max(range(len(self.options)), key=self.probabilities.__getitem__)]

    @property
    def certifies(self) -> bool:
        """Whether its label may stand in a guarantee: drawn into the queue with a known chance."""
        return self.queued and self.chance is not None and 0 < self.chance <= 1

    def option_for(self, label: Any) -> Any:
        """The declared option a label names (the value itself, or a score's level name), or None."""
        for value in self.options:
            if _same(value, label):
                return value
        for value, name in zip(self.options, self.option_names or ()):
            if isinstance(label, str) and label == name:
                return value
        return None


def _same(value: Any, label: Any) -> bool:
    """Equal as JSON: true is not 1, "1" is not 1."""
    return type(value) is type(label) and value == label


@dataclass(frozen=True)
class Label:
    id: str
    question: str
    label: Any  # one of the item's declared option values
    source: str = "api"  # api, review page, a2i, file, simulation
    created: float = 0.0


@dataclass(frozen=True)
class LabelledRecord:
    """An item with its current label."""

    item: ReviewItem
    label: Any
    labelled: float  # when the current label was given
    draws: tuple[tuple[str, float], ...] = ()  # every draw of known chance that took it: (frame, chance)

    @property
    def correct(self) -> bool:
        """Whether the decision's top option was the label."""
        return _same(self.item.chosen, self.label)
