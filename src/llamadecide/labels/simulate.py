"""The stream simulation: what production's reviews do for a task, replayed on a labelled file with
the file's labels as the person.

N random items are labelled to start; M items are replayed as traffic through the current profile,
every escalation and the audited share of automatic decisions going through the review queue and
the label store exactly as the server sends them (`queue.draw_for_review`, `ReviewItem`), the
person answering from the file; every L new labels the profile is refitted from the store's labels
(`calibration.run`'s steps: choose, fit, certify on the items of known chance), and a fixed test
part of K items never streamed measures what the certified threshold really does. Every item is
scored once (cached); a refit fits on cached scores."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamadecide.calibration.backends import Backend
from llamadecide.calibration.cache import ScoreCache
from llamadecide.calibration.config import RunConfig, option
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.selection import apply_variant
from llamadecide.calibration.steps import certify, choose_method, evidence, fit_method, held_out_counts, hold_out
from llamadecide.calibration.thresholds import weighted_lower_bound
from llamadecide.calibration.variant_scoring import score_variants
from llamadecide.calibration.variants import Variant, VariantScores, demonstration_items
from llamadecide.decisions.maths import confidence
from llamadecide.errors import InvalidRequestError
from llamadecide.labels.orders import OrderingModel, compare_orders, plot_orders
from llamadecide.labels.queue import draw_for_review, served_frame
from llamadecide.labels.records import Label, ReviewItem, state_sha256
from llamadecide.labels.sqlite_store import SqliteLabelStore

START_FRAME = "start"  # the random labels to start with: a census of their own draw (chance 1)


@dataclass(frozen=True)
class SimulationConfig:
    out_dir: Path
    run: RunConfig  # what a refit does (target precision, confidence, prompt formats, budget...)
    start_labels: int = option(200, "Random items labelled to start with", min=2)
    stream: int = option(2000, "Items replayed as traffic through the profile", min=1)
    test_size: int = option(880, "Items never streamed, on which each refit's threshold is measured", min=1)
    audit_rate: float = option(0.02, "Share of automatic decisions drawn into the review queue", min=0.0, max=1.0)
    refit_every: int = option(250, "New labels between refits", min=1)
    seeds: int = option(1, "Replays, each with its own split and audit draws (seed, seed + 1, ...)", min=1)
    baseline_labels: int = option(
        1000, "A profile fitted on this many random labels, measured on the same test part (0: none)", min=0
    )
    orders: tuple[str, ...] = option(
        (),
        "Instead of a stream, compare labelling orders from no labels (repeat: active, random): the start "
        "labels, then rounds of --round-size until --max-labels, a refit every --measure-every labels",
        "--order",
    )
    max_labels: int = option(1000, "With --order: labels to stop at", min=2)
    measure_every: int = option(100, "With --order: labels between refits (each measured on the test part)", min=1)
    round_size: int = option(20, "With --order: new labels a round asks for", min=1)
    floor: float = option(0.2, "With --order active: the uniform share of each draw", min=0.01, max=1.0)


@dataclass(frozen=True)
class Split:
    test: np.ndarray
    start: np.ndarray
    stream: np.ndarray  # in replay order


def universe(n: int, config: SimulationConfig) -> np.ndarray:
    """The items every replay draws from (scored once): a seeded sample of the file."""
    size = config.start_labels + config.stream + config.test_size
    if size > n or config.start_labels < 2 or config.test_size < 1 or config.stream < 1:
        raise InvalidRequestError(
            f"cannot draw {config.start_labels} start, {config.stream} streamed and {config.test_size} test items "
            f"from {n}"
        )
    return np.sort(np.random.default_rng(config.run.seed).permutation(n)[:size])


def split(items: np.ndarray, config: SimulationConfig, seed: int) -> Split:
    order = np.random.default_rng(seed).permutation(items)
    k, n = config.test_size, config.start_labels
    return Split(np.sort(order[:k]), np.sort(order[k : k + n]), order[k + n : k + n + config.stream])


def score_universe(
    backend: Backend, task: Task, items: list[LabelledItem], used: np.ndarray, config: SimulationConfig
) -> dict[Variant, VariantScores]:
    """Every used item scored once (cached in the output folder)."""
    return score_pool(backend, task, items, used, config.run, Path(config.out_dir) / "cache.sqlite")


def score_pool(
    backend: Backend, task: Task, items: list[LabelledItem], used: np.ndarray, run: RunConfig, cache_path: Path
) -> dict[Variant, VariantScores]:
    """Every used item scored once, as a pool is: where the row budget scored a variant's answers on a
    subsample, not every item can be answered with them, so that variant keeps its hidden states only;
    question-first formats zero-shot (demonstrations would come from labels not given yet)."""
    run = dataclasses.replace(run, shots=0, shots_per_class=(0,))
    cache = ScoreCache(cache_path)
    try:
        scored = score_variants(backend, task, items, used, run, cache, pool=used, split_parts=(used,))
    finally:
        cache.close()
    return {
        v: dataclasses.replace(data, hidden_only=True) if data.answered is not None and not data.hidden_only else data
        for v, data in scored.items()
        if not (data.answered is not None and data.hidden is None)
    }


def simulate(backend: Backend, task: Task, items: list[LabelledItem], config: SimulationConfig) -> dict:
    """Every replay's points, the baseline, written to DIR/simulation.json (and the plot)."""
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    y = np.array([task.gold_index(item.label) for item in items])
    used = universe(len(items), config)
    scored = score_universe(backend, task, items, used, config)
    if config.orders:
        result = compare_orders(task, items, y, scored, used, config)
        (out / "simulation.json").write_text(json.dumps(result, indent=2, default=float), encoding="utf-8")
        plot_orders(result, out / "simulation.png")
        return result
    replays = []
    for seed in range(config.run.seed, config.run.seed + config.seeds):
        parts = split(used, config, seed)
        replays.append({"seed": seed, "points": replay(task, items, y, scored, parts, config, seed)})
    baseline = fit_baseline(task, y, scored, split(used, config, config.run.seed), config)
    result = {
        "task": task.name,
        "target_precision": config.run.target_precision,
        "confidence_level": config.run.confidence_level,
        "audit_rate": config.audit_rate,
        "refit_every": config.refit_every,
        "start_labels": config.start_labels,
        "stream": config.stream,
        "test_size": config.test_size,
        "points": replays[0]["points"],
        "replays": replays,
        "baseline": baseline,
        "honesty": honesty(replays, config.run.target_precision),
    }
    (out / "simulation.json").write_text(json.dumps(result, indent=2, default=float), encoding="utf-8")
    plot(result, out / "simulation.png")
    return result


