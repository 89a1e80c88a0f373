import numpy as np
import pytest
from sklearn.metrics import brier_score_loss, log_loss

from llamadecide.calibration import metrics
from llamadecide.calibration.calibrators import Calibrator
from llamadecide.calibration.cross_validation import cross_validated
from llamadecide.calibration.fitting import candidates, fit

P = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.2, 0.8]])
Y = np.array([0, 1, 1, 0])


def test_accuracy_nll_brier_by_hand_and_sklearn():
    assert metrics.accuracy(P, Y) == 0.5
    expected_nll = -(np.log(0.9) + np.log(0.4) + np.log(0.7) + np.log(0.2)) / 4
    assert metrics.nll(P, Y) == pytest.approx(expected_nll)
    assert metrics.nll(P, Y) == pytest.approx(log_loss(Y, P))
    # multi-class Brier sums over both classes: 2 x the binary Brier of the positive class
    by_hand = ((0.1**2 * 2) + (0.6**2 * 2) + (0.3**2 * 2) + (0.8**2 * 2)) / 4
    assert metrics.brier(P, Y) == pytest.approx(by_hand)
    assert metrics.brier(P, Y) == pytest.approx(2 * brier_score_loss(Y, P[:, 1]))


def test_ece_equal_width_by_hand():
    # top probabilities 0.9 (right), 0.6 (wrong), 0.7 (right), 0.8 (wrong); 10 bins of width 0.1:
    # bins (0.5,0.6] 0.6 acc 0; (0.6,0.7] 0.7 acc 1; (0.7,0.8] 0.8 acc 0; (0.8,0.9] 0.9 acc 1
    # ECE = (0.6 + 0.3 + 0.8 + 0.1) / 4 = 0.45
    assert metrics.ece(P, Y, bins=10, strategy="width") == pytest.approx(0.45)
    # 2 bins of equal mass: {0.6, 0.7} -> conf 0.65 acc 0.5; {0.8, 0.9} -> conf 0.85 acc 0.5
    assert metrics.ece(P, Y, bins=2, strategy="mass") == pytest.approx(0.5 * 0.15 + 0.5 * 0.35)


def test_perfectly_calibrated_data_has_small_ece():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.5, 1.0, 20000)
    correct = rng.uniform(size=p.size) < p
    assert metrics.ece_from_conf(p, correct, bins=10) < 0.02
    assert metrics.ece_from_conf(np.clip(p + 0.2, 0, 1), correct, bins=10) > 0.1


def test_bootstrap_interval_brackets_the_estimate():
    rng = np.random.default_rng(1)
    Pm = rng.dirichlet(np.ones(3), 500)
    y = rng.integers(0, 3, 500)
    low, high = metrics.bootstrap_interval(metrics.accuracy, Pm, y, rounds=200)
    assert low <= metrics.accuracy(Pm, y) <= high


def test_per_class_ece_and_risk_coverage():
    assert len(metrics.per_class_ece(P, Y, bins=10)) == 2
    coverage, risk = metrics.risk_coverage(np.array([0.9, 0.8, 0.7, 0.6]), np.array([True, False, True, False]))
    assert coverage.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert risk.tolist() == pytest.approx([0.0, 0.5, 1 / 3, 0.5])
    assert metrics.aurc(np.array([0.9, 0.8, 0.7, 0.6]), np.array([True, False, True, False])) == pytest.approx(
        (0 + 0.5 + 1 / 3 + 0.5) / 4
    )


def _synthetic_overconfident(n, k=4, true_t=2.5, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1, (n, k)) * 3.0
    p_true = np.exp(logits / true_t)
    p_true /= p_true.sum(1, keepdims=True)
    y = np.array([rng.choice(k, p=row) for row in p_true])
    return logits, y


def test_temperature_fit_recovers_a_known_temperature():
    L, y = _synthetic_overconfident(6000)
    fitted = fit(L, None, y, kind="temperature", length_normalize=False)
    assert fitted.temperature == pytest.approx(2.5, rel=0.1)
    assert metrics.ece(fitted.apply(L, None), y) < metrics.ece(Calibrator().apply(L, None), y) / 3


def test_bias_fit_corrects_a_prior_shift():
    L, y = _synthetic_overconfident(6000, true_t=1.0)
    shifted = L + np.array([2.0, 0, 0, 0])  # the model over-prefers option 0
    fitted = fit(shifted, None, y, kind="temperature+bias", length_normalize=False)
    assert fitted.bias[1] - fitted.bias[0] == pytest.approx(2.0, abs=0.3)
    assert metrics.nll(fitted.apply(shifted, None), y) < metrics.nll(Calibrator().apply(shifted, None), y)


