import numpy as np
import pytest
from scipy.stats import binomtest

from llamadecide.calibration.thresholds import (
    clopper_pearson_lower,
    conformal_quantile,
    conformal_report,
    evaluate_threshold,
    select_threshold,
    smallest_passing_sample,
)


def test_clopper_pearson_matches_scipy():
    for k, n in [(95, 100), (50, 60), (1, 1), (999, 1000)]:
        expected = (
            binomtest(k, n).proportion_ci(confidence_level=0.90, method="exact").low
        )  # two-sided 90% = one-sided 95%
        assert clopper_pearson_lower(k, n, 0.95) == pytest.approx(expected, abs=1e-9)
    assert clopper_pearson_lower(0, 10, 0.95) == 0.0


def test_picks_the_loosest_threshold_that_passes_in_sequence():
    conf = np.array([0.99] * 200 + [0.7] * 200 + [0.3] * 200)
    correct = np.array([True] * 200 + [True] * 196 + [False] * 4 + [False] * 200)
    result = select_threshold(conf, correct, target=0.9, confidence_level=0.95)
    # every grid value in (0.3, 0.7] auto-handles the same 400 items: the loosest of them is chosen
    assert result.threshold == 0.31 and result.auto == 400 and result.precision == pytest.approx(396 / 400)
    assert result.lower_bound >= 0.9
    assert select_threshold(np.full(100, 0.9), np.zeros(100, bool), target=0.9, confidence_level=0.95) is None


def test_too_few_items_to_ever_pass_are_not_tested():
    assert smallest_passing_sample(0.9, 0.95) == 29  # 0.05 ** (1 / 29) >= 0.9 > 0.05 ** (1 / 28)
    conf = np.array([0.99] * 5 + [0.8] * 300)
    correct = np.array([False] * 5 + [True] * 300)  # five confident mistakes alone cannot stop the sequence
    result = select_threshold(conf, correct, target=0.9, confidence_level=0.95)
    assert result is not None and result.auto == 305


def test_sequence_stops_at_the_first_failure():
    # a bad region at high confidence blocks looser thresholds even if they look fine overall
    conf = np.array([0.95] * 100 + [0.5] * 1000)
    correct = np.array([False] * 100 + [True] * 1000)
    assert select_threshold(conf, correct, target=0.9, confidence_level=0.95) is None


def _calibrated_world(rng, n):
    conf = rng.beta(5, 2, n)  # confidence values, and the chance of being right equals them
    return conf, rng.uniform(size=n) < conf


def test_test_precision_misses_target_no_more_often_than_the_error_level():
    """200 re-splits of data with known calibration: the chosen threshold's precision on a fresh
    test part falls below the target at most delta = 5% of the time. The test part is large
    (200,000 items) so that it measures the threshold, not its own sampling noise."""
    rng = np.random.default_rng(0)
    target, delta, misses, chosen = 0.8, 0.05, 0, 0
    for _ in range(200):
        conf_cal, correct_cal = _calibrated_world(rng, 1000)
        result = select_threshold(conf_cal, correct_cal, target=target, confidence_level=1 - delta)
        if result is None:
            continue
        chosen += 1
        conf_test, correct_test = _calibrated_world(rng, 200_000)
        test = evaluate_threshold(conf_test, correct_test, result.threshold)
        if test["precision"] is not None and test["precision"] < target:
            misses += 1
    assert chosen > 150
    assert misses / 200 <= delta


def test_conformal_sets_cover_at_the_stated_rate():
    rng = np.random.default_rng(3)

    def world(n):
        logits = rng.normal(0, 2, (n, 5))
        P = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        y = np.array([rng.choice(5, p=p) for p in P])
        return P, y

    P_cal, y_cal = world(2000)
    P_test, y_test = world(4000)
    qhat = conformal_quantile(P_cal, y_cal, alpha=0.1)
    report = conformal_report(P_test, y_test, qhat)
    assert 0.88 <= report["coverage"] <= 0.93
    assert 1 <= report["mean_set_size"] <= 5 and 0 <= report["singleton_rate"] <= 1


