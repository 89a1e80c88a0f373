"""Cross-validation of calibration candidates: folds fitted in parallel on the machine's cores,
each held-out item's loss and hit, and the figures pooled over folds."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from llamadecide.calibration.fitting import Candidate, fit_candidate
from llamadecide.calibration.folds import ignore_class_count_warning, splitter


def cross_validated(
    L: np.ndarray,
    lengths: np.ndarray | None,
    y: np.ndarray,
    candidate: Candidate,
    *,
    prior: np.ndarray | None = None,
    hidden: np.ndarray | None = None,
    texts: Sequence[str] | None = None,
    folds: int = 5,
    seed: int = 0,
) -> dict[str, float]:
    """Held-out NLL (and its standard error over items) and accuracy of a candidate over folds of the
    calibration part."""

    def fold(split: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        train, held = split
        calibrator = fit_candidate(
            candidate,
            L[train],
            None if lengths is None else lengths[train],
            y[train],
            prior=prior,
            hidden=None if hidden is None else hidden[train],
            texts=None if texts is None else [texts[i] for i in train],
        )
        P = calibrator.apply(
            L[held],
            None if lengths is None else lengths[held],
            None if hidden is None else hidden[held],
            None if texts is None else [texts[i] for i in held],
        )
        return held_out_figures(P, y[held])

    splits = list(splitter(L, y, folds, seed))
    return pooled(splits, in_parallel(fold, splits))


def held_out_figures(P: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each held-out item's loss (negative log-probability of its label) and whether it was right."""
    return -np.log(np.clip(P[np.arange(len(y)), y], 1e-12, 1.0)), P.argmax(1) == y


def pooled(splits: list[tuple[np.ndarray, np.ndarray]], folds: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """Held-out figures over folds: NLL with its standard error over items, accuracy, and each
    item's loss in item order (`losses`, so that candidates measured on the same items can be
    compared item by item)."""
    n = sum(len(held) for _, held in splits)
    losses, hits = np.zeros(n), np.zeros(n, dtype=bool)
    for (_, held), (loss, hit) in zip(splits, folds):
        losses[held], hits[held] = loss, hit
    return {
        "nll": float(losses.mean()),
        "nll_se": float(losses.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
        "accuracy": float(hits.mean()),
        "items": int(n),
        "losses": losses,
    }


def one_blas_thread():
    """Fitting heads multiplies small matrices, where OpenBLAS's own threads cost more than they
    give: one fit of a Banking77 head takes 4.2 s on 2 threads and 1.3 s on one (2 cores). Fits run
    in parallel (`in_parallel`) instead."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def in_parallel(work, items) -> list:
    """`work` over items on the machine's cores, in order: fold fits are independent, and scipy's
    L-BFGS releases the interpreter while it runs."""
    items = list(items)
    # Warning filters and BLAS limits are process-wide: a worker leaving its own catch_warnings can
    # drop another worker's filter, so both are held here, around all of them.
    with (
        warnings.catch_warnings(),
        one_blas_thread(),
        ThreadPoolExecutor(max_workers=min(len(items), os.cpu_count() or 1) or 1) as pool,
    ):
        ignore_class_count_warning()
        return list(pool.map(work, items))
