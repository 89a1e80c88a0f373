"""Every item's scores under each variant of a calibration run, within its row budget, many items
per backend call, cached and resumable."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from llamadecide.calibration.backends import Backend, ItemScores
from llamadecide.calibration.budget import ScoringPlan, plan_scoring
from llamadecide.calibration.cache import ScoreCache
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.variants import Variant, VariantScores, choose_demonstrations, variants_for
from llamadecide.decisions import Question, Scoring
from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION, QUESTION_FIRST_FORMATS
from llamadecide.decisions.scoring import Demonstration

BATCH_ITEMS = 16  # items handed to the backend at once (the local engine shares its calls among them)
RACE_START = 32  # answered items before a subsample's answers may stop (`score_variants`' `settled`)


def _cache_mode(
    variant: Variant, hidden: bool, demonstrations: tuple[Demonstration, ...] = (), layer: int | None = None
) -> str:
    mode = variant.mode if variant.rotations == 1 else f"{variant.mode}|rotations={variant.rotations}"
    if variant.prompt_format != PROMPT_FORMAT_VERSION:
        mode += f"|layout={variant.prompt_format}"
    if demonstrations:
        shown = json.dumps([[d.input, d.option] for d in demonstrations])
        mode += f"|demonstrations={hashlib.sha256(shown.encode()).hexdigest()[:16]}"
    if hidden and layer is not None:
        return mode + f"|hidden@{layer}"
    return mode + ("|hidden" if hidden else "")


def _prompt(variant: Variant) -> tuple[str, int, str]:
    """What a variant's prompt is made of: variants of one prompt read the same hidden state."""
    return (variant.mode, variant.shots, variant.prompt_format)


def score_variants(
    backend: Backend,
    task: Task,
    items: list[LabelledItem],
    used: np.ndarray,
    config: RunConfig,
    cache: ScoreCache,
    *,
    pool: np.ndarray | None = None,
    split_parts: tuple[np.ndarray, ...] | None = None,
    report: dict | None = None,
    defer_answers: np.ndarray | None = None,
    settled: Callable[[dict[Variant, VariantScores]], bool] | None = None,
) -> dict[Variant, VariantScores]:
    """Every variant's scores for the used items (rows of the unused items stay zero), variant by
    variant, many items per backend call (the local engine evaluates them in shared calls, each as
    alone); hidden states are read once per prompt (mode and demonstrations), in the scoring calls.
    k-shot demonstrations come from `pool` (the labelled part); an item that is itself a
    demonstration is scored with the others only. Resumable: every item's scores are cached. Within
    `config.row_budget` (`plan_scoring`): variants it cannot afford are left out, answers may be scored
    on a subsample (`VariantScores.answered`) and hidden states alone on every item. A subsample's
    answers come last, in rounds of `BATCH_ITEMS` in a seeded order, and stop once `settled` says so
    (asked from `RACE_START` answered items on); the items in `defer_answers` (the test part) get
    none: a later call without it scores them, the rest from the cache."""
    scorer = VariantScorer(backend, task, items, used, config, cache, pool)
    plan = scorer.plan(split_parts or (used,), report)
    answered = scorer.score_planned(plan, defer_answers, settled)
    if report is not None:
        report["answers_scored"] = {v.label: int(len(idx)) for v, idx in answered.items()}
        report["answers_planned"] = {v.label: int(len(idx)) for v, idx in plan.answered.items()}
    return scorer.collect(answered)