def replay(
    task: Task,
    items: list[LabelledItem],
    y: np.ndarray,
    scored: dict[Variant, VariantScores],
    parts: Split,
    config: SimulationConfig,
    seed: int,
) -> list[dict]:
    """One replay: the start labels, then the stream through the review queue, a refit every
    `refit_every` new labels; one point per refit."""
    path = Path(config.out_dir) / f"labels-seed{seed}.sqlite"
    for stale in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        stale.unlink(missing_ok=True)
    store = SqliteLabelStore(path)
    rng = random.Random(seed)
    index = {item.id: i for i, item in enumerate(items)}
    try:
        store.record([_item(task, items[i], None, "file", True, 1.0, START_FRAME, "start", None) for i in parts.start])
        store.add_labels([Label(items[i].id, "0", task.options[y[i]], "simulation") for i in parts.start])
        points, stream = [], list(parts.stream)
        version = 0
        while True:
            version += 1
            labelled = store.labelled()
            idx = np.array([index[r.item.id] for r in labelled])
            draws = [_draw(r) for r in labelled]
            served, point = refit(scored, idx, draws, y, parts.test, config)
            point.update(audit(store, f"v{version - 1}", config) if version > 1 else {})
            points.append({"version": version, **point})
            if not stream:
                return points
            given = 0
            while stream and given < config.refit_every:
                i = int(stream.pop(0))
                given += _serve(store, task, items[i], y[i], served(i), config, rng, f"v{version}")
    finally:
        store.close()


