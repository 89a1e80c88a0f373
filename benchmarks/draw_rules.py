"""Which draw teaches fastest: labelling orders replayed with one fixed head (no method choice, no
certification, so a replay takes seconds), test accuracy against labels, and counters per round
that say what limits a draw: the share of its chances the floor and the sure share gave the items it
took, the drawing model's accuracy on them, and how many options still have fewer than three labels.

    python -m benchmarks.draw_rules [--dataset banking77] [--rule random] [--rule floor=0.2] \\
        [--rule floor=0.2,sure=0.5] [--seeds 5] [--out DIR]

A rule is `random` or the fields of `labels.active.DrawRule` (floor, sure, rarity; the round size is
`--round-size`); every replay draws with the product's own `gain`, `automatic`, `inclusion` and
`draw`. The pool is the file's items but the test part (a seeded split a seed), scored once with
calibrate's scoring (cached in DIR); the head is `head (hidden state, C=0.05)` on the prompt format's
hidden states, refitted on every label before every round."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from benchmarks.datasets import DATASETS
from benchmarks.engines import engine_for
from llamadecide.calibration.backends import LocalBackend
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import load_task, read_labelled
from llamadecide.calibration.fitting import Candidate
from llamadecide.calibration.selection import apply_variant, fit_variant
from llamadecide.decisions.maths import HIDDEN_ONLY
from llamadecide.labels.active import DrawRule, automatic, draw, gain, inclusion, parts
from llamadecide.labels.replay import score_pool

HEAD = Candidate("head", False, C=0.05, features=HIDDEN_ONLY)


@dataclasses.dataclass(frozen=True)
class Pool:
    hidden_data: object  # the VariantScores a head reads
    y: np.ndarray
    test: np.ndarray
    start: np.ndarray
    rest: np.ndarray  # the pool beyond the start labels, in the random order's sequence


def parse_rule(text: str, size: int) -> DrawRule | None:
    """`random` (None) or `field=value,...` of a DrawRule."""
    if text == "random":
        return None
    fields = dict(part.split("=") for part in text.split(",") if part)
    return DrawRule(size=size, **{k: float(v) for k, v in fields.items()})


def pool_for(data, y: np.ndarray, start: int, test: int, seed: int) -> Pool:
    order = np.random.default_rng(seed).permutation(len(y))
    return Pool(data, y, np.sort(order[:test]), np.sort(order[test : test + start]), order[test + start :])


def replay(pool: Pool, rule: DrawRule | None, target: float, size: int, max_labels: int, every: int, seed: int):
    """Test accuracy every `every` labels, and each active round's counters."""
    data, y = pool.hidden_data, pool.y
    items = np.concatenate([pool.start, pool.rest])
    rng = np.random.default_rng(seed + 7919)
    labelled, queue = list(pool.start), list(pool.rest)
    points, counters, next_point = [], [], len(labelled)
    k = data.L.shape[1]
    while True:
        idx = np.array(labelled)
        head = fit_variant(HEAD, data, idx, y[idx])
        if len(idx) >= next_point or len(idx) >= max_labels:
            accuracy = float((apply_variant(head, data, pool.test).argmax(1) == y[pool.test]).mean())
            points.append({"labels": len(idx), "test_accuracy": accuracy})
            next_point += every
        if len(idx) >= max_labels:
            return points, counters
        if rule is None:
            labelled += queue[:size]
            queue = queue[size:]
            continue
        P = apply_variant(head, data, items)
        counts = np.bincount(y[idx], minlength=k)
        held = np.isin(items, idx)
        gains, sure = gain(P, counts, rule), automatic(P, target)
        chances = inclusion(gains, held, rule, sure)
        fresh = [n for n in draw(chances, rng) if not held[n]]
        # Each taken item's chance, split into the shares of the rule that gave it.
        by_gain, floor, from_sure = parts(gains, len(items), rule, sure)
        base = by_gain + floor + from_sure
        counters.append(
            {
                "labels": len(idx),
                "taken": len(fresh),
                "floor_share": float(np.mean(floor[fresh] / base[fresh])) if fresh else None,
                "sure_share": float(np.mean(from_sure[fresh] / base[fresh])) if fresh else None,
                "expected_automatic": float(sure.mean()),
                "drawing_accuracy": float((P[fresh].argmax(1) == y[items[fresh]]).mean()) if fresh else None,
                "options_under_3": int((counts < 3).sum()),
            }
        )
        labelled += [int(items[n]) for n in fresh]
        taken = {int(items[n]) for n in fresh}
        queue = [i for i in queue if i not in taken]


