"""Cross-validation folds of labelled items, for choosing, fitting and certifying alike: stratified
where every option has a label per fold, dealt round-robin per option where options have one or two."""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.model_selection import StratifiedKFold


def ignore_class_count_warning() -> None:
    # Many options, few labels: y holds class indices, not a regression target.
    warnings.filterwarnings("ignore", message="The number of unique classes is greater than 50%")


def splitter(L: np.ndarray, y: np.ndarray, folds: int, seed: int):
    """Cross-validation folds of the labelled items. With every option labelled at least `folds`
    times, scikit-learn's stratified folds. With fewer (a few labels an option), folds of our own
    that still keep every option in every fold's training part where it can: an option's items go to
    different folds, so an option with two labels keeps one whichever fold is held out (plain folds
    would leave whole options out of training, and a head could not learn them)."""
    counts = np.bincount(y, minlength=L.shape[1])
    present = counts[counts > 0]
    if len(present) >= 2 and present.min() >= folds:
        return StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed).split(L, y)
    return few_label_folds(y, folds, seed)


def few_label_folds(y: np.ndarray, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each option's items dealt round-robin over the folds (a seeded order of options and items, the
    deal continuing from one option to the next so the folds stay even)."""
    rng = np.random.default_rng(seed)
    fold_of = np.empty(len(y), dtype=int)
    dealt = 0
    for option in rng.permutation(np.unique(y)):
        members = rng.permutation(np.flatnonzero(y == option))
        fold_of[members] = (dealt + np.arange(len(members))) % folds
        dealt += len(members)
    return [(np.flatnonzero(fold_of != f), np.flatnonzero(fold_of == f)) for f in range(folds) if (fold_of == f).any()]
