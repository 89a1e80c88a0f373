"""Which labelled items may stand in a threshold's guarantee, and with what weight.

A guarantee is only as good as its sample. An item certifies only when the chance that it was
labelled is known: a labelled file taken whole (chance 1), an escalation (every one enters the review
queue: chance 1), an audited automatic decision (the audit rate), an item drawn for labelling with a
recorded probability. Items picked any other way (by hand, or by an ordering that records no chance)
train but never certify.

Items drawn under one design form a *frame* (a labelled file; the decisions one profile version
served, with its threshold and audit rate). Within a frame each item stands for 1/chance items of
that frame's traffic (Horvitz-Thompson), normalised to the frame (Hajek). Every frame estimates the
same traffic, so frames are combined in proportion to their Kish effective sizes: a frame whose
automatic decisions were audited at 2% (each audit standing for 50) counts for what its weights
are worth, not for its raw size. With one frame of equal chances every item weighs 1 and the
guarantee is the exact Clopper-Pearson one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Draw:
    """How an item came to be labelled."""

    chance: float | None  # its probability of having been labelled; None: not drawn at random
    frame: str = "file"  # the design it was drawn under

    @property
    def certifies(self) -> bool:
        return self.chance is not None and 0 < self.chance <= 1


def certification_weights(draws: Sequence[Draw]) -> np.ndarray:
    """Each item's weight in a guarantee: 0 for an item of unknown chance; within its frame its
    inverse chance, scaled so that the frame's weights sum to its effective size."""
    weights = np.zeros(len(draws))
    frames: dict[str, list[int]] = {}
    for i, draw in enumerate(draws):
        if draw.certifies:
            frames.setdefault(draw.frame, []).append(i)
    for members in frames.values():
        inverse = np.array([1.0 / draws[i].chance for i in members])
        effective = inverse.sum() ** 2 / (inverse**2).sum()
        weights[members] = effective * inverse / inverse.sum()
    return weights


def certification_counts(draws: Sequence[Draw]) -> dict:
    """How many items certify and how many only train, and the frames they were drawn in."""
    weights = certification_weights(draws)
    frames: dict[str, dict] = {}
    for draw, weight in zip(draws, weights):
        if draw.certifies:
            frame = frames.setdefault(draw.frame, {"items": 0, "effective_size": 0.0})
            frame["items"] += 1
            frame["effective_size"] += float(weight)
    certifying = int((weights > 0).sum())
    return {
        "certify": certifying,
        "train_only": len(draws) - certifying,
        "effective_size": float(weights.sum()),
        "frames": frames,
    }
