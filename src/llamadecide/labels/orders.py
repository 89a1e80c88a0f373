"""Labelling orders compared on a labelled file (`llamadecide simulate --order active|random`): a team
that starts with no labels labels a pool round after round, the file's labels as the person, and
every so many labels a profile is refitted and certified as `calibrate` does it and measured on a
test part never labelled. Active rounds draw by the current model's uncertainty, with a uniform
floor and a share for the items it expects to handle automatically (`labels.active`), each label
recording its chance; random rounds take the pool in a seeded order. Both go through the label
store and the certification the server's reviews go through."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.variants import Variant, VariantScores
from llamadecide.decisions.maths import confidence
from llamadecide.labels.active import automatic, draw, gain, inclusion
from llamadecide.labels.records import Label, ReviewItem, state_sha256
from llamadecide.labels.refit import record_draws
from llamadecide.labels.replay import honesty, refit, split
from llamadecide.labels.sqlite_store import SqliteLabelStore

SHARES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # certified automatic shares reported


def label_in_order(
    task: Task,
    items: list[LabelledItem],
    y: np.ndarray,
    scored: dict[Variant, VariantScores],
    parts,
    config,
    seed: int,
    order: str,
) -> list[dict]:
    """One labelling run: the start labels at random, then rounds in `order` until `max_labels`; a
    point (the simulation's `refit`) every `measure_every` labels."""
    pool = np.concatenate([parts.start, parts.stream])
    store = _fresh_store(Path(config.out_dir) / f"labels-{order}-seed{seed}.sqlite")
    rng = np.random.default_rng(seed + 7919)
    queue = [int(i) for i in np.random.default_rng(seed).permutation(np.setdiff1d(pool, parts.start))]
    rule, target = config.rule, config.run.target_precision
    index = {item.id: i for i, item in enumerate(items)}
    row = {int(i): n for n, i in enumerate(pool)}  # an item's row in the pool's probabilities
    try:
        _label(store, task, items, y, parts.start, [len(parts.start) / len(pool)] * len(parts.start), "start")
        points, model, round_ = [], None, 0
        next_point = len(parts.start)
        while True:
            labelled = store.labelled()
            idx = np.array([index[r.item.id] for r in labelled])
            draws = [record_draws(r) for r in labelled]
            if len(idx) >= next_point or len(idx) >= config.max_labels or not queue:
                served, point = refit(scored, idx, draws, y, parts.test, config.run)
                points.append({"order": order, "seed": seed, **point})
                model = served.model
                next_point += config.measure_every
            if len(idx) >= config.max_labels or not queue:
                return points
            round_ += 1
            quick = model.refitted(idx) if model is not None else None  # the current model, on every label
            P = quick.probabilities(pool) if quick is not None else None
            if order == "random":  # what the model makes of them is recorded, as a labelling session does
                taken, queue = queue[: rule.size], queue[rule.size :]
                drawn_with = P[[row[i] for i in taken]] if P is not None else None
                _label(store, task, items, y, np.array(taken), [1.0] * len(taken), "random", drawn_with)
                continue
            counts = np.bincount(y[idx], minlength=len(task.options))
            held = np.isin(pool, idx)
            gains, sure = (gain(P, counts, rule), automatic(P, target)) if P is not None else (np.zeros(0), None)
            chances = inclusion(gains, held, rule, sure)
            picked = pool[draw(chances, rng)]
            chance_of = dict(zip(pool.tolist(), chances.tolist()))
            known = set(idx.tolist())
            fresh = [int(i) for i in picked if i not in known]
            again = [int(i) for i in picked if i in known]
            frame = f"round{round_}"
            drawn_with = P[[row[i] for i in fresh]] if P is not None else None
            _label(store, task, items, y, np.array(fresh, dtype=int), [chance_of[i] for i in fresh], frame, drawn_with)
            store.add_draws([(items[i].id, "0", frame, chance_of[i]) for i in again])
            taken = set(fresh)
            queue = [i for i in queue if i not in taken]
    finally:
        store.close()


def _fresh_store(path: Path) -> SqliteLabelStore:
    for stale in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        stale.unlink(missing_ok=True)
    return SqliteLabelStore(path)


def _label(
    store, task: Task, items, y, indices: np.ndarray, chances: list[float], frame: str, P: np.ndarray | None = None
) -> None:
    """Items drawn with these chances, queued and labelled by the person (the file's labels); `P`: the
    drawing model's probabilities for them (none: uniform, a draw that read no model)."""
    k = len(task.options)
    P = np.full((len(indices), k), 1.0 / k) if P is None else P
    records = [
        ReviewItem(
            id=items[i].id,
            question="0",
            kind=task.type,
            instructions=task.instructions,
            options=tuple(task.options),
            probabilities=tuple(float(p) for p in probabilities),
            confidence=float(confidence(probabilities)),
            input_sha256=state_sha256(items[i].text),
            origin="drawn",
            created=time.time(),
            queued=True,
            chance=float(chance),
            frame=frame,
            input=items[i].text,
            task=task.name,
        )
        for i, chance, probabilities in zip(indices, chances, P)
    ]
    store.record(records)
    store.add_labels([Label(items[i].id, "0", task.options[y[i]], "simulation") for i in indices])


def labels_needed(points: list[dict], shares=SHARES) -> dict[str, int | None]:
    """For each certified automatic share, the fewest labels at which a point reached it."""
    return {
        f"{share:.1f}": min((p["labels"] for p in points if p["auto_share"] >= share - 1e-12), default=None)
        for share in shares
    }


def accuracy_labels(points: list[dict], accuracy: float) -> int | None:
    """The fewest labels at which a point's test accuracy reached `accuracy`."""
    return min((p["labels"] for p in points if p["test_accuracy"] >= accuracy - 1e-12), default=None)


def compare_orders(task, items, y, scored, used, config) -> dict:
    """Each order's labelling runs (one a seed), and the labels each needed for every certified share
    and for the accuracy random ordering reached at its most labels."""
    orders: dict[str, dict] = {}
    for order in config.orders:
        replays = [
            {
                "seed": seed,
                "points": label_in_order(task, items, y, scored, split(used, config, seed), config, seed, order),
            }
            for seed in range(config.run.seed, config.run.seed + config.seeds)
        ]
        needed = {r["seed"]: labels_needed(r["points"]) for r in replays}
        orders[order] = {"replays": replays, "labels_needed": needed, "median_labels_needed": _medians(needed)}
    result = {
        "task": task.name,
        "target_precision": config.run.target_precision,
        "confidence_level": config.run.confidence_level,
        "start_labels": config.start_labels,
        "test_size": config.test_size,
        "round_size": config.rule.size,
        "floor": config.rule.floor,
        "sure_share": config.rule.sure,
        "max_labels": config.max_labels,
        "orders": orders,
        "honesty": honesty([r for o in orders.values() for r in o["replays"]], config.run.target_precision),
    }
    if "random" in orders:
        final = [r["points"][-1] for r in orders["random"]["replays"]]
        target = float(np.median([p["test_accuracy"] for p in final]))
        result["random_accuracy_at_most_labels"] = {"labels": final[0]["labels"], "test_accuracy": target}
        result["labels_for_that_accuracy"] = {
            order: _median([accuracy_labels(r["points"], target) for r in o["replays"]]) for order, o in orders.items()
        }
    return result


def _medians(needed: dict) -> dict:
    shares = next(iter(needed.values())).keys() if needed else ()
    return {share: _median([per_seed[share] for per_seed in needed.values()]) for share in shares}


def _median(values: list) -> float | None:
    """The median, counting a run that never got there as past every other (None if most never did)."""
    ordered = sorted(values, key=lambda v: float("inf") if v is None else v)
    middle = ordered[(len(ordered) - 1) // 2] if ordered else None
    return None if middle is None else float(middle)


def plot_orders(result: dict, path: Path) -> None:
    """Certified automatic share and test accuracy against labels, per order and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (share, accuracy) = plt.subplots(1, 2, figsize=(11, 4))
    for (order, found), color in zip(result["orders"].items(), ("#2f5bea", "#d9534f", "#1a8f4c")):
        for n, replay in enumerate(found["replays"]):
            labels = [p["labels"] for p in replay["points"]]
            label = order if n == 0 else None
            share.plot(labels, [p["auto_share"] for p in replay["points"]], color=color, alpha=0.6, label=label)
            accuracy.plot(labels, [p["test_accuracy"] for p in replay["points"]], color=color, alpha=0.6, label=label)
    share.set(xlabel="labels", ylabel=f"certified automatic share at {result['target_precision']}", ylim=(0, 1))
    accuracy.set(xlabel="labels", ylabel="test accuracy")
    share.legend(fontsize=8)
    accuracy.legend(fontsize=8)
    fig.suptitle(
        f"{result['task']}: labelling orders (round of {result['round_size']}, floor {result['floor']:.0%}, "
        f"sure share {result['sure_share']:.0%})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