@dataclass
class VariantScorer:
    """One run's scoring: the variants, their demonstrations and prompts, what each item scored
    (answers per variant, hidden states per prompt), the cache and the progress bars."""

    backend: Backend
    task: Task
    items: list[LabelledItem]
    used: np.ndarray
    config: RunConfig
    cache: ScoreCache
    pool: np.ndarray | None
    variants: list[Variant] = field(init=False)
    shown: dict[Variant, list[int]] = field(init=False)  # item indices of each variant's demonstrations
    rules: dict[Variant, Scoring] = field(init=False)  # the prompt each variant asks in
    questions: dict[Variant, Question] = field(init=False)
    reads_hidden: dict[Variant, bool] = field(init=False)  # the first variant of each prompt reads its hidden state
    costs: dict[Variant, tuple[float, float]] = field(init=False)
    layer: int | None = field(init=False)
    content_free: dict[Variant, tuple] = field(default_factory=dict)  # answers on content-free inputs

    def __post_init__(self) -> None:
        want_hidden = self.config.head and self.backend.supports_hidden
        demonstrations = self.backend.supports_demonstrations and self.pool is not None
        self.variants = [
            v
            for v in variants_for(self.task, self.config, demonstrations=demonstrations)
            if want_hidden or not v.hidden_only
        ]
        prompts: set[tuple[str, int, str]] = set()
        self.reads_hidden = {}
        for variant in self.variants:
            self.reads_hidden[variant] = want_hidden and _prompt(variant) not in prompts
            prompts.add(_prompt(variant))
        self.shown = {v: [] for v in self.variants}
        shown_items: dict[Variant, tuple[Demonstration, ...]] = {v: () for v in self.variants}
        if any(v.shots for v in self.variants):
            y = np.array([self.task.gold_index(item.label) for item in self.items])
            for variant in (v for v in self.variants if v.shots):
                self.shown[variant] = choose_demonstrations(self.items, y, self.pool, variant.shots, self.config.seed)
                shown_items[variant] = tuple(Demonstration(self.items[i].text, int(y[i])) for i in self.shown[variant])
        self.rules = {v: v.rule(shown_items[v]) for v in self.variants}
        self.questions = {v: self.task.question(v.mode) for v in self.variants}
        self.costs = self._costs()
        self.layer = self.backend.head_layer(self.config.head_depth)
        k = len(self.task.options)
        self.L = {v: np.zeros((len(self.items), k)) for v in self.variants}
        self.lengths: dict[Variant, np.ndarray | None] = {v: np.ones((len(self.items), k)) for v in self.variants}
        self.hidden: dict[tuple[str, int, str], np.ndarray] = {}
        self.hidden_mask: dict[tuple[str, int, str], np.ndarray] = {}
        self.identity = self.backend.identity()

    def _costs(self) -> dict[Variant, tuple[float, float]]:
        """What each variant costs per item in weighted rows (answers, hidden state alone): a few
        items' mean, where the backend can tell (the local engine)."""
        if not self.backend.supports_hidden:
            return {}
        sample = [self.items[int(i)].text for i in self.used[:: max(1, len(self.used) // 8)][:8]]
        return {
            v: tuple(np.mean([self.backend.cost(text, self.questions[v], self.rules[v]) for text in sample], axis=0))
            for v in self.variants
        }

    def plan(self, split_parts: tuple[np.ndarray, ...], report: dict | None) -> ScoringPlan:
        """What the row budget allows (`plan_scoring`), said in `report`."""
        answered_variants = [v for v in self.variants if not v.hidden_only]
        head_only = [v for v in self.variants if v.hidden_only]
        head_only_rows = 0
        if self.config.row_budget and self.costs:
            plan = plan_scoring(
                answered_variants,
                self.costs,
                self.used,
                split_parts,
                self.config.row_budget,
                {v for v in answered_variants if self.reads_hidden[v]},
                self.config.seed,
                min_answered=self.config.min_answered,
            )
            head_only_rows = int(sum(self.costs[v][1] for v in head_only) * len(self.used))
        else:
            plan = ScoringPlan({v: self.used for v in answered_variants}, (), 0)
        if report is not None:
            report.update(
                {
                    "row_budget": self.config.row_budget,
                    "estimated_rows": plan.rows + head_only_rows,
                    "hidden_state_on_every_item": [v.label for v in (*plan.hidden_variants, *head_only)],
                    "left_out": [v.label for v in plan.left_out],
                    "head_layer": self.layer,  # the block heads read (None: the final state)
                }
            )
        return plan

    def record(self, variant: Variant, i: int, scores: ItemScores, answers: bool = True) -> None:
        key = _prompt(variant)
        if scores.hidden is not None:
            self.hidden.setdefault(key, np.zeros((len(self.items), len(scores.hidden))))[i] = scores.hidden
            self.hidden_mask.setdefault(key, np.zeros(len(self.items), dtype=bool))[i] = True
        if not answers:
            return
        self.L[variant][i] = scores.logprobs
        if scores.n_tokens is None:
            self.lengths[variant] = None
        elif self.lengths[variant] is not None:
            self.lengths[variant][i] = scores.n_tokens

    def run(self, variant: Variant, indices: np.ndarray, *, answers: bool, with_hidden: bool, advance) -> None:
        """Score these items under a variant: from the cache, else BATCH_ITEMS at a time, grouped by
        the demonstrations shown before them (an item that is itself a demonstration is shown the others)."""
        pending: dict[tuple[Demonstration, ...], list[tuple[int, str]]] = {}
        shown = self.rules[variant].demonstrations
        for i in indices:
            if variant.prompt_format in QUESTION_FIRST_FORMATS and i in self.shown[variant]:
                advance(1)
                continue  # part of this variant's prompt: never scored (see demonstration_items)
            own = tuple(d for j, d in zip(self.shown[variant], shown) if j != i)
            mode = _cache_mode(variant, with_hidden, own, self.layer) + ("" if answers else "|no-answers")
            key = self.cache.key(
                self.identity, PROMPT_FORMAT_VERSION, mode, self.task.fingerprint(), self.items[i].text
            )
            scores = self.cache.get(key)
            if scores is None:
                pending.setdefault(own, []).append((int(i), key))
            else:
                self.record(variant, int(i), scores, answers)
                advance(1)
        for own, members in pending.items():
            rule = Scoring(rotations=variant.rotations, demonstrations=own, prompt_format=variant.prompt_format)
            for start in range(0, len(members), BATCH_ITEMS):
                chunk = members[start : start + BATCH_ITEMS]
                results = self.backend.score_many(
                    [self.items[i].text for i, _ in chunk],
                    self.questions[variant],
                    rule,
                    hidden=with_hidden,
                    hidden_layer=self.layer if with_hidden else None,
                    answers=answers,
                )
                for (i, key), scores in zip(chunk, results):
                    self.cache.put(key, scores)
                    self.record(variant, i, scores, answers)
                self.cache.commit()
                advance(len(chunk))

    def collect(self, answered: dict[Variant, np.ndarray]) -> dict[Variant, VariantScores]:
        """Every variant's scores so far (answers on the items in `answered`)."""
        texts = [item.text for item in self.items]  # strings: the model sees them verbatim (prompt.render_state)
        scored: dict[Variant, VariantScores] = {}
        for variant in (v for v in self.variants if v in answered):
            key = _prompt(variant)
            variant_hidden = self.hidden.get(key)
            complete = len(answered[variant]) == len(self.used)
            mask = np.zeros(len(self.items), dtype=bool)
            mask[answered[variant]] = True
            scored[variant] = VariantScores(
                self.L[variant],
                self.lengths[variant],
                variant_hidden,
                self.content_free.get(variant),
                self.rules[variant].demonstrations,
                texts if variant_hidden is not None and self.config.lexical else None,
                tuple(self.shown[variant]),
                None if complete else mask,
                None if complete else self.hidden_mask.get(key),
                served_rows=self.costs.get(variant),
                hidden_layer=self.layer,
                inputs=texts,
            )
        for variant in (v for v in self.variants if v.hidden_only):
            scored[variant] = VariantScores(
                self.L[variant],
                None,
                self.hidden.get(_prompt(variant)),
                None,
                (),
                texts if self.config.lexical else None,
                hidden_only=True,
                served_rows=self.costs.get(variant),
                hidden_layer=self.layer,
                inputs=texts,
            )
        return scored

    def score_planned(
        self,
        plan: ScoringPlan,
        defer_answers: np.ndarray | None,
        settled: Callable[[dict[Variant, VariantScores]], bool] | None,
    ) -> dict[Variant, np.ndarray]:
        """Every planned answer and hidden state; a subsample's answers last, in rounds, until settled.
        Returns the items each variant's answers were scored on."""
        if self.config.prior_correction:
            self.content_free = {v: self.backend.content_free(self.questions[v], self.rules[v]) for v in plan.answered}
        subsampled = plan.hidden_variants
        answered = {v: idx for v, idx in plan.answered.items() if v not in subsampled}
        rng = np.random.default_rng(self.config.seed)
        waiting = {  # a subsample's answers, in a seeded order (data files are often sorted by label)
            v: list(rng.permutation(np.setdiff1d(plan.answered[v], () if defer_answers is None else defer_answers)))
            for v in subsampled
        }
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            disable=not self.config.show_progress,
        ) as progress:

            def bar(label: str, variant: Variant, total: int):
                task = progress.add_task(f"{label} ({variant.label})", total=total)
                return task, lambda n: progress.advance(task, n)

            for variant, indices in answered.items():
                _, advance = bar("scoring", variant, len(indices))
                self.run(variant, indices, answers=True, with_hidden=self.reads_hidden[variant], advance=advance)
            for variant in (*subsampled, *(v for v in self.variants if v.hidden_only)):
                _, advance = bar("hidden states", variant, len(self.used))
                self.run(variant, self.used, answers=False, with_hidden=True, advance=advance)
            bars = {v: bar("answers on a subsample", v, len(waiting[v])) for v in subsampled}
            answered.update({v: np.array([], dtype=int) for v in subsampled})
            while any(waiting.values()):
                if (
                    settled is not None
                    and all(len(answered[v]) >= RACE_START for v in subsampled)
                    and settled(self.collect(answered))
                ):
                    for v in subsampled:
                        progress.update(bars[v][0], total=len(answered[v]))
                    break
                for v in subsampled:
                    chunk, waiting[v] = np.array(waiting[v][:BATCH_ITEMS], dtype=int), waiting[v][BATCH_ITEMS:]
                    self.run(v, np.sort(chunk), answers=True, with_hidden=False, advance=bars[v][1])
                    answered[v] = np.sort(np.concatenate([answered[v], chunk]))
        self.cache.commit()
        return answered
