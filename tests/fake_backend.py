"""A fake scoring backend for tests of a calibration run's logic (tests/test_calibration_e2e.py runs
the same paths on the real model), and the run configuration those tests share."""

from pathlib import Path

import numpy as np

from llamadecide.calibration.backends import ItemScores
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import Task

OPTIONS = ["north", "south", "east", "west"]
DIMS, SIGNAL = 32, 1.5  # a hidden state: the label in 4 of 32 noisy dimensions (learnt from many items, not 32)


class SubsampleBackend:
    """Hidden states that carry the label; answers that carry it (`informative`) or are noise. Costs
    make answers dear, so a tight row budget scores them on a subsample."""

    description = "subsample fake"
    supports_hidden = True
    supports_demonstrations = True

    def __init__(self, labels: dict[str, int], *, informative: bool) -> None:
        self.labels = labels
        self.informative = informative
        self.answered: list[str] = []  # every text whose answers were scored
        self.dear_without_demonstrations = False

    def identity(self) -> str:
        return f"subsample-fake-{self.informative}"

    def head_layer(self, depth):
        return None

    def cost(self, text, question, rule=None) -> tuple[float, float]:
        if self.dear_without_demonstrations and not (rule and rule.demonstrations):
            return 4000.0, 3000.0  # left out by the budget
        return 400.0, 30.0

    def _scores(self, text: str, answers: bool, hidden: bool) -> ItemScores:
        rng = np.random.default_rng(int(text.split()[-1]))
        y = self.labels[text]
        state = np.eye(DIMS)[y] * SIGNAL + rng.normal(size=DIMS) if hidden else None
        if not answers:
            return ItemScores([], None, state)
        logits = rng.normal(size=len(OPTIONS)) + (4.0 * np.eye(len(OPTIONS))[y] if self.informative else 0.0)
        self.answered.append(text)
        return ItemScores(list(logits - np.logaddexp.reduce(logits)), [1] * len(OPTIONS), state)

    def score_many(self, texts, question, rule=None, *, answers=True, hidden=False, **options):
        return [self._scores(t, answers, hidden) for t in texts]

    def score(self, text, question, rule=None, *, hidden=False, **options):
        return self._scores(text, True, hidden)

    def content_free(self, question, rule=None):
        return np.full((3, len(OPTIONS)), -np.log(len(OPTIONS))), None


def compass_task() -> Task:
    return Task("compass", "choice", "Which way?", OPTIONS, [None] * 4, {o: o for o in OPTIONS})


def fake_run_config(out_dir: Path, **fields) -> RunConfig:
    """A run on the fake backend: no progress bars, one prompt format, no demonstrations, no lexical
    expert or head, no row budget, unless `fields` say otherwise."""
    defaults = {
        "show_progress": False,
        "prompt_formats": ("llamadecide-1",),
        "shots_per_class": (),
        "lexical": False,
        "head": False,
        "row_budget": 0,
    }
    return RunConfig(out_dir=out_dir, **{**defaults, **fields})
