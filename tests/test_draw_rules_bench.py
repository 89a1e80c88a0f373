"""The draw-rules benchmark's replay on synthetic hidden states (four well separated options): every
label records the draws the label store would, and each point is certified as `calibrate` certifies
(held out or cross-fitted) and read on the test part."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from benchmarks import draw_rules

from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.variants import VariantScores
from llamadecide.labels.active import DrawRule


def separable_pool(n: int = 1200, k: int = 4, seed: int = 0) -> tuple[VariantScores, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    centres = rng.normal(size=(k, 16)) * 4.0
    hidden = centres[y] + rng.normal(size=(n, 16))
    data = VariantScores(
        L=np.zeros((n, k)),
        lengths=None,
        hidden=hidden,
        content_free=None,
        hidden_only=True,
        inputs=[f"item {i}" for i in range(n)],
    )
    return data, y


@pytest.mark.parametrize("cross_fit", [0, 5])
@pytest.mark.parametrize("rule", [None, DrawRule(size=50, sure=0.5)], ids=["random", "active"])
def test_a_replay_certifies_a_threshold_that_holds_on_the_test_part_held_out_or_cross_fitted(rule, cross_fit):
    data, y = separable_pool()
    pool = draw_rules.pool_for(data, y, start=100, test=400, seed=1)
    run = RunConfig(out_dir=Path("unused"), target_precision=0.9, cross_fit=cross_fit)
    points, counters = draw_rules.replay(pool, rule, run, size=50, max_labels=400, every=100, seed=1)
    assert [p["labels"] for p in points][:1] == [100]
    assert points[-1]["labels"] >= 400
    assert all(p["test_accuracy"] > 0.9 for p in points[1:])
    # Separable options: by 400 labels a threshold is certified, and on the test part it handles most
    # items automatically at the target precision.
    last = points[-1]
    assert last["threshold"] is not None and last["auto_share"] > 0.5
    assert last["true_precision"] >= 0.9
    assert (len(counters) > 0) == (rule is not None)


def test_random_rounds_and_the_start_are_frames_of_equal_chances_and_active_rounds_record_their_chances(monkeypatch):
    data, y = separable_pool()
    pool = draw_rules.pool_for(data, y, start=100, test=400, seed=2)
    recorded = []
    real = draw_rules.certified_point

    def spy(pool, idx, draws, run):
        recorded.append(draws)
        return real(pool, idx, draws, run)

    monkeypatch.setattr(draw_rules, "certified_point", spy)
    run = RunConfig(out_dir=Path("unused"), target_precision=0.9)
    draw_rules.replay(pool, None, run, size=50, max_labels=300, every=100, seed=2)
    frames = {d.frame: set() for item in recorded[-1] for d in item}
    for item in recorded[-1]:
        for d in item:
            frames[d.frame].add(d.chance)
    assert frames == {"start": {100 / len(np.concatenate([pool.start, pool.rest]))}, "random": {1.0}}

    recorded.clear()
    draw_rules.replay(pool, DrawRule(size=50), run, size=50, max_labels=300, every=100, seed=2)
    rounds = {d.frame for item in recorded[-1] for d in item} - {"start"}
    assert rounds and all(name.startswith("round") for name in rounds)
    chances = [d.chance for item in recorded[-1] for d in item if d.frame != "start"]
    assert 0 < min(chances) < max(chances) <= 1  # drawn by gain: unequal, known chances