def test_length_normalisation_needs_lengths_and_cv_prefers_the_truth():
    """Answers whose log-likelihoods grow with their token count while the label follows the score per
    token: among the candidates with and without length normalisation, cross-validation prefers the
    normalised ones (and a fit asked to normalise without lengths refuses)."""
    rng = np.random.default_rng(3)
    n, k = 1500, 3
    per_token = rng.normal(-1.0, 1.0, (n, k))
    y = np.array([rng.choice(k, p=np.exp(row) / np.exp(row).sum()) for row in 3 * per_token])
    lengths = rng.integers(1, 8, (n, k)).astype(float)
    L = per_token * lengths
    with pytest.raises(ValueError):
        fit(L, None, y, kind="temperature", length_normalize=True)
    offered = candidates(True)
    assert {c.length_normalize for c in offered} == {False, True}
    cv = {(c.kind, c.length_normalize): cross_validated(L, lengths, y, c)["nll"] for c in offered}
    for kind in ("none", "temperature", "temperature+bias"):
        assert cv[(kind, True)] < cv[(kind, False)]
    assert min(cv, key=cv.get)[1] is True


def _served_methods_data():
    """Labelled rows with everything a candidate may read: log-likelihoods, token counts, hidden
    states, input texts and content-free rows."""
    from llamadecide.calibration.variants import VariantScores

    rng = np.random.default_rng(5)
    n, k, width = 120, 3, 8
    y = rng.integers(0, k, n)
    L = rng.normal(-4, 1.5, (n, k)) + 2.0 * np.eye(k)[y]
    lengths = rng.integers(1, 6, (n, k)).astype(float)
    hidden = rng.normal(size=(n, width)) + np.eye(k, width)[y]
    texts = [f"ticket {i} about {['billing', 'login', 'pricing'][c]}" for i, c in enumerate(y)]
    content_free = (rng.normal(-3, 1, (2, k)), rng.integers(1, 6, (2, k)).astype(float))
    return VariantScores(L, lengths, hidden, content_free, texts=texts, inputs=texts), y


def _served(calibrator, candidate, data):
    """Every row's probabilities as the server gives them from the profile written for `calibrator`
    (`CalibrationProfile.scoring()` through `answers.build_answer`, each row's text its input)."""
    from llamadecide.calibration.profile import CalibrationProfile, method_fields
    from llamadecide.decisions import choice
    from llamadecide.decisions.answers import OptionTotals, build_answer

    question = choice("Which team?", ["billing", "technical support", "sales"])
    profile = CalibrationProfile(
        name="p",
        created="",
        model_sha256="0" * 64,
        prompt_format="llamadecide-1",
        task={"type": "choice", "instructions": "Which team?", "options": question_options(question)},
        mode="text",
        target_precision=0.9,
        confidence_level=0.95,
        dataset_fingerprint="",
        metrics={},
        **method_fields(calibrator, candidate),
    )
    rule = CalibrationProfile.model_validate_json(profile.model_dump_json()).scoring()  # as saved and loaded
    return np.array(
        [
            build_answer(
                question,
                OptionTotals(list(data.L[i]), list(data.lengths[i]), data.hidden[i]),
                rule,
                prior=None if rule.prior is None else np.asarray(rule.prior),
                state_text=data.texts[i],
            ).probabilities
            for i in range(len(data.L))
        ]
    )


def _kind(candidate) -> tuple:
    return (
        candidate.kind,
        candidate.length_normalize,
        candidate.prior_correction,
        candidate.lexical,
        candidate.features,
        candidate.fit,
    )


def test_every_fitted_method_gives_what_its_served_profile_gives():
    """For every candidate calibrate may choose (zero-shot, temperature, bias, length normalisation,
    prior correction, heads on log-likelihoods and hidden state or the hidden state alone, each with
    and without the lexical expert): the probabilities calibrate measures (`Calibrator.apply`,
    `HeadCalibrator.apply`) equal, to rounding, the ones the server gives from the profile it writes
    (`CalibrationProfile.scoring()` through `answers.build_answer`)."""
    from llamadecide.calibration.selection import apply_variant, fit_variant

    data, y = _served_methods_data()
    every = np.arange(len(y))
    seen = set()
    for candidate in candidates(True, has_prior=True, has_hidden=True, has_texts=True):
        calibrator = fit_variant(candidate, data, every, y)
        fitted = apply_variant(calibrator, data, every)
        np.testing.assert_allclose(_served(calibrator, candidate, data), fitted, atol=1e-12, err_msg=candidate.label)
        seen.add(_kind(candidate))
    # 3 kinds x length norm x prior correction; heads: 2 feature sets x lexical, and class means x lexical
    assert len(seen) == 18


