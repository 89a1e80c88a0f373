"""Which labels certify a threshold, and with what weight: an item picked by hand never counts, an
escalation counts 1, an audit counts the inverse of its chance; the weighted bound reduces to the
exact Clopper-Pearson bound when every weight is equal, and covers the truth on weighted samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fake_backend import OPTIONS, SubsampleBackend, compass_task, fake_run_config
from llamadecide.calibration.certification import Draw, certification_counts, certification_weights
from llamadecide.calibration.thresholds import clopper_pearson_lower, select_threshold, weighted_lower_bound


def test_an_item_picked_by_hand_never_certifies():
    weights = certification_weights([Draw(1.0, "f"), Draw(None, "f"), Draw(None, "served:t:v1")])
    assert weights[1] == 0 and weights[2] == 0 and weights[0] > 0
    counts = certification_counts([Draw(1.0, "f"), Draw(None, "f")])
    assert (counts["certify"], counts["train_only"]) == (1, 1)


def test_an_audit_weighs_the_inverse_of_its_chance_against_an_escalation():
    draws = [Draw(1.0, "served:t:v1")] * 3 + [Draw(0.02, "served:t:v1")] * 2
    weights = certification_weights(draws)
    assert weights[3] / weights[0] == pytest.approx(50.0)  # 1 / 0.02 against 1 / 1
    # The frame's weights sum to its Kish effective size: (3 + 100)^2 / (3 + 2 * 2500).
    assert weights.sum() == pytest.approx(103**2 / 5003)


def test_a_picked_item_or_an_unweighted_audit_would_change_the_threshold():
    """The certified threshold moves when an audit loses its weight or a picked item is counted:
    here, 58 escalations all right at low confidence and one audit wrong at high confidence."""
    rng = np.random.default_rng(0)
    conf = np.concatenate([rng.uniform(0.96, 1.0, 200), [0.99]])
    correct = np.concatenate([np.ones(200, bool), [False]])
    draws = [Draw(1.0, "file")] * 200 + [Draw(0.02, "file")]
    honest = select_threshold(conf, correct, target=0.95, confidence_level=0.95, weights=certification_weights(draws))
    unweighted = select_threshold(conf, correct, target=0.95, confidence_level=0.95)
    assert unweighted is not None and (honest is None or honest.threshold > unweighted.threshold)


def test_equal_weights_give_the_exact_clopper_pearson_bound():
    for k, n in ((0, 10), (9, 10), (57, 60), (100, 100)):
        correct = np.array([True] * k + [False] * (n - k))
        precision, bound, size = weighted_lower_bound(correct, np.ones(n), 0.95)
        assert (precision, size) == (pytest.approx(k / n), pytest.approx(n))
        assert bound == pytest.approx(clopper_pearson_lower(k, n, 0.95), abs=1e-12)


def test_with_one_frame_of_chance_1_the_guarantee_is_the_unweighted_one():
    rng = np.random.default_rng(1)
    conf = rng.uniform(0.5, 1.0, 400)
    correct = rng.uniform(size=400) < conf
    weights = certification_weights([Draw(1.0, "file")] * 400)
    assert np.all(weights == 1.0)
    plain = select_threshold(conf, correct, target=0.9, confidence_level=0.95)
    weighted = select_threshold(conf, correct, target=0.9, confidence_level=0.95, weights=weights)
    assert plain.threshold == weighted.threshold and plain.lower_bound == pytest.approx(weighted.lower_bound)


def test_the_weighted_bound_covers_the_truth_on_audited_samples():
    """Traffic whose automatic share is audited at 5% and escalations at 100%: over many draws the
    weighted bound at 95% is above the true precision of automatic decisions in at most 5% of them."""
    rng = np.random.default_rng(2)
    misses, trials = 0, 400
    for _ in range(trials):
        n = 4000
        auto = rng.uniform(size=n) < 0.7
        correct = np.where(auto, rng.uniform(size=n) < 0.93, rng.uniform(size=n) < 0.6)
        truth = correct[auto].mean()
        chance = np.where(auto, 0.05, 1.0)
        labelled = rng.uniform(size=n) < chance
        draws = [Draw(float(c), "served") for c in chance[labelled]]
        weights = certification_weights(draws)
        mask = auto[labelled]
        _, bound, _ = weighted_lower_bound(correct[labelled][mask], weights[mask], 0.95)
        misses += bound > truth
    assert misses / trials <= 0.05


def test_an_active_round_draws_with_the_chances_it_records_and_the_floor_bounds_every_weight():
    from llamadecide.labels.active import DrawRule, draw, gain, inclusion

    rng = np.random.default_rng(4)
    P = rng.dirichlet(np.ones(5) * 0.5, 400)
    labelled = np.zeros(400, bool)
    labelled[:50] = True
    rule = DrawRule(size=20, floor=0.2)
    chances = inclusion(gain(P, np.zeros(5), rule), labelled, rule)
    assert chances[~labelled].sum() == pytest.approx(20, rel=1e-6)  # the new labels a round asks for
    assert chances.min() >= 0.2 * 20 / 400 / 2  # the floor: no weight beyond a bound
    uncertain = 1 - P.max(1)
    assert chances[uncertain.argmax()] > chances[uncertain.argmin()]
    counts = np.zeros(400)
    for _ in range(3000):
        counts[draw(chances, rng)] += 1
    assert np.abs(counts / 3000 - chances).max() < 0.05  # drawn with exactly the chances recorded


def test_the_sure_share_draws_the_items_expected_automatic_more_and_keeps_the_round_size():
    from llamadecide.labels.active import DrawRule, automatic, gain, inclusion

    rng = np.random.default_rng(6)
    P = rng.dirichlet(np.ones(4) * 0.3, 500)
    conf = P.max(1)
    sure = automatic(P, 0.9)
    # The surest answers, as many as keep their mean confidence at the target: one more would not.
    assert 0 < sure.sum() < 500 and conf[sure].min() >= conf[~sure].max()
    assert conf[sure].mean() >= 0.9 > np.sort(conf)[::-1][: sure.sum() + 1].mean()
    labelled = np.zeros(500, bool)
    labelled[:40] = True
    plain, with_sure = DrawRule(size=25, floor=0.2), DrawRule(size=25, floor=0.2, sure=0.5)
    before = inclusion(gain(P, np.zeros(4), plain), labelled, plain, sure)
    after = inclusion(gain(P, np.zeros(4), with_sure), labelled, with_sure, sure)
    assert after[~labelled].sum() == pytest.approx(25, rel=1e-6)
    assert after[sure].mean() > 2 * before[sure].mean()
    assert after[sure].min() >= 0.5 * 25 / sure.sum() / 2  # spread evenly over them (at least their share)
    # Expected automatic: none -> the sure share is uniform, like the floor.
    none = inclusion(np.ones(500), labelled, with_sure, np.zeros(500, bool))
    assert np.ptp(none) == pytest.approx(0, abs=1e-12)


def test_a_draw_whose_floor_and_sure_share_exceed_the_whole_is_refused():
    from llamadecide.errors import InvalidRequestError
    from llamadecide.labels.active import DrawRule

    with pytest.raises(InvalidRequestError, match="more than 1"):
        DrawRule(floor=0.6, sure=0.5)
    assert DrawRule(floor=0.5, sure=0.5).sure == 0.5


def test_active_draws_certify_honestly():
    """A pool whose model is sure where it is right: rounds drawn by uncertainty (most labels where
    it errs) and weighted by their chances estimate the precision of the confident answers without
    the bias that counting them plainly has."""
    from llamadecide.labels.active import DrawRule, draw, gain, inclusion

    rng = np.random.default_rng(5)
    n = 3000
    conf = rng.uniform(0.3, 1.0, n)
    correct = rng.uniform(size=n) < conf
    P = np.stack([conf, 1 - conf], 1)
    truth = correct[conf >= 0.8].mean()
    weighted_misses, plain_errors = 0, []
    for _ in range(200):
        labelled = np.zeros(n, bool)
        draws: dict[int, list[Draw]] = {}
        for round_ in range(10):
            rule = DrawRule(size=30, floor=0.2)
            chances = inclusion(gain(P, np.zeros(2), rule), labelled, rule)
            for i in draw(chances, rng):
                draws.setdefault(int(i), []).append(Draw(float(chances[i]), f"round{round_}"))
                labelled[i] = True
        idx = np.array(sorted(draws))
        weights = certification_weights([tuple(draws[i]) for i in idx])
        mask = conf[idx] >= 0.8
        _, bound, _ = weighted_lower_bound(correct[idx][mask], weights[mask], 0.95)
        weighted_misses += bound > truth
        plain_errors.append(correct[idx][mask].mean() - truth)
    assert weighted_misses / 200 <= 0.05
    # Counted plainly, the confident items a draw by uncertainty took are the least sure of them.
    assert np.mean(plain_errors) < -0.005


def _run_config(**fields):
    return fake_run_config(Path("unused"), **fields)


def test_held_out_items_are_a_uniform_share_of_those_of_known_chance_and_never_picked_ones():
    from llamadecide.calibration.holdout import hold_out

    draws = [(Draw(1.0, "file"),)] * 60 + [(Draw(None, "served:t:v1"),)] * 40 + [(Draw(0.02, "served:t:v1"),)] * 100
    held = np.array([hold_out(draws, _run_config(seed=seed, target_precision=0.9)).held for seed in range(400)])
    assert (held.sum(1) == 80).all()  # half of the 160 of known chance, every time
    assert not held[:, 60:100].any()  # an item picked by hand only trains
    # Each item of known chance is held out with the same chance, whatever its own.
    assert np.abs(held[:, :60].mean(0) - 0.5).max() < 0.1 and np.abs(held[:, 100:].mean(0) - 0.5).max() < 0.1
    assert not hold_out(draws, _run_config(certify_share=0.0, target_precision=0.9)).held.any()


def test_a_tilted_hold_out_holds_out_the_items_the_drawing_model_was_surest_of_more_each_with_its_chance():
    from llamadecide.calibration.holdout import hold_out

    recorded = np.linspace(0.0, 1.0, 200)
    draws = (
        [(Draw(0.1, "round1", c),) for c in recorded]
        + [(Draw(1.0, "file"),)] * 50  # no confidence recorded: the share
        + [(Draw(None, "picked", 0.9),)] * 30  # picked by hand: never
    )
    splits = [hold_out(draws, _run_config(seed=seed, target_precision=0.9, certify_tilt=0.6)) for seed in range(400)]
    chance = splits[0].chance
    # By rank: from 0.5 - 0.6 * 0.5 for the least sure to 0.5 + 0.6 * 0.5 for the surest, 0.5 on average.
    assert chance[0] == pytest.approx(0.2, abs=0.01) and chance[199] == pytest.approx(0.8, abs=0.01)
    assert np.all(np.diff(chance[:200]) > 0) and chance[:200].mean() == pytest.approx(0.5)
    assert (chance[200:250] == 0.5).all() and (chance[250:] == 0).all()
    held = np.array([split.held for split in splits])
    assert np.abs(held.mean(0)[:250] - chance[:250]).max() < 0.1  # 400 draws: 4 standard errors
    assert not held[:, 250:].any()
    # A held-out item certifies with its chance of being labelled times that of being held out.
    first = splits[0]
    expected = [draws[i][0].chance * chance[i] for i in np.flatnonzero(first.held)]
    assert [d[0].chance for d in first.draws(draws)] == pytest.approx(expected)


def test_a_tilted_hold_out_weighted_by_its_chances_estimates_the_pools_precision():
    """Items a model was sure of are more often right and, tilted, more often held out: counted
    plainly the held-out items read optimistic; weighted by the inverse of their chances they
    estimate the precision of the whole pool."""
    from llamadecide.calibration.holdout import hold_out

    rng = np.random.default_rng(0)
    recorded = rng.uniform(size=600)
    correct = rng.uniform(size=600) < 0.5 + 0.5 * recorded
    draws = [(Draw(1.0, "file", c),) for c in recorded]
    plain, weighted = [], []
    for seed in range(300):
        split = hold_out(draws, _run_config(seed=seed, target_precision=0.9, certify_tilt=0.9))
        weights, right = certification_weights(split.draws(draws)), correct[split.held]
        plain.append(right.mean() - correct.mean())
        weighted.append((weights * right).sum() / weights.sum() - correct.mean())
    assert np.mean(plain) > 0.04  # about 0.07 by the chances' design
    assert abs(np.mean(weighted)) < 0.01


def test_too_few_items_to_hold_out_fit_every_label_and_certify_nothing():
    """At precision 0.95 a threshold is tested with 118 automatic items at least: 80 held out could
    never certify, so none are held out, and out-of-fold probabilities, which read optimistic, do not
    certify in their place (while a share of 0 asks for them)."""
    from llamadecide.calibration.holdout import hold_out
    from llamadecide.calibration.steps import Evidence, certify

    draws = [(Draw(1.0, "file"),)] * 160
    assert not hold_out(draws, _run_config(target_precision=0.95)).held.any()
    P = np.full((160, 2), 0.01)
    P[:, 0] = 0.99  # every item sure and right: out of fold, this would certify
    out_of_fold = Evidence(np.arange(160), P, np.zeros(160, int), np.ones(160), "out of fold")
    assert certify(out_of_fold, _run_config(target_precision=0.95)).threshold is None
    assert certify(out_of_fold, _run_config(target_precision=0.95, certify_share=0.0)).threshold is not None


def test_the_labels_a_target_needs_are_counted_in_labels_of_which_only_the_held_out_share_certifies():
    """calibrate's (and the label page's) estimate of the labels a target needs counts every label:
    100 held-out items of 200 labels need twice the labels the same 100 items would alone, and
    while too few are held out (out of fold on every label), the share that will certify counts."""
    from llamadecide.calibration.steps import Evidence, certify

    def evidence(n, part):
        P = np.tile([0.97, 0.03], (n, 1))
        return Evidence(np.arange(n), P, (np.arange(n) % 25 == 0).astype(int), np.ones(n), part)

    config = _run_config(target_precision=0.95)
    alone = certify(evidence(100, "held out"), config).reachable["labels_needed"]
    held = certify(evidence(100, "held out"), config, labels=200).reachable["labels_needed"]
    assert abs(held["labelled"] - 2 * alone["labelled"]) <= 1 and held["more"] == held["labelled"] - 200 > 0
    every = certify(evidence(160, "out of fold"), config).reachable["labels_needed"]
    half_to_certify = certify(evidence(160, "out of fold"), config, labels=160).reachable["labels_needed"]
    assert abs(half_to_certify["labelled"] - 2 * every["labelled"]) <= 1


def test_a_threshold_is_certified_on_the_served_models_probabilities_for_items_it_never_fitted(tmp_path):
    """The evidence a threshold is certified on: the held-out items, none of them fitted, with the
    fitted (served) calibrator's own probabilities for them, not out-of-fold ones."""
    from llamadecide.calibration.data import LabelledItem
    from llamadecide.calibration.selection import apply_variant
    from llamadecide.calibration.steps import fit_and_certify, score_items

    task = compass_task()
    items = [LabelledItem(str(i), f"item {i}", OPTIONS[i % 4], (Draw(1.0, "file"),)) for i in range(200)]
    truth = {it.text: i % 4 for i, it in enumerate(items)}
    # 100 held out: enough to be tested at 0.9 (58), not at 0.95 (118)
    config = fake_run_config(tmp_path, calibration_size=200, test_size=0, target_precision=0.9)
    y = np.arange(200) % 4
    idx = np.arange(200)
    scored, _ = score_items(SubsampleBackend(truth, informative=True), task, items, (idx, idx[:0]), y, config)
    steps = fit_and_certify(scored, idx, [it.draws for it in items], y, config)
    data, fit, found = steps.data, steps.fit, steps.found
    assert found.part == "held out" and len(found.items) == 100
    assert not np.isin(found.items, fit.fit_on).any()
    np.testing.assert_allclose(found.P, apply_variant(fit.calibrator, data, found.items))
    assert (found.weights == 1.0).all() and (found.y == y[found.items]).all()


