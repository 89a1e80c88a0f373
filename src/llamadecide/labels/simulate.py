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

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamadecide.calibration.backends import Backend
from llamadecide.calibration.certification import Draw
from llamadecide.calibration.config import RunConfig, option
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.thresholds import weighted_lower_bound
from llamadecide.calibration.variants import Variant, VariantScores
from llamadecide.decisions.maths import confidence
from llamadecide.labels.active import DrawRule
from llamadecide.labels.orders import compare_orders, plot_orders
from llamadecide.labels.queue import draw_for_review, served_frame
from llamadecide.labels.records import Label, ReviewItem, state_sha256
from llamadecide.labels.refit import record_draws
from llamadecide.labels.replay import Split, honesty, refit, score_pool, split, universe
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
    rule: DrawRule = DrawRule()  # with --order: a round's size; with --order active, how it draws


def score_universe(
    backend: Backend, task: Task, items: list[LabelledItem], used: np.ndarray, config: SimulationConfig
) -> dict[Variant, VariantScores]:
    """Every used item scored once (cached in the output folder)."""
    return score_pool(backend, task, items, used, config.run, Path(config.out_dir) / "cache.sqlite")


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
    `refit_every` new labels; one point per refit. A refit that certifies nothing where the version
    serving did is not served (as `calibrate` writes it: `run.profile_file`): the point says which
    version serves after it (`serving`) and that version's share and precision on the test part."""
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
        version, serving = 0, None  # serving: (version, its refit, its point)
        while True:
            version += 1
            labelled = store.labelled()
            idx = np.array([index[r.item.id] for r in labelled])
            draws = [record_draws(r) for r in labelled]
            refitted, point = refit(scored, idx, draws, y, parts.test, config.run)
            point.update(audit(store, f"v{serving[0]}", config) if serving else {})
            if serving is None or refitted.threshold is not None or serving[1].threshold is None:
                serving = (version, refitted, point)
            points.append(
                {
                    "version": version,
                    **point,
                    "serving": serving[0],
                    "served_auto_share": serving[2]["auto_share"],
                    "served_true_precision": serving[2]["true_precision"],
                }
            )
            if not stream:
                return points
            given = 0
            while stream and given < config.refit_every:
                i = int(stream.pop(0))
                given += _serve(store, task, items[i], y[i], serving[1](i), config, rng, f"v{serving[0]}")
            if not given:  # the stream ended with no new label: nothing to refit on
                return points
    finally:
        store.close()


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
    _, point = refit(scored, idx, [(Draw(1.0, "baseline"),)] * len(idx), y, parts.test, config.run)
    return point


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
    """Certified automatic share served against labels (every replay), the baseline's share, and the true
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
            [p.get("served_auto_share", p["auto_share"]) for p in replay["points"]],
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
    share.set(xlabel="labels (start + reviews)", ylabel="certified automatic share served (test part)", ylim=(0, 1))
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
