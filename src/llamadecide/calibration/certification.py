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
    # The drawing model's confidence in its answer for the item, where recorded: known before the
    # label, so a design may depend on it (`holdout.hold_out` holds out the sure items to certify).
    confidence: float | None = None

    @property
    def certifies(self) -> bool:
        return self.chance is not None and 0 < self.chance <= 1


Draws = Draw | tuple[Draw, ...]  # an item's draws: one, or every time it was drawn (a labelling round's frame each)


def _draws(item: Draws) -> tuple[Draw, ...]:
    return item if isinstance(item, tuple) else (item,)


def of_known_chance(item: Draws) -> bool:
    """Whether an item was drawn at least once with a known chance (and so may certify)."""
    return any(draw.certifies for draw in _draws(item))


def drawn_confidence(item: Draws) -> float | None:
    """The confidence recorded with the item's first certifying draw (None: none recorded)."""
    return next((d.confidence for d in _draws(item) if d.certifies and d.confidence is not None), None)


def held_out(item: Draws, chance: float) -> tuple[Draw, ...]:
    """An item's draws once it was also held out with `chance`: each certifying draw's chance times it."""
    return tuple(Draw(d.chance * chance, d.frame, d.confidence) if d.certifies else d for d in _draws(item))


def _frames(items: Sequence[Draws]) -> dict[str, list[tuple[int, float]]]:
    """Each frame's certifying draws: (item, chance)."""
    frames: dict[str, list[tuple[int, float]]] = {}
    for i, item in enumerate(items):
        for draw in _draws(item):
            if draw.certifies:
                frames.setdefault(draw.frame, []).append((i, draw.chance))
    return frames


def _effective_size(inverse: np.ndarray) -> float:
    return float(inverse.sum() ** 2 / (inverse**2).sum())


def certification_weights(items: Sequence[Draws]) -> np.ndarray:
    """Each item's weight in a guarantee: 0 for an item of unknown chance; within each frame it was
    drawn in, its inverse chance, scaled so that the frame's weights sum to its effective size (an
    item drawn in several frames adds its weight in each)."""
    weights = np.zeros(len(items))
    for entries in _frames(items).values():
        inverse = np.array([1.0 / chance for _, chance in entries])
        np.add.at(weights, [i for i, _ in entries], _effective_size(inverse) * inverse / inverse.sum())
    return weights


def certification_counts(items: Sequence[Draws]) -> dict:
    """How many items certify and how many only train, and the frames they were drawn in."""
    weights = certification_weights(items)
    frames = {
        name: {
            "items": len({i for i, _ in entries}),
            "effective_size": _effective_size(np.array([1.0 / chance for _, chance in entries])),
        }
        for name, entries in _frames(items).items()
    }
    certifying = int((weights > 0).sum())
    return {
        "certify": certifying,
        "train_only": len(items) - certifying,
        "effective_size": float(weights.sum()),
        "frames": frames,
    }