def test_every_cross_fitted_method_gives_each_input_what_its_served_profile_gives():
    """Cross-fitted, for every candidate: each item's probabilities, out of fold (from the fold its
    input routes to, fitted without that fold's items), are the ones the server gives for that
    input from the profile written, and differ from the fold that did fit it."""
    from llamadecide.calibration.selection import apply_variant, cross_fit, fit_variant

    data, y = _served_methods_data()
    every = np.arange(len(y))
    routes = data.routes(every, 3)
    assert set(routes) == {0, 1, 2}
    seen = set()
    for candidate in candidates(True, has_prior=True, has_hidden=True, has_texts=True):
        folded = cross_fit(candidate, data, every, y, 3)
        fitted = apply_variant(folded, data, every)
        for k in range(3):
            own = fit_variant(candidate, data, every[routes != k], y[routes != k])
            np.testing.assert_allclose(fitted[routes == k], apply_variant(own, data, every[routes == k]), atol=1e-12)
        np.testing.assert_allclose(_served(folded, candidate, data), fitted, atol=1e-12, err_msg=candidate.label)
        if candidate.kind != "none":  # fitted parameters differ between folds
            other = apply_variant(folded.folds[1], data, every[routes == 0])
            assert np.abs(other - fitted[routes == 0]).max() > 1e-6, candidate.label
        seen.add(_kind(candidate))
    assert len(seen) == 18


def question_options(question) -> list:
    return [o.value for o in question.options]


def test_the_reliability_diagram_shows_how_many_items_each_bin_holds():
    import matplotlib.pyplot as plt

    from llamadecide.calibration.plots import reliability_figure

    rng = np.random.default_rng(0)
    P = rng.dirichlet([4, 1, 1], 200)
    P[0] = [0.02, 0.03, 0.95]  # a bin with one item
    y = rng.integers(0, 3, 200)
    fig = reliability_figure({"calibrated": P}, y, bins=10)
    try:
        points, histogram = fig.axes
        table = metrics.reliability(P.max(1), P.argmax(1) == y, 10, "width")
        assert [bar.get_height() for bar in histogram.patches] == [b.count for b in table]
        sizes = points.collections[0].get_sizes()
        assert len(sizes) == len(table) and sizes.argmax() == int(np.argmax([b.count for b in table]))
        assert sizes.min() < sizes.max() / 4  # a bin of one item is drawn small
    finally:
        plt.close(fig)


def test_few_label_folds_keep_every_option_with_two_labels_in_every_training_part():
    from llamadecide.calibration.folds import splitter

    y = np.repeat(np.arange(30), 2)  # two labels an option, 30 options
    folds = list(splitter(np.zeros((len(y), 30)), y, 5, seed=1))
    assert len(folds) == 5 and sorted(np.concatenate([held for _, held in folds]).tolist()) == list(range(len(y)))
    for train, held in folds:
        assert set(y[train]) == set(range(30))  # every option still has a label to learn from
        assert abs(len(held) - len(y) / 5) <= 1


def test_certification_folds_hold_out_an_option_independently_of_its_training_count():
    """The folds a threshold is certified on: over random labelled samples of a 77-option task, how
    many items of an option a fold holds out says nothing of how many the model trained on (their
    correlation is about zero, slightly negative for a sample of fixed size). The selection's
    stratified folds, run beside as the control, tie the two together (each held-out fold a
    miniature of the sample), which makes held-out precision optimistic."""
    from llamadecide.calibration.folds import certification_folds, splitter

    def correlation(folds_of) -> float:
        held_counts, train_counts = [], []
        for seed in range(20):
            y = np.random.default_rng(seed).integers(0, 77, 554)
            for train, held in folds_of(y, seed):
                held_counts.extend(np.bincount(y[held], minlength=77))
                train_counts.extend(np.bincount(y[train], minlength=77))
        return float(np.corrcoef(held_counts, train_counts)[0, 1])

    assert abs(correlation(lambda y, seed: certification_folds(len(y), 5, seed))) < 0.15
    assert correlation(lambda y, seed: list(splitter(np.zeros((len(y), 77)), y, 5, seed))) > 0.5


def test_a_class_means_head_learns_from_one_or_two_labels_an_option():
    """Options as clusters of hidden states: from two labels each, the class means head names most of
    a fresh sample right, where the logistic head at the same labels does worse or no better."""
    from llamadecide.calibration.fitting import fit_class_means, fit_head

    rng = np.random.default_rng(7)
    k, width = 20, 64
    centres = rng.normal(0, 1.0, (k, width))

    def sample(per: int):
        y = np.repeat(np.arange(k), per)
        return centres[y] + rng.normal(0, 0.9, (len(y), width)), y

    H, y = sample(2)
    H_test, y_test = sample(20)
    head = fit_class_means(H, y, k)
    accuracy = (head.apply(np.zeros((len(y_test), k)), None, H_test).argmax(1) == y_test).mean()
    assert accuracy > 0.8
    one_each = fit_class_means(H[::2], y[::2], k)  # a single label an option: its own mean
    assert (one_each.apply(np.zeros((len(y_test), k)), None, H_test).argmax(1) == y_test).mean() > 0.6
    logistic = fit_head(np.zeros((len(y), k)), H, y, C=0.05, features="hidden-1")
    assert accuracy >= (logistic.apply(np.zeros((len(y_test), k)), None, H_test).argmax(1) == y_test).mean()
