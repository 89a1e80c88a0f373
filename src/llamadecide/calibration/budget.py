"""What a calibration run scores within its row budget: which variants, and for a many-option
question whose answers cost more than its prompt, answers on a subsample and hidden states on every
item."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llamadecide.calibration.variants import Variant


@dataclass(frozen=True)
class ScoringPlan:
    """What a run scores within its row budget: each variant's answers for the items in `answered`
    (every used item, or a subsample), and in `hidden_variants`, hidden states for every used item
    (a head on the hidden state alone needs nothing else)."""

    answered: dict[Variant, np.ndarray]
    hidden_variants: tuple[Variant, ...]
    rows: int  # the estimated evaluated rows
    left_out: tuple[Variant, ...] = ()


def plan_scoring(
    variants: list[Variant],
    costs: dict[Variant, tuple[float, float]],
    used: np.ndarray,
    split_parts: tuple[np.ndarray, ...],
    budget: int,
    hidden_wanted: set[Variant],
    seed: int,
    *,
    min_answered: int = 100,
) -> ScoringPlan:
    """Spend at most `budget` (weighted) evaluated rows. Everything on every item when it fits.
    Otherwise each variant costs the cheaper of its answers on every item, or (when a head on its
    hidden state is wanted and its answer trie costs more than its prompt) its answers on a seeded
    subsample of `min_answered` items, calibration and test parts alike, and its hidden state alone on
    the rest; variants are taken cheapest first while the budget lasts, at least one. costs: per
    item, (answers, hidden state alone)."""
    n = len(used)
    if sum(costs[v][0] for v in variants) * n <= budget:
        return ScoringPlan({v: used for v in variants}, (), int(sum(costs[v][0] for v in variants) * n))
    m = min(n, min_answered)
    rng = np.random.default_rng(seed)
    answered = np.sort(
        np.concatenate([rng.permutation(part)[: max(1, round(m * len(part) / n))] for part in split_parts])
    )
    options: dict[Variant, tuple[float, bool]] = {}  # variant -> (cost, answers on the subsample only)
    for v in variants:
        everything = costs[v][0] * n
        sampled = costs[v][0] * len(answered) + costs[v][1] * (n - len(answered))
        use_sample = v in hidden_wanted and sampled < everything and costs[v][0] > 1.5 * costs[v][1]
        options[v] = (sampled, True) if use_sample else (everything, False)
    spent, chosen = 0.0, []
    for v in sorted(variants, key=lambda v: options[v][0]):
        if not chosen or spent + options[v][0] <= budget:
            chosen.append(v)
            spent += options[v][0]
    return ScoringPlan(
        {v: (answered if options[v][1] else used) for v in variants if v in chosen},
        tuple(v for v in variants if v in chosen and options[v][1]),
        int(spent),
        tuple(v for v in variants if v not in chosen),
    )