def refit(
    scored: dict[Variant, VariantScores],
    idx: np.ndarray,
    draws: list,
    y: np.ndarray,
    test: np.ndarray,
    config: SimulationConfig,
) -> tuple:
    """A profile refitted on the labelled items (`calibration.run`'s choose, fit and certify steps),
    and its point: the labels, the certified share and the true precision on the test part. Returns
    also how it answers an item (its probabilities and the action its threshold gives)."""
    order = np.argsort(idx)
    idx, draws = idx[order], [draws[i] for i in order]
    held = np.setdiff1d(idx, demonstration_items(scored))
    keep = np.isin(idx, held)
    idx, draws = idx[keep], [d for d, k in zip(draws, keep) if k]
    held = hold_out(draws, config.run.certify_share, config.run.seed)
    choice = choose_method(scored, idx[~held], y, config.run)
    data = scored[choice.variant]
    fit = fit_method(data, choice.candidate, idx[~held], y, config.run, with_out_of_fold=not held.any())
    position = {int(i): n for n, i in enumerate(idx)}
    fit_draws = [draws[position[int(i)]] for i in fit.fit_on]
    held_draws = [d for d, h in zip(draws, held) if h]
    certified = certify(evidence(data, fit, y, idx[held], held_draws, fit_draws), config.run)
    threshold = certified.threshold.threshold if certified.threshold else None
    P_test = apply_variant(fit.calibrator, data, test)
    conf_test = confidence(P_test)
    auto = conf_test >= threshold if threshold is not None else np.zeros(len(test), bool)
    correct = P_test.argmax(1) == y[test]
    counts = held_out_counts(draws, held)
    point = {
        "labels": int(len(idx)),
        "certify": counts["certify"],
        "train_only": counts["train_only"],
        "method": choice.chosen["label"],
        "threshold": threshold,
        "auto_share": float(auto.mean()),
        "true_precision": float(correct[auto].mean()) if auto.any() else None,
        "test_accuracy": float(correct.mean()),
        "certified_lower_bound": certified.threshold.lower_bound if certified.threshold else None,
    }

    return Refitted(fit.calibrator, data, threshold, OrderingModel(choice.candidate, data, y)), point


@dataclass
class Refitted:
    """A refit as served: an item's probabilities and the action its threshold gives; and the model
    a labelling round reads (`orders.OrderingModel`)."""

    calibrator: object
    data: VariantScores
    threshold: float | None
    model: OrderingModel

    def __call__(self, i: int) -> tuple[np.ndarray, str]:
        P = apply_variant(self.calibrator, self.data, np.array([i]))[0]
        conf = float(confidence(P[None])[0])
        return P, "auto" if self.threshold is not None and conf >= self.threshold else "escalate"


def audit(store: SqliteLabelStore, version: str, config: SimulationConfig) -> dict:
    """The audited precision of the automatic decisions a version served, with its bound."""
    records = store.labelled(origin="audited", version=version)
    if not records:
        return {"audited": 0, "audited_precision": None, "audited_lower_bound": None}
    correct = np.array([r.correct for r in records])
    precision, bound, _ = weighted_lower_bound(
        correct, np.array([1.0 / r.item.chance for r in records]), config.run.confidence_level
    )
    return {"audited": len(records), "audited_precision": precision, "audited_lower_bound": bound}


def fit_baseline(
    task: Task, y: np.ndarray, scored: dict[Variant, VariantScores], parts: Split, config: SimulationConfig
) -> dict | None:
    """A profile fitted and certified on `baseline_labels` random labels (from the start and stream
    items), measured on the same test part: what labelling at random that many items gives."""
    pool = np.concatenate([parts.start, parts.stream])
    if not config.baseline_labels or config.baseline_labels > len(pool):
        return None
    idx = np.sort(np.random.default_rng(config.run.seed).permutation(pool)[: config.baseline_labels])
    from llamadecide.calibration.certification import Draw

    _, point = refit(scored, idx, [(Draw(1.0, "baseline"),)] * len(idx), y, parts.test, config)
    return point