def summary(runs: dict[str, list[dict]], at: tuple[int, ...]) -> dict:
    """Per rule: median test accuracy at each of `at` labels (interpolated), labels to random's median
    accuracy at its most labels, and the counters' medians over the rounds before 300 and after 600
    labels."""

    def accuracy_at(points, n):
        return float(np.interp(n, [p["labels"] for p in points], [p["test_accuracy"] for p in points]))

    target = None
    if "random" in runs:
        target = float(np.median([r["points"][-1]["test_accuracy"] for r in runs["random"]]))
    found = {}
    for name, replays in runs.items():
        reached = [next((p["labels"] for p in r["points"] if p["test_accuracy"] >= target), None) for r in replays]
        rounds = [c for r in replays for c in r["counters"]]

        def median(key, early, rounds=rounds):
            values = [c[key] for c in rounds if c[key] is not None and ((c["labels"] < 300) == early)]
            return float(np.median(values)) if values else None

        found[name] = {
            **{f"accuracy_at_{n}": float(np.median([accuracy_at(r["points"], n) for r in replays])) for n in at},
            "labels_to_random_accuracy": (
                None
                if target is None
                else sorted(reached, key=lambda v: float("inf") if v is None else v)[(len(reached) - 1) // 2]
            ),
            "per_seed_labels_to_random_accuracy": reached,
            **{
                f"{key}_{'early' if early else 'late'}": median(key, early)
                for key in ("floor_share", "sure_share", "drawing_accuracy", "options_under_3")
                for early in (True, False)
            },
        }
    return {"random_accuracy_at_most_labels": target, "rules": found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="banking77", choices=sorted(DATASETS))
    parser.add_argument("--rule", action="append", help="random, or DrawRule fields: floor=0.2,sure=0.5")
    parser.add_argument("--start-labels", type=int, default=154)
    parser.add_argument("--test", type=int, default=880)
    parser.add_argument("--max-labels", type=int, default=1000)
    parser.add_argument("--measure-every", type=int, default=100)
    parser.add_argument("--round-size", type=int, default=50)
    parser.add_argument("--target-precision", type=float, default=0.95)
    parser.add_argument("--prompt-format", default="llamadecide-3")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=Path("runs/draw-rules"))
    args = parser.parse_args(argv)
    rules = args.rule or ["random", "floor=0.2"]
    dataset = DATASETS[args.dataset]
    task = load_task(dataset.task)
    items = read_labelled(dataset.path, text_column=dataset.text_column, label_column=dataset.label_column)
    y = np.array([task.gold_index(item.label) for item in items])
    args.out.mkdir(parents=True, exist_ok=True)
    config = RunConfig(out_dir=args.out, prompt_formats=(args.prompt_format,), target_precision=args.target_precision)
    engine = engine_for(args.model, n_ctx=8192)
    try:
        scored = score_pool(LocalBackend(engine), task, items, np.arange(len(items)), config, args.out / "cache.sqlite")
    finally:
        engine.close()
    data = next(d for d in scored.values() if d.hidden is not None)
    runs: dict[str, list[dict]] = {}
    for text in rules:
        rule = parse_rule(text, args.round_size)
        for seed in range(args.seeds):
            pool = pool_for(data, y, args.start_labels, args.test, seed)
            points, counters = replay(
                pool, rule, args.target_precision, args.round_size, args.max_labels, args.measure_every, seed
            )
            runs.setdefault(text, []).append({"seed": seed, "points": points, "counters": counters})
            print(text, "seed", seed, " ".join(f"{p['labels']}:{p['test_accuracy']:.3f}" for p in points), flush=True)
    result = {
        "dataset": args.dataset,
        "head": HEAD.label,
        "round_size": args.round_size,
        "start_labels": args.start_labels,
        "test": args.test,
        "summary": summary(runs, (300, 600, 1000)),
        "runs": runs,
    }
    (args.out / "draw-rules.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
