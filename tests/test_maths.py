import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llamadecide.decisions import maths


def test_softmax_hand_values():
    # log p = ln 1, ln 3 -> 1/4, 3/4
    p = maths.normalise([0.0, math.log(3.0)])
    assert p == pytest.approx([0.25, 0.75])


def test_temperature_flattens():
    # T = 2 divides the log-odds ln 3 by 2: p = 1 / (1 + sqrt 3), sqrt 3 / (1 + sqrt 3)
    p = maths.normalise([0.0, math.log(3.0)], temperature=2.0)
    assert p == pytest.approx([1 / (1 + math.sqrt(3)), math.sqrt(3) / (1 + math.sqrt(3))])


def test_length_normalisation_divides_by_token_count():
    # -4 over 4 tokens and -2 over 1 token: per-token -1 and -2 -> e^-1 / (e^-1 + e^-2)
    p = maths.normalise([-4.0, -2.0], lengths=[4, 1])
    assert p[0] == pytest.approx(math.exp(-1) / (math.exp(-1) + math.exp(-2)))


def test_bias_shifts_log_odds():
    p = maths.normalise([0.0, 0.0], bias=[math.log(4.0), 0.0])
    assert p == pytest.approx([0.8, 0.2])


def test_normalise_is_stable_for_very_negative_logprobs():
    p = maths.normalise([-1000.0, -1001.0])
    assert p == pytest.approx([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))])


def test_temperature_must_be_positive():
    with pytest.raises(ValueError):
        maths.normalise([0.0, 1.0], temperature=0.0)


def test_confidence_hand_values():
    assert maths.confidence([0.25, 0.25, 0.25, 0.25]) == 0.0
    assert maths.confidence([1.0, 0.0]) == 1.0
    # K = 4, p_max = 0.625: (0.625 - 0.25) / 0.75 = 0.5
    assert maths.confidence([0.625, 0.125, 0.125, 0.125]) == pytest.approx(0.5)
    # K = 2, p_max = 0.8: (0.8 - 0.5) / 0.5 = 0.6
    assert maths.confidence([0.2, 0.8]) == pytest.approx(0.6)


def test_expected_score_hand_values():
    assert maths.expected_score([0.0, 0.0, 1.0]) == 2.0
    # 0 * 0.2 + 1 * 0.3 + 2 * 0.5 = 1.3
    assert maths.expected_score([0.2, 0.3, 0.5]) == pytest.approx(1.3)


def test_label_mass():
    assert maths.label_mass([math.log(0.5), math.log(0.25)]) == pytest.approx(0.75)


logprob_lists = st.lists(st.floats(min_value=-200, max_value=0, allow_nan=False), min_size=2, max_size=40)


@given(logprob_lists, st.floats(min_value=0.05, max_value=20))
def test_probabilities_sum_to_one_and_keep_order(logprobs, temperature):
    p = maths.normalise(logprobs, temperature=temperature)
    assert p.sum() == pytest.approx(1.0)
    assert np.all(p >= 0)
    order = np.argsort(logprobs, kind="stable")
    assert np.all(np.diff(p[order]) >= -1e-12)  # monotone in the log-likelihood


@given(logprob_lists)
def test_confidence_is_bounded(logprobs):
    c = maths.confidence(maths.normalise(logprobs))
    assert 0.0 <= c <= 1.0


@given(st.lists(st.floats(min_value=0.001, max_value=1), min_size=2, max_size=12))
def test_expected_score_within_level_range(weights):
    p = np.asarray(weights) / np.sum(weights)
    assert 0.0 <= maths.expected_score(p) <= len(weights) - 1
