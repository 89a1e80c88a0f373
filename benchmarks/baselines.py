"""How the quality bench measures a method (test-part figures and the share handled automatically at a
guaranteed precision), and the baselines it compares with: TF-IDF + logistic regression, and
generate-and-parse."""

from __future__ import annotations

import time

import numpy as np
from sklearn.metrics import f1_score

from llamadecide.bench.load import parse_choice
from llamadecide.calibration import metrics
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.thresholds import Threshold, evaluate_threshold, select_threshold
from llamadecide.decisions import lexical
from llamadecide.decisions.maths import confidence
from llamadecide.engine import Engine, SamplingParams

TARGET = 0.9
CONFIDENCE = 0.95


def measure(P: np.ndarray, y: np.ndarray, P_cal_oof: np.ndarray | None, y_cal: np.ndarray) -> dict:
    """Test-part figures, and auto-handling at TARGET precision with a threshold chosen on held-out
    labelled-part probabilities."""
    pred = P.argmax(1)
    row = {
        "accuracy": float((pred == y).mean()),
        "macro_f1": float(f1_score(y, pred, average="macro", labels=np.arange(P.shape[1]), zero_division=0)),
        "nll": metrics.nll(P, y),
        "ece": metrics.ece(P, y),
    }
    row.update(auto_coverage=0.0, auto_precision=None, threshold=None)
    if P_cal_oof is not None:
        threshold = guaranteed_threshold(P_cal_oof, y_cal)
        if threshold is not None:
            test = evaluate_threshold(confidence(P), pred == y, threshold.threshold)
            row.update(auto_coverage=test["coverage"], auto_precision=test["precision"], threshold=threshold.threshold)
    return row


def guaranteed_threshold(P_oof: np.ndarray, y: np.ndarray) -> Threshold | None:
    """The threshold chosen on held-out labelled-part probabilities for TARGET precision at CONFIDENCE."""
    return select_threshold(confidence(P_oof), P_oof.argmax(1) == y, target=TARGET, confidence_level=CONFIDENCE)


def tfidf_baseline(
    items: list[LabelledItem], y: np.ndarray, cal_idx: np.ndarray, test_idx: np.ndarray, k: int, analyzer: str = "word"
) -> dict:
    """TF-IDF + logistic regression on the labelled part: word uni- and bigrams, or (analyzer
    "char_wb") the character 2-4-grams of a head's lexical expert, alone."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline

    def model():
        vectorizer = (
            TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)
            if analyzer == "word"
            else lexical.vectorizer(min_df=1)
        )
        return make_pipeline(vectorizer, LogisticRegression(C=10.0, max_iter=2000))

    texts = np.array([item.text for item in items], dtype=object)

    def full(P: np.ndarray, classes: np.ndarray) -> np.ndarray:
        out = np.full((len(P), k), 1e-9)
        out[:, classes] = P
        return out / out.sum(1, keepdims=True)

    fitted = model().fit(texts[cal_idx], y[cal_idx])
    P_test = full(fitted.predict_proba(texts[test_idx]), fitted.classes_)
    counts = np.bincount(y[cal_idx], minlength=k)
    folds = int(min(5, counts[counts > 0].min()))
    P_oof = None
    if folds >= 2:
        P_oof = full(
            cross_val_predict(
                model(),
                texts[cal_idx],
                y[cal_idx],
                method="predict_proba",
                cv=StratifiedKFold(folds, shuffle=True, random_state=0),
            ),
            np.unique(y[cal_idx]),
        )
    return measure(P_test, y[test_idx], P_oof, y[cal_idx])


def generate_and_parse(engine: Engine, task: Task, items: list[LabelledItem], y: np.ndarray, idx: np.ndarray) -> dict:
    """Greedy chat answer to the same question, parsed for an option (the way a chat endpoint is
    used); an answer naming no option counts as wrong."""
    hits, invalid, seconds = 0, 0, []
    names = [str(o) for o in task.options] if task.type != "predicate" else ["yes", "no"]
    for i in idx:
        prompt = (
            f"{items[i].text}\n\n{task.instructions}\nAnswer with exactly one of: {', '.join(names)}. "
            "Write only the answer."
        )
        tokens = engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": prompt}]))
        began = time.perf_counter()
        text = "".join(
            e.text
            for e in engine.generate(tokens, SamplingParams(max_tokens=16, temperature=0.0))
            if hasattr(e, "text")
        )
        seconds.append(time.perf_counter() - began)
        picked = parse_choice(text, names)
        invalid += picked is None
        hits += picked == y[i]
    n = len(idx)
    return {"accuracy": hits / n, "invalid_rate": invalid / n, "seconds_p50": float(np.median(seconds)), "items": n}
