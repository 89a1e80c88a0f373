"""The precision of automatic decisions in production, from the random audit: the audited decisions
of a profile's served version that people have labelled, each weighted by the inverse of its audit
chance (equal weights at one audit rate: the exact Clopper-Pearson bound), at the profile's
confidence level. It alerts only once enough audits are in for the bound to clear the target at all
(`smallest_passing_sample`): before that a low bound says nothing but "too few audits"."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from llamadecide.calibration.thresholds import smallest_passing_sample, weighted_lower_bound
from llamadecide.labels.store import LabelStore


@dataclass(frozen=True)
class Audit:
    profile: str
    version: str
    labels: int  # audited decisions of this version with a label
    precision: float | None  # their (weighted) share of correct automatic decisions
    lower_bound: float  # its one-sided lower bound at `confidence`
    effective_size: float
    target: float
    confidence: float

    @property
    def needed(self) -> int:
        """Audited labels before the bound could clear the target at all (every one correct)."""
        return smallest_passing_sample(self.target, self.confidence)

    @property
    def state(self) -> str:
        """`too_few_audits`, `ok`, or `below_target` (the lower bound under the target: alert)."""
        if self.effective_size < self.needed:
            return "too_few_audits"
        return "ok" if self.lower_bound >= self.target else "below_target"

    def as_dict(self) -> dict:
        return {**asdict(self), "needed": self.needed, "state": self.state}


def audit(store: LabelStore, profile) -> Audit:
    """The audit of a served profile (a `CalibrationProfile`) from the store's labels."""
    records = store.labelled(task=profile.name, version=profile.version_id, origin="audited")
    correct = np.array([r.correct for r in records], dtype=bool)
    weights = np.array([1.0 / r.item.chance for r in records])
    precision, bound, n = weighted_lower_bound(correct, weights, profile.confidence_level)
    return Audit(
        profile.name,
        profile.version_id,
        len(records),
        precision if records else None,
        bound,
        n,
        profile.target_precision,
        profile.confidence_level,
    )
