"""Which labelled items certify rather than choose and fit: a share of the items of known chance
held out (simple, or tilted toward the items the drawing model was surer of), or, cross-fitted,
none held out and every one certifying. `steps.fit_and_certify` asks it first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from llamadecide.calibration.certification import (
    Draws,
    certification_counts,
    drawn_confidence,
    held_out,
    of_known_chance,
)
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.thresholds import fewest_tested


@dataclass
class HoldOut:
    """Which labelled items certify rather than choose and fit, and each one's chance of that."""

    held: np.ndarray  # a mask over the items' draws
    chance: np.ndarray  # each item's chance of being held out (0: it only trains)

    def draws(self, draws: Sequence[Draws]) -> list[Draws]:
        """The held-out items' draws, each chance times the chance of being held out: the chance
        the item had of certifying."""
        return [held_out(d, c) for d, c, h in zip(draws, self.chance, self.held) if h]


def hold_out(draws: Sequence[Draws], config: RunConfig) -> HoldOut:
    """Which labelled items certify rather than choose and fit: `certify_share` of the items of known
    chance, drawn by the run's seed. Each keeps a known chance of having been labelled and held out
    (its own times its chance of being held out), and the model certified on them never saw them, so
    the bound is exact for the model served, which out-of-fold probabilities of other models fitted
    on other labels are not. With every item the same chance, a simple random sample (the constant
    chance cancels in each frame's Hajek weights); with `certify_tilt`, items the drawing model was
    surer of (by the rank of their recorded confidence) are held out more and the unsure ones fit
    more, each independently with its chance, which the weights then carry. Items of unknown chance
    only train. Nothing is held out when the share is 0 (certified out of fold) or when fewer items
    than a threshold is tested with would be (then no threshold could be certified on them: every
    label fits, and `certify` certifies none)."""
    known = np.array([of_known_chance(d) for d in draws], dtype=bool)
    if cross_fitting(draws, config):
        return HoldOut(np.zeros(len(draws), dtype=bool), np.zeros(len(draws)))
    chance = np.where(known, config.certify_share, 0.0)
    recorded = np.array([drawn_confidence(d) for d in draws], dtype=float)
    ranked = known & ~np.isnan(recorded)
    lean = config.certify_tilt * min(config.certify_share, 1.0 - config.certify_share)
    tilted = lean > 0 and ranked.sum() >= 2 and np.ptp(recorded[ranked]) > 0
    if tilted:
        quantile = (rankdata(recorded[ranked]) - 0.5) / ranked.sum()
        chance[ranked] = config.certify_share + lean * (2.0 * quantile - 1.0)
    held = np.zeros(len(draws), dtype=bool)
    count = int(round(chance.sum()))  # expected, where tilted
    if count >= fewest_tested(config.target_precision, config.confidence_level) and len(draws) - count >= 2:
        rng = np.random.default_rng(config.seed)
        if tilted:
            held = rng.random(len(draws)) < chance
        else:
            held[rng.choice(np.flatnonzero(known), count, replace=False)] = True
    return HoldOut(held, chance)


def cross_fitting(draws: Sequence[Draws], config: RunConfig) -> bool:
    """Whether the labelled items are cross-fitted (`RunConfig.cross_fit`) rather than a share held
    out: asked for, and enough items of known chance that a threshold could be certified on them
    (with fewer, every label fits one calibration, and none certifies)."""
    known = sum(of_known_chance(d) for d in draws)
    return config.cross_fit >= 2 and known >= max(fewest_tested(config.target_precision, config.confidence_level), 2)


def held_out_counts(draws: Sequence[Draws], split: HoldOut) -> dict:
    """`certification.certification_counts` of the labelled items, with those held out certifying
    and the rest training only (with nothing held out, as drawn)."""
    if not split.held.any():
        return {**certification_counts(list(draws)), "held_out": 0}
    counted = certification_counts(split.draws(draws))
    return {**counted, "train_only": int(len(draws) - counted["certify"]), "held_out": int(split.held.sum())}
