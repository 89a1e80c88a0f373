"""Every item's scores under each variant of a calibration run, within its row budget, many items
per backend call, cached and resumable."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from llamadecide.calibration.backends import Backend
from llamadecide.calibration.budget import ScoringPlan, plan_scoring
from llamadecide.calibration.cache import ScoreCache
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.variants import Variant, VariantScores, choose_demonstrations, variants_for
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
    want_hidden = config.head and backend.supports_hidden
    variants = [
        v
        for v in variants_for(task, config, demonstrations=backend.supports_demonstrations and pool is not None)
        if want_hidden or not v.hidden_only
    ]
    head_only = [v for v in variants if v.hidden_only]  # hidden states on every item, never answers
    hidden_variant: dict[Variant, bool] = {}
    prompts_with_hidden: set[tuple[str, int, str]] = set()
    for variant in variants:
        prompt = (variant.mode, variant.shots, variant.prompt_format)
        hidden_variant[variant] = want_hidden and prompt not in prompts_with_hidden
        if hidden_variant[variant]:
            prompts_with_hidden.add(prompt)
    shown: dict[Variant, list[int]] = {v: [] for v in variants}  # item indices of each variant's demonstrations
    demonstrations: dict[Variant, tuple[Demonstration, ...]] = {v: () for v in variants}
    if any(v.shots for v in variants):
        y = np.array([task.gold_index(item.label) for item in items])
        for variant in (v for v in variants if v.shots):
            shown[variant] = choose_demonstrations(items, y, pool, variant.shots, config.seed)
            demonstrations[variant] = tuple(Demonstration(items[i].text, int(y[i])) for i in shown[variant])
    questions = {v: task.question(v.mode) for v in variants}
    answered_variants = [v for v in variants if not v.hidden_only]
    head_only_rows = 0
    costs: dict[Variant, tuple[float, float]] = {}
    if backend.supports_hidden:  # the local engine: its work can be estimated (a few items' mean)
        sample = [items[int(i)].text for i in used[:: max(1, len(used) // 8)][:8]]
        costs = {
            v: tuple(
                np.mean(
                    [
                        backend.cost(
                            text,
                            questions[v],
                            rotations=v.rotations,
                            demonstrations=demonstrations[v],
                            prompt_format=v.prompt_format,
                        )
                        for text in sample
                    ],
                    axis=0,
                )
            )
            for v in variants
        }
    if config.row_budget and costs:
        plan = plan_scoring(
            answered_variants,
            costs,
            used,
            split_parts or (used,),
            config.row_budget,
            {v for v in answered_variants if hidden_variant[v]},
            config.seed,
            min_answered=config.min_answered,
        )
        head_only_rows = int(sum(costs[v][1] for v in head_only) * len(used))
    else:
        plan = ScoringPlan({v: used for v in answered_variants}, (), 0)
    layer = backend.head_layer(config.head_depth)
    if report is not None:
        report.update(
            {
                "row_budget": config.row_budget,
                "estimated_rows": plan.rows + head_only_rows,
                "hidden_state_on_every_item": [v.label for v in (*plan.hidden_variants, *head_only)],
                "left_out": [v.label for v in plan.left_out],
                "head_layer": layer,  # the block heads read (None: the final state)
            }
        )
    identity = backend.identity()
    k = len(task.options)
    L = {v: np.zeros((len(items), k)) for v in variants}
    lengths: dict[Variant, np.ndarray | None] = {v: np.ones((len(items), k)) for v in variants}
    hidden: dict[tuple[str, int, str], np.ndarray] = {}
    hidden_mask: dict[tuple[str, int, str], np.ndarray] = {}

    def record(variant: Variant, i: int, scores, answers: bool = True) -> None:
        key = (variant.mode, variant.shots, variant.prompt_format)
        if scores.hidden is not None:
            hidden.setdefault(key, np.zeros((len(items), len(scores.hidden))))[i] = scores.hidden
            hidden_mask.setdefault(key, np.zeros(len(items), dtype=bool))[i] = True
        if not answers:
            return
        L[variant][i] = scores.logprobs
        if scores.n_tokens is None:
            lengths[variant] = None
        elif lengths[variant] is not None:
            lengths[variant][i] = scores.n_tokens

    def run(variant: Variant, indices: np.ndarray, *, answers: bool, with_hidden: bool, progress, bar) -> None:
        # Items not in the cache, grouped by the demonstrations shown before them (an item that is
        # itself a demonstration is shown the others), scored BATCH_ITEMS at a time.
        pending: dict[tuple[Demonstration, ...], list[tuple[int, str]]] = {}
        for i in indices:
            if variant.prompt_format in QUESTION_FIRST_FORMATS and i in shown[variant]:
                progress.advance(bar)
                continue  # part of this variant's prompt: never scored (see demonstration_items)
            own = tuple(d for j, d in zip(shown[variant], demonstrations[variant]) if j != i)
            mode = _cache_mode(variant, with_hidden, own, layer) + ("" if answers else "|no-answers")
            key = cache.key(identity, PROMPT_FORMAT_VERSION, mode, task.fingerprint(), items[i].text)
            scores = cache.get(key)
            if scores is None:
                pending.setdefault(own, []).append((int(i), key))
            else:
                record(variant, int(i), scores, answers)
                progress.advance(bar)
        for own, members in pending.items():
            for start in range(0, len(members), BATCH_ITEMS):
                chunk = members[start : start + BATCH_ITEMS]
                results = backend.score_many(
                    [items[i].text for i, _ in chunk],
                    questions[variant],
                    rotations=variant.rotations,
                    hidden=with_hidden,
                    hidden_layer=layer if with_hidden else None,
                    demonstrations=own,
                    prompt_format=variant.prompt_format,
                    answers=answers,
                )
                for (i, key), scores in zip(chunk, results):
                    cache.put(key, scores)
                    record(variant, i, scores, answers)
                cache.commit()
                progress.advance(bar, len(chunk))

    content_free = {
        variant: backend.content_free(
            questions[variant],
            rotations=variant.rotations,
            demonstrations=demonstrations[variant],
            prompt_format=variant.prompt_format,
        )
        if config.prior_correction
        else None
        for variant in plan.answered
    }
    texts = [item.text for item in items]  # strings: the model sees them verbatim (prompt.render_state)

    def collect(answered: dict[Variant, np.ndarray]) -> dict[Variant, VariantScores]:
        scored: dict[Variant, VariantScores] = {}
        for variant in (v for v in variants if v in answered):
            key = (variant.mode, variant.shots, variant.prompt_format)
            variant_hidden = hidden.get(key)
            complete = len(answered[variant]) == len(used)
            mask = np.zeros(len(items), dtype=bool)
            mask[answered[variant]] = True
            scored[variant] = VariantScores(
                L[variant],
                lengths[variant],
                variant_hidden,
                content_free[variant],
                demonstrations[variant],
                texts if variant_hidden is not None and config.lexical else None,
                tuple(shown[variant]),
                None if complete else mask,
                None if complete else hidden_mask.get(key),
                served_rows=costs.get(variant),
                hidden_layer=layer,
            )
        for variant in head_only:
            key = (variant.mode, variant.shots, variant.prompt_format)
            scored[variant] = VariantScores(
                L[variant],
                None,
                hidden.get(key),
                None,
                (),
                texts if config.lexical else None,
                hidden_only=True,
                served_rows=costs.get(variant),
                hidden_layer=layer,
            )
        return scored

    subsampled = plan.hidden_variants
    answered = {v: idx for v, idx in plan.answered.items() if v not in subsampled}
    rng = np.random.default_rng(config.seed)
    waiting = {  # a subsample's answers, in a seeded order (data files are often sorted by label)
        v: list(rng.permutation(np.setdiff1d(plan.answered[v], () if defer_answers is None else defer_answers)))
        for v in subsampled
    }
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=not config.show_progress,
    ) as progress:

        def new_bar(label: str, variant: Variant, total: int):
            return progress.add_task(f"{label} ({variant.label})", total=total)

        for variant, indices in answered.items():
            run(
                variant,
                indices,
                answers=True,
                with_hidden=hidden_variant[variant],
                progress=progress,
                bar=new_bar("scoring", variant, len(indices)),
            )
        for variant in (*subsampled, *head_only):
            run(
                variant,
                used,
                answers=False,
                with_hidden=True,
                progress=progress,
                bar=new_bar("hidden states", variant, len(used)),
            )
        bars = {v: new_bar("answers on a subsample", v, len(waiting[v])) for v in subsampled}
        answered.update({v: np.array([], dtype=int) for v in subsampled})
        while any(waiting.values()):
            if (
                settled is not None
                and all(len(answered[v]) >= RACE_START for v in subsampled)
                and settled(collect(answered))
            ):
                for v in subsampled:
                    progress.update(bars[v], total=len(answered[v]))
                break
            for v in subsampled:
                chunk, waiting[v] = np.array(waiting[v][:BATCH_ITEMS], dtype=int), waiting[v][BATCH_ITEMS:]
                run(v, np.sort(chunk), answers=True, with_hidden=False, progress=progress, bar=bars[v])
                answered[v] = np.sort(np.concatenate([answered[v], chunk]))
    cache.commit()
    if report is not None:
        report["answers_scored"] = {v.label: int(len(idx)) for v, idx in answered.items()}
        report["answers_planned"] = {v.label: int(len(idx)) for v, idx in plan.answered.items()}
    return collect(answered)
