"""Which items to ask a person about next, each with a known chance, so that every label trains and
every label certifies (weighted by the inverse of its chance: active testing, Kossen et al. 2021).

A round draws from the whole pool, labelled items included (a labelled item drawn again costs
nothing and counts in the round's frame): each item independently, with probability

    pi = min(1, c * ((1 - floor) * gain / sum(gain) + floor / N))

where `gain` is what labelling the item is worth to the current model (its uncertainty, and how few
labels its predicted option has so far) and `floor` a uniform share that bounds every weight (1 /
pi <= N / (c * floor)); c is set so that the unlabelled items are expected to give `size` new labels.
Each round is a frame of its own: a Poisson sample of the pool with known chances, which is what
`calibration.certification` weighs. Items a person picks by hand have no chance and never certify."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DrawRule:
    size: int = 10  # new labels a round is expected to give
    floor: float = 0.2  # the uniform share of every item's chance (the most an item's weight can be)
    rarity: float = 0.5  # how much an option's scarcity of labels raises its items' gain (an exponent)


def gain(P: np.ndarray | None, labels_per_option: np.ndarray, rule: DrawRule) -> np.ndarray:
    """What labelling each pool item is worth: the current model's uncertainty (1 minus its top
    probability), times the scarcity of labels of the option it predicts; 1 everywhere before any
    model (the draw is then uniform)."""
    if P is None:
        return np.ones(0)
    uncertainty = 1.0 - P.max(1) + 1e-3
    scarcity = (1.0 + labels_per_option[P.argmax(1)]) ** -rule.rarity
    return uncertainty * scarcity


def inclusion(gains: np.ndarray, labelled: np.ndarray, rule: DrawRule) -> np.ndarray:
    """Each pool item's chance of being drawn this round (`gains` empty: uniform)."""
    n = len(labelled)
    if n == 0:
        return np.zeros(0)
    share = np.full(n, 1.0 / n) if len(gains) == 0 else gains / gains.sum()
    base = (1.0 - rule.floor) * share + rule.floor / n
    unlabelled = ~labelled
    wanted = min(rule.size, int(unlabelled.sum()))
    if wanted == 0:
        return np.minimum(1.0, base * rule.size / max(base.sum(), 1e-12))
    low, high = 0.0, 1.0
    while np.minimum(1.0, high * base[unlabelled]).sum() < wanted:
        high *= 2.0
    for _ in range(60):  # bisection: the expected new labels are wanted
        middle = (low + high) / 2
        if np.minimum(1.0, middle * base[unlabelled]).sum() < wanted:
            low = middle
        else:
            high = middle
    return np.minimum(1.0, high * base)


def draw(chances: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The items a round takes: each independently with its chance (Poisson sampling)."""
    return np.flatnonzero(rng.random(len(chances)) < chances)
