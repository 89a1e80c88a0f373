"""The lexical expert a head may carry, on synthetic data (pure logic: no model involved)."""

from __future__ import annotations

import numpy as np
import pytest

from llamadecide.calibration.fitting import fit_head
from llamadecide.calibration.profile import HeadParams, LexicalParams
from llamadecide.decisions.lexical import fit_lexical

WORDS = ["refund", "password", "invoice"]


def corpus(n: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    filler = ["please", "help", "me", "today", "with", "my", "account", "thanks"]
    texts = [" ".join(list(rng.choice(filler, 4)) + [WORDS[c]] + list(rng.choice(filler, 3))) for c in y]
    return texts, y


def test_the_lexical_expert_learns_words_and_never_predicts_an_option_it_never_saw():
    texts, y = corpus(60)
    expert = fit_lexical(texts, y, 4)
    test_texts, test_y = corpus(30, seed=1)
    P = np.exp(expert.log_probabilities(test_texts))
    assert P.shape == (30, 4) and np.allclose(P.sum(1), 1.0)
    assert (P.argmax(1) == test_y).mean() == 1.0
    assert P[:, 3].max() < 1e-9


def test_a_fused_head_outweighs_uninformative_hidden_states_and_serves_what_it_fitted():
    texts, y = corpus(90)
    rng = np.random.default_rng(2)
    L = rng.normal(size=(90, 3))  # the model knows nothing here: only the words carry the label
    H = rng.normal(size=(90, 8))
    plain = fit_head(L, H, y, C=0.5)
    fused = fit_head(L, H, y, C=0.5, texts=texts)
    assert fused.mix[1] > fused.mix[0]
    test_texts, test_y = corpus(40, seed=3)
    L_test, H_test = rng.normal(size=(40, 3)), rng.normal(size=(40, 8))
    P_fused = fused.apply(L_test, None, H_test, test_texts)
    assert (P_fused.argmax(1) == test_y).mean() > (plain.apply(L_test, None, H_test).argmax(1) == test_y).mean()
    served = HeadParams.model_validate_json(HeadParams.from_calibrator(fused).model_dump_json()).build()
    for row in range(5):
        assert served.probabilities(L_test[row], H_test[row], test_texts[row]) == pytest.approx(P_fused[row], abs=1e-9)
    with pytest.raises(ValueError, match="input text"):
        served.probabilities(L_test[0], H_test[0])
    with pytest.raises(ValueError, match="input text"):  # fitted or served: the same maths, the same refusal
        fused.apply(L_test, None, H_test)


def test_lexical_parameters_that_disagree_in_size_are_refused():
    with pytest.raises(ValueError, match="disagree in size"):
        LexicalParams(vocabulary=["ab", "bc"], idf=[1.0], weights=[[0.0, 0.0]], intercept=[0.0], mix=(1.0, 1.0))
    with pytest.raises(ValueError, match="one intercept per option"):
        LexicalParams(vocabulary=["ab"], idf=[1.0], weights=[[0.0], [1.0]], intercept=[0.0], mix=(1.0, 1.0))


def test_a_head_on_the_hidden_state_alone_ignores_the_log_likelihoods_and_serves_without_them():
    from llamadecide.calibration.fitting import Candidate, candidates
    from llamadecide.decisions.maths import HIDDEN_ONLY

    texts, y = corpus(90)
    rng = np.random.default_rng(4)
    H = rng.normal(size=(90, 8))
    H[np.arange(90), y] += 3.0  # the hidden state carries the label
    L = rng.normal(size=(90, 3))
    head = fit_head(L, H, y, C=0.5, texts=texts, features=HIDDEN_ONLY)
    assert head.weights.shape == (3, 8)
    assert np.array_equal(head.apply(L, None, H, texts), head.apply(rng.normal(size=(90, 3)), None, H, texts))
    params = HeadParams.model_validate_json(HeadParams.from_calibrator(head).model_dump_json())
    assert params.features == "hidden-1" and params.hidden_size == 8
    served = params.build()
    assert not served.reads_logprobs
    assert served.probabilities(None, H[0], texts[0]) == pytest.approx(
        head.apply(L[:1], None, H[:1], texts[:1])[0], abs=1e-9
    )
    labels = [c.label for c in candidates(False, has_hidden=True, has_texts=True)]
    assert "head (hidden state, C=0.05) + lexical" in labels and "head (C=0.05)" in labels
    assert Candidate("head", False, C=0.5, features=HIDDEN_ONLY).method == "head"


def test_the_fit_memo_answers_selections_repeated_fits_and_changes_no_result(monkeypatch):
    """Cross-validating the lexical and plain heads over two C values refits the same logistic
    regressions and lexical experts many times: the memo answers the repeats (counted), with the
    same held-out figures as fitting every one afresh."""
    from llamadecide.calibration import fitting
    from llamadecide.calibration.cross_validation import cross_validated
    from llamadecide.calibration.fitting import Candidate
    from llamadecide.calibration.memo import FitMemo
    from llamadecide.decisions.maths import HIDDEN_ONLY

    rng = np.random.default_rng(0)
    words = ["refund", "card", "password", "transfer"]
    y = np.arange(60) % 4
    texts = [f"please help with my {words[c]} {rng.integers(100)}" for c in y]
    hidden = rng.normal(size=(60, 12)) + y[:, None] * 0.3
    L = np.zeros((60, 4))
    grid = [Candidate("head", False, C=c, lexical=x, features=HIDDEN_ONLY) for x in (False, True) for c in (0.05, 0.5)]

    def run() -> list[dict]:
        return [cross_validated(L, None, y, c, hidden=hidden, texts=texts if c.lexical else None) for c in grid]

    monkeypatch.setattr(fitting, "HEAD_FITS", FitMemo(0))
    monkeypatch.setattr(fitting, "LEXICAL_FITS", FitMemo(0))
    afresh = run()
    assert fitting.HEAD_FITS.hits == 0
    monkeypatch.setattr(fitting, "HEAD_FITS", FitMemo(96))
    monkeypatch.setattr(fitting, "LEXICAL_FITS", FitMemo(48))
    memoised = run()
    assert fitting.HEAD_FITS.hits >= 10  # each C's outer-fold heads, fitted for the plain and the lexical candidate
    assert fitting.LEXICAL_FITS.hits >= 20  # every lexical expert of the second C (outer and inner folds)
    for a, b in zip(afresh, memoised):
        assert a["nll"] == b["nll"] and a["accuracy"] == b["accuracy"]