def test_an_unreachable_target_says_what_is_reachable_and_what_it_would_take():
    from llamadecide.calibration.report import reachable_lines
    from llamadecide.calibration.thresholds import clopper_pearson_lower, reachable

    # 120 items: the 40 most confident are all right, the rest right 70% of the time
    conf = np.concatenate([np.linspace(0.99, 0.9, 40), np.linspace(0.85, 0.3, 80)])
    correct = np.concatenate([np.ones(40, bool), np.arange(80) % 10 < 7])
    assert select_threshold(conf, correct, target=0.95, confidence_level=0.95) is None  # 40 of 40 is not enough
    found = reachable(conf, correct, target=0.95, confidence_level=0.95)
    at = {row["precision"]: row for row in found["at_precision"]}
    assert at[0.8]["coverage"] >= 40 / 120 and at[0.95]["threshold"] is None
    need = found["labels_needed"]
    assert need["observed_precision"] == 1.0 and need["more"] > 0
    auto = round(need["labelled"] * need["coverage"])  # as many items above that threshold, all right
    assert clopper_pearson_lower(auto, auto, 0.95) >= 0.95 > clopper_pearson_lower(40, 40, 0.95)
    lines = reachable_lines({"target": 0.95, "confidence_level": 0.95, "reachable": found})
    assert any("at precision 80%" in line for line in lines) and any("more)" in line for line in lines)
    # when even the most confident answers are below the target, more labels will not help
    hopeless = reachable(conf, np.arange(120) % 2 == 0, target=0.95, confidence_level=0.95)
    assert hopeless["labels_needed"] is None


def test_within_one_standard_error_the_cheaper_head_to_serve_is_chosen():
    """Two heads about as good as each other (held-out losses within one standard error of their
    difference): the one whose prompt costs fewer weighted rows per decision wins; a cheaper one
    further off does not."""
    from llamadecide.calibration.fitting import Candidate
    from llamadecide.calibration.selection import choose, complexity
    from llamadecide.calibration.variants import Variant
    from llamadecide.decisions.maths import HIDDEN_ONLY

    head = Candidate("head", False, C=0.05, features=HIDDEN_ONLY)
    rng = np.random.default_rng(0)
    losses = rng.exponential(0.5, size=300)
    noise = rng.normal(0, 0.05, size=300)
    noise -= noise.mean()

    def result(label, prompt_format, cost, shifted):
        return {
            "label": label,
            "cv_nll": float(shifted.mean()),
            "cv_nll_se": 0.03,
            "cv_items": 300,
            "cv_losses": shifted,
            "complexity": list(complexity(Variant("text", prompt_format=prompt_format), head, cost)),
        }

    costly = result("question first", "llamadecide-3", 51.0, losses)
    cheap = result("input alone", "llamadecide-5", 23.0, losses + noise + 0.001)
    assert choose([costly, cheap])[0]["label"] == "input alone"
    worse = result("input alone, worse", "llamadecide-5", 23.0, losses + noise + 0.2)
    assert choose([costly, worse])[0]["label"] == "question first"


def test_the_labels_a_target_needs_count_every_label_though_only_a_share_certifies():
    from llamadecide.calibration.thresholds import labels_needed

    conf = np.linspace(0.99, 0.5, 100)
    correct = ~np.isin(np.arange(100), [0, 1, 40, 41])  # 96 of 100 right
    alone = labels_needed(conf, correct, target=0.92, confidence_level=0.95)
    # the same certifying items held out of 200 labels: every label counts, half of them certify
    held = labels_needed(conf, correct, target=0.92, confidence_level=0.95, labels=200)
    assert held["labelled"] in (2 * alone["labelled"] - 1, 2 * alone["labelled"], 2 * alone["labelled"] + 1)
    assert held["more"] == held["labelled"] - 200 > alone["more"] > 0
    # drawn with unequal chances (weights 1 and 3, the weighted precision the same 0.96), the items
    # count at their effective size, and the target needs more labels
    weights = np.where(np.arange(100) % 2 == 0, 1.0, 3.0)
    weighted = labels_needed(conf, correct, target=0.92, confidence_level=0.95, weights=weights, labels=200)
    assert weighted["observed_precision"] == pytest.approx(held["observed_precision"])
    assert weighted["labelled"] > held["labelled"]
