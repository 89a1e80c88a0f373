"""Which items to ask a person about next, each with a known chance, so that every label trains and
every label certifies (weighted by the inverse of its chance: active testing, Kossen et al. 2021).

A round draws from the whole pool, labelled items included (a labelled item drawn again costs
nothing and counts in the round's frame): each item independently, with probability

    pi = min(1, c * ((1 - floor - sure) * gain / sum(gain) + floor / N + sure * automatic / N_automatic))

where `gain` is what labelling the item is worth to the current model (its uncertainty, and how few
labels its predicted option has so far), `floor` a uniform share that bounds every weight (1 /
pi <= N / (c * floor)), and `sure` a share spread evenly over the N_automatic items the current model
expects to handle automatically at the target precision (`automatic`): training wants the uncertain
items, a threshold is certified on the sure ones, and this share is what the draw gives them beyond
the floor (with none expected automatic, it joins the floor); c is set so that the unlabelled items
are expected to give `size` new labels.
Each round is a frame of its own: a Poisson sample of the pool with known chances, which is what
`calibration.certification` weighs. Items a person picks by hand have no chance and never certify."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llamadecide.calibration.config import option
from llamadecide.errors import InvalidRequestError


@dataclass(frozen=True)
class DrawRule:
    size: int = option(10, "New labels a round of draws asks for", "--round-size", min=1)
    floor: float = option(
        0.2, "Uniform share of every draw (bounds each label's weight in a guarantee)", min=0.01, max=1.0
    )
    sure: float = option(
        0.0,
        "Share of every draw spread evenly over the items the current model expects to handle automatically "
        "at the target precision: they certify its threshold, where the uncertain ones teach it",
        "--sure-share",
        min=0.0,
        max=0.99,
    )
    rarity: float = 0.5  # how much an option's scarcity of labels raises its items' gain (an exponent)

    def __post_init__(self) -> None:
        if self.floor + self.sure > 1.0:
            raise InvalidRequestError(
                f"the floor ({self.floor}) and the sure share ({self.sure}) of a draw add up to more than 1"
            )


def gain(P: np.ndarray | None, labels_per_option: np.ndarray, rule: DrawRule) -> np.ndarray:
    """What labelling each pool item is worth: the current model's uncertainty (1 minus its top
    probability), times the scarcity of labels of the option it predicts; 1 everywhere before any
    model (the draw is then uniform)."""
    if P is None:
        return np.ones(0)
    uncertainty = 1.0 - P.max(1) + 1e-3
    scarcity = (1.0 + labels_per_option[P.argmax(1)]) ** -rule.rarity
    return uncertainty * scarcity


def automatic(P: np.ndarray, target: float) -> np.ndarray:
    """The items the current model expects to handle automatically at `target` precision: its surest
    answers, as many as keep their mean confidence (its own estimate of their precision, the
    probabilities being calibrated) at or above the target."""
    conf = P.max(1)
    order = np.argsort(-conf, kind="stable")
    meeting = np.flatnonzero(np.cumsum(conf[order]) / np.arange(1, len(conf) + 1) >= target)
    expected = np.zeros(len(conf), dtype=bool)
    if len(meeting):
        expected[order[: meeting[-1] + 1]] = True
    return expected


def parts(gains: np.ndarray, n: int, rule: DrawRule, sure: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Each of `n` pool items' share of a round by gain, by the floor and by the sure share (they sum
    to 1 over the pool; `gains` empty: the gain's share is uniform; `sure`: the items expected
    automatic, `automatic`, which the sure share is spread over, else it is uniform too)."""
    share = np.full(n, 1.0 / n) if len(gains) == 0 else gains / gains.sum()
    spread = sure / sure.sum() if sure is not None and sure.any() else np.full(n, 1.0 / n)
    return (1.0 - rule.floor - rule.sure) * share, np.full(n, rule.floor / n), rule.sure * spread


def inclusion(gains: np.ndarray, labelled: np.ndarray, rule: DrawRule, sure: np.ndarray | None = None) -> np.ndarray:
    """Each pool item's chance of being drawn this round: its `parts` scaled so that the unlabelled
    items are expected to give `rule.size` new labels."""
    n = len(labelled)
    if n == 0:
        return np.zeros(0)
    base = sum(parts(gains, n, rule, sure))
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