def honesty(replays: list[dict], target: float) -> dict:
    """How often the true precision of automatic decisions on the test part fell below the target,
    over every refit of every replay that certified a threshold."""
    certified = [
        p for r in replays for p in r["points"] if p["threshold"] is not None and p["true_precision"] is not None
    ]
    below = [p for p in certified if p["true_precision"] < target]
    return {
        "certified_refits": len(certified),
        "below_target": len(below),
        "share_below": len(below) / max(len(certified), 1),
    }


def _draw(record) -> tuple:
    from llamadecide.calibration.certification import Draw

    return tuple(Draw(chance, frame) for frame, chance in record.draws) or (Draw(None, record.item.frame),)


def _serve(store, task: Task, item: LabelledItem, gold: int, answer, config, rng, version: str) -> int:
    """One streamed item as the server serves it: recorded, drawn into the queue by its action, and,
    when queued, labelled by the person (the file's label). Returns the labels given (0 or 1)."""
    P, action = answer
    origin, queued, chance = draw_for_review(action, config.audit_rate, rng)
    store.record([_item(task, item, P, origin, queued, chance, served_frame(task.name, version), version, action)])
    if not queued:
        return 0
    store.add_labels([Label(item.id, "0", task.options[gold], "simulation")])
    return 1


def _item(task, item, P, origin, queued, chance, frame, version, action) -> ReviewItem:
    k = len(task.options)
    probabilities = tuple(float(p) for p in (P if P is not None else np.full(k, 1.0 / k)))
    return ReviewItem(
        id=item.id,
        question="0",
        kind=task.type,
        instructions=task.instructions,
        options=tuple(task.options),
        probabilities=probabilities,
        confidence=float(confidence(np.array([probabilities]))[0]),
        input_sha256=state_sha256(item.text),
        origin=origin,
        created=time.time(),
        queued=queued,
        chance=chance,
        frame=frame,
        input=item.text if queued else None,
        task=task.name,
        version=version,
        action=action,
    )


def plot(result: dict, path: Path) -> None:
    """Certified automatic share against labels (every replay), the baseline's share, and the true
    precision of the automatic decisions against the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (share, precision) = plt.subplots(1, 2, figsize=(11, 4))
    named = len(result["replays"]) <= 6  # past that, a legend of seeds hides the curves
    for replay in result["replays"]:
        labels = [p["labels"] for p in replay["points"]]
        share.plot(
            labels,
            [p["auto_share"] for p in replay["points"]],
            marker="o",
            alpha=0.7,
            label=f"seed {replay['seed']}" if named else None,
        )
        precision.plot(
            labels,
            [p["true_precision"] if p["true_precision"] is not None else np.nan for p in replay["points"]],
            marker="o",
            alpha=0.7,
        )
    if result["baseline"]:
        share.axhline(
            result["baseline"]["auto_share"], color="k", ls="--", label=f"{result['baseline']['labels']} random labels"
        )
    precision.axhline(result["target_precision"], color="r", ls="--", label="target")
    share.set(xlabel="labels (start + reviews)", ylabel="certified automatic share (test part)", ylim=(0, 1))
    if not named:
        share.set_title(f"{len(result['replays'])} seeds, one line each", fontsize=9)
    precision.set(xlabel="labels (start + reviews)", ylabel="true precision of automatic decisions", ylim=(0.5, 1.0))
    if named or result["baseline"]:  # else no line of the share plot has a label
        share.legend(fontsize=7)
    precision.legend(fontsize=7)
    fig.suptitle(
        f"{result['task']}: reviews as labels (audit {result['audit_rate']:.0%}, refit every {result['refit_every']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