def test_cross_fitted_every_label_certifies_with_the_probabilities_served_for_it(tmp_path):
    """Cross-fitted, nothing is held out: every labelled item certifies, with the probabilities the
    served (cross-fitted) calibrator gives it, which come from the fold its input routes to, fitted
    without that fold's items."""
    from llamadecide.calibration.calibrators import CrossFitted
    from llamadecide.calibration.data import LabelledItem
    from llamadecide.calibration.selection import apply_variant, fit_variant
    from llamadecide.calibration.steps import fit_and_certify, score_items

    task = compass_task()
    items = [LabelledItem(str(i), f"item {i}", OPTIONS[i % 4], (Draw(1.0, "file"),)) for i in range(200)]
    truth = {it.text: i % 4 for i, it in enumerate(items)}
    config = fake_run_config(tmp_path, calibration_size=200, test_size=0, target_precision=0.9, cross_fit=5)
    y = np.arange(200) % 4
    idx = np.arange(200)
    scored, _ = score_items(SubsampleBackend(truth, informative=True), task, items, (idx, idx[:0]), y, config)
    steps = fit_and_certify(scored, idx, [it.draws for it in items], y, config)
    data, fit, found = steps.data, steps.fit, steps.found
    assert not steps.split.held.any() and steps.counts["held_out"] == 0
    assert isinstance(fit.calibrator, CrossFitted) and len(fit.calibrator.folds) == 5
    assert found.part == "cross-fitted" and sorted(found.items) == list(idx)
    np.testing.assert_allclose(found.P, apply_variant(fit.calibrator, data, found.items))
    routes = data.routes(found.items, 5)
    for k in range(5):
        without = fit_variant(fit.candidate, data, found.items[routes != k], y[found.items[routes != k]])
        np.testing.assert_allclose(found.P[routes == k], apply_variant(without, data, found.items[routes == k]))
    assert steps.certified.threshold is not None  # 200 labels of an informative task clear 0.9


def test_too_few_items_to_certify_are_not_cross_fitted():
    """Below the items a threshold is tested with, cross-fitting is not done: every label fits one
    calibration (as with nothing held out), and none certifies."""
    from llamadecide.calibration.holdout import cross_fitting

    config = _run_config(target_precision=0.95, cross_fit=5)
    assert not cross_fitting([(Draw(1.0, "file"),)] * 100, config)
    assert cross_fitting([(Draw(1.0, "file"),)] * 200, config)
    assert not cross_fitting([(Draw(1.0, "file"),)] * 200, _run_config(target_precision=0.95))
    with pytest.raises(Exception, match="two folds"):
        _run_config(cross_fit=1)
