"""`llamadecide label`: a team with no labels labels a pool, the items drawn for the most gain per
label (`labels.active`), each with its recorded chance, through the label store and the review page.

The pool is scored once (cached beside the store). Before any model the draw is uniform (or by the
zero-shot answers where every item has them, or by a profile given); every `refit_every` labels the
method is chosen, fitted and certified again in the background (`calibration.steps`, as `calibrate`
does it), without blocking the person, and the draws follow the new model. The page reads where the
task stands (`status`): labels, cross-validated accuracy, the certified automatic share at the target
precision (on the pool), and how many more labels the next step needs. Interrupted, it resumes from
the store: what was drawn and not labelled is still in the queue."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.selection import apply_variant
from llamadecide.calibration.steps import fit_and_certify
from llamadecide.calibration.variants import Variant, VariantScores, demonstration_items
from llamadecide.decisions.maths import confidence
from llamadecide.labels.active import DrawRule, automatic, draw, gain, inclusion
from llamadecide.labels.records import ReviewItem, state_sha256
from llamadecide.labels.refit import store_labels
from llamadecide.labels.replay import OrderingModel
from llamadecide.labels.store import LabelStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LabellingConfig:
    run: RunConfig  # what a refit does: target precision, confidence, prompt formats, budget
    rule: DrawRule = DrawRule()
    refit_every: int = 20  # labels between background refits
    until_auto_share: float | None = None  # stop once a refit certifies this share of the pool
    pool_name: str = "pool"  # the data's fingerprint: frames are named after it


class LabellingSession:
    def __init__(
        self,
        task: Task,
        pool: list[LabelledItem],
        scored: dict[Variant, VariantScores],
        store: LabelStore,
        config: LabellingConfig,
        *,
        initial: np.ndarray | None = None,
        seed: int = 0,
    ) -> None:
        """`initial`: the pool's probabilities to draw by before any refit (a profile's, or the
        zero-shot answers); None: uniform."""
        self.task, self.pool, self.scored, self.store, self.config = task, pool, scored, store, config
        self.index = {item.id: i for i, item in enumerate(pool)}
        self.rng = np.random.default_rng(seed)  # the draws of a session: a seeded sequence
        self.probabilities = initial  # what draws read
        self.figures: dict = {"refits": 0, "refit_labels": None}
        self.model: OrderingModel | None = None
        self.done = False
        self.on_done = lambda: None  # told once a refit reaches `until_auto_share` (the CLI stops there)
        self._lock = threading.Lock()  # the draw and the figures
        self._refitting: threading.Thread | None = None
        self._labels_at_refit = 0

    # -- the queue ---------------------------------------------------------------------------------

    def fill_queue(self) -> int:
        """Draw a round when fewer than half a round wait for a label; returns the items it queued."""
        with self._lock:
            if self.done or len(self.store.pending(limit=self.config.rule.size)) >= max(1, self.config.rule.size // 2):
                return 0
            labelled = {r.item.id for r in self.store.labelled(task=self.task.name)}
            held = np.array([item.id in labelled for item in self.pool])
            if held.all():
                return 0
            counts = np.bincount(
                [
                    self.task.gold_index(str(label).lower() if isinstance(label, bool) else str(label))
                    for label in self._labels()
                ],
                minlength=len(self.task.options),
            )
            rule, P = self.config.rule, self.probabilities
            gains, sure = (
                (gain(P, counts, rule), automatic(P, self.config.run.target_precision))
                if P is not None
                else (np.zeros(0), None)
            )
            chances = inclusion(gains, held, rule, sure)
            picked = draw(chances, self.rng)
            frame = f"label:{self.config.pool_name}:{time.time_ns()}"
            fresh = [i for i in picked if not held[i] and self.store.get(self.pool[i].id, "0") is None]
            again = [i for i in picked if held[i]]
            self.store.record([self._queued(i, float(chances[i]), frame) for i in fresh])
            self.store.add_draws([(self.pool[i].id, "0", frame, float(chances[i])) for i in again])
            return len(fresh)

    def _queued(self, i: int, chance: float, frame: str) -> ReviewItem:
        item = self.pool[i]
        k = len(self.task.options)
        P = self.probabilities[i] if self.probabilities is not None else np.full(k, 1.0 / k)
        return ReviewItem(
            id=item.id,
            question="0",
            kind=self.task.type,
            instructions=self.task.instructions,
            options=tuple(self.task.options),
            probabilities=tuple(float(p) for p in P),
            confidence=float(confidence(np.asarray(P)[None])[0]),
            input_sha256=state_sha256(item.text),
            origin="drawn",
            created=time.time(),
            queued=True,
            chance=chance,
            frame=frame,
            input=item.text,
            task=self.task.name,
            option_names=tuple(str(o).lower() if isinstance(o, bool) else str(o) for o in self.task.options),
        )

    def _labels(self) -> list:
        return [r.label for r in self.store.labelled(task=self.task.name)]

    # -- refits ------------------------------------------------------------------------------------

    def after_labels(self) -> None:
        """Told after labels came in: start a background refit every `refit_every` labels, and keep
        the queue filled."""
        count = len(self._labels())
        if count - self._labels_at_refit >= self.config.refit_every and (
            self._refitting is None or not self._refitting.is_alive()
        ):
            self._labels_at_refit = count
            self._refitting = threading.Thread(target=self._refit_logged, daemon=True)
            self._refitting.start()
        self.fill_queue()

    def _refit_logged(self) -> None:
        """Refit until no refit is due: labels that came in during one are not left waiting."""
        while True:
            try:
                self.refit()
            except Exception:  # noqa: BLE001 - the person goes on labelling with the last model
                log.exception("refit failed; the draws keep the last model")
                return
            count = len(self._labels())
            if count - self._labels_at_refit < self.config.refit_every:
                return
            self._labels_at_refit = count

    def refit(self) -> dict:
        """Choose, fit and certify on every label so far (items of known chance certify), measure
        the certified share on the pool, and draw from the new model."""
        found = store_labels(self.store, self.task, profile=self.task.name)
        kept = [
            (self.index[item.id.rsplit(":", 1)[0]], item)
            for item in found.items
            if item.id.rsplit(":", 1)[0] in self.index
        ]
        if len({self.task.gold_index(item.label) for _, item in kept}) < 2:
            with self._lock:  # one option labelled: nothing to choose between yet
                self.figures = {**self.figures, "next_step": "label items of a second option to fit a model"}
            return self.figures
        idx = np.array([i for i, _ in kept])
        y = np.full(len(self.pool), -1)
        y[idx] = [self.task.gold_index(item.label) for _, item in kept]
        draws = {i: item.draws for i, item in kept}
        idx = np.setdiff1d(idx, demonstration_items(self.scored))
        drawn = [draws[int(i)] for i in idx]
        steps = fit_and_certify(self.scored, idx, drawn, y, self.config.run)
        choice, fit, certified, data = steps.choice, steps.fit, steps.certified, steps.data
        P_pool = apply_variant(fit.calibrator, data, np.arange(len(self.pool)))
        threshold = certified.threshold.threshold if certified.threshold else None
        share = float((confidence(P_pool) >= threshold).mean()) if threshold is not None else 0.0
        counts = steps.counts
        figures = {
            "labels": int(len(kept)),
            "certifying": counts["certify"],
            "accuracy": choice.chosen["cv_accuracy"],
            "method": choice.chosen["label"],
            "threshold": threshold,
            "certified_auto_share": share if threshold is not None else None,
            "next_step": _next_step(certified.reachable, self.config.run.target_precision, threshold is not None),
            "refits": self.figures.get("refits", 0) + 1,
            "refit_labels": int(len(kept)),
        }
        with self._lock:
            self.probabilities = P_pool
            self.figures = figures
            reached = self.config.until_auto_share is not None and share >= self.config.until_auto_share
            self.done = self.done or reached
        if reached:
            self.on_done()
        return figures

    @property
    def refitting(self) -> bool:
        return self._refitting is not None and self._refitting.is_alive()

    def status(self) -> dict:
        """Where the task stands, for the page."""
        records = self.store.labelled(task=self.task.name)
        with self._lock:
            figures = dict(self.figures)
        return {
            "task": self.task.name,
            "labels": len(records),
            "certifying": sum(1 for r in records if r.draws),
            "accuracy": figures.get("accuracy"),
            "method": figures.get("method"),
            "target_precision": self.config.run.target_precision,
            "certified_auto_share": figures.get("certified_auto_share"),
            "next_step": figures.get("next_step"),
            "refits": figures.get("refits", 0),
            "refit_labels": figures.get("refit_labels"),
            "refitting": self.refitting,
            "pool": len(self.pool),
            "done": self.done,
        }


def initial_probabilities(
    engine, task: Task, pool: list[LabelledItem], scored, profile: Path | None
) -> np.ndarray | None:
    """What the first draws read: a profile's answers on the pool (decided as served), else the
    zero-shot answers where every item has them, else nothing (uniform draws)."""
    from llamadecide.calibration.calibrators import Calibrator

    if profile is not None:
        from llamadecide.calibration.profile import CalibrationProfile, profile_files
        from llamadecide.decisions import Decider, DecisionInput

        chosen = CalibrationProfile.load((profile_files(profile) if profile.is_dir() else [profile])[0])
        chosen.check_options(task.type, list(task.options))
        decider = Decider(engine)
        decided = []
        for start in range(0, len(pool), 16):
            batch = [
                DecisionInput(item.text, [chosen.question()], chosen.scoring()) for item in pool[start : start + 16]
            ]
            uniform = [1.0 / len(task.options)] * len(task.options)
            decided += [
                uniform if isinstance(decision, Exception) else decision.answers[0].probabilities
                for decision in decider.decide_many(batch)
            ]
        return np.array(decided)
    answered = [data for data in scored.values() if data.answered is None and not data.hidden_only]
    return Calibrator().apply(answered[0].L, None) if answered else None


def _next_step(found: dict, target: float, certified: bool) -> str:
    """What calibrate estimates the next step needs, in a line (labels in all: `labels_needed`)."""
    need = found.get("labels_needed")
    if need is None:
        return f"no confident slice is above precision {target} yet: label on"
    more = need["more"]
    if more > 0:
        return f"about {more} more labels to certify precision {target} on {need['coverage']:.0%} of items"
    if certified:
        return f"precision {target} is certified; more labels widen the share it covers"
    return f"at the precision seen these labels would do for precision {target}, but its test has not cleared: label on"


def pool_items(path: Path, text_column: str, id_column: str | None) -> list[LabelledItem]:
    """The unlabelled file's items (CSV, TSV or JSON Lines), as items with no label yet; a line that
    cannot be read is refused with its reason, and two lines with one id are refused."""
    from llamadecide.bulk import read_inputs
    from llamadecide.errors import InvalidRequestError

    items = []
    for entry in read_inputs(path, text_column=text_column, id_column=id_column):
        if entry.error:
            raise InvalidRequestError(f"{path}: {entry.error}")
        items.append(LabelledItem(entry.id, entry.text, ""))
    if len({item.id for item in items}) != len(items):
        raise InvalidRequestError(f"{path}: two lines share an id; name a column of unique ids (--id-column)")
    return items
