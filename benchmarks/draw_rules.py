"""Which draw teaches and certifies fastest: labelling orders replayed with one fixed head (no method
choice, so a replay takes seconds): test accuracy and the certified automatic share against labels,
and counters per round that say what limits a draw: the share of its chances the floor and the sure
share gave the items it took, the drawing model's accuracy on them, and how many options still have
fewer than three labels.

    python -m benchmarks.draw_rules [--dataset banking77] [--rule random] [--rule floor=0.2] \\
        [--rule floor=0.2,sure=0.5] [--seeds 5] [--out DIR]

A rule is `random` or the fields of `labels.active.DrawRule` (floor, sure, rarity; the round size is
`--round-size`); every replay draws with the product's own `gain`, `automatic`, `inclusion` and
`draw`. The pool is the file's items but the test part (a seeded split a seed), scored once with
calibrate's scoring (cached in DIR); the head is `head (hidden state, C=0.05)` on the prompt format's
hidden states, refitted on every label before every round. Every label records its draws as the
label store does (the start labels and random rounds one frame of equal chances each, an active
round a frame of its chances), and at every point the threshold is certified as `calibrate` does it
(`holdout.hold_out`: a share held out, by default; `--cross-fit K`: every label out of fold, the
served head the fold's), with the head in place of the chosen method; the automatic share and true
precision are read on the test part."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from benchmarks.datasets import DATASETS
from benchmarks.engines import engine_for
from llamadecide.calibration.backends import LocalBackend
from llamadecide.calibration.calibrators import CrossFitted
from llamadecide.calibration.certification import Draw, certification_weights
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import load_task, read_labelled
from llamadecide.calibration.fitting import Candidate
from llamadecide.calibration.holdout import cross_fitting, hold_out
from llamadecide.calibration.selection import apply_variant, fit_variant
from llamadecide.calibration.thresholds import select_threshold, weighted_lower_bound
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


def certified_point(pool: Pool, idx: np.ndarray, draws: list[tuple[Draw, ...]], run: RunConfig) -> dict:
    """The head refitted on the labels and certified as `calibrate` does it (held out or cross-fitted),
    measured on the test part: the served head's accuracy (held out: fitted on the rest), the
    certified threshold, the automatic share and its true precision."""
    data, y = pool.hidden_data, pool.y
    if cross_fitting(draws, run):
        routes = data.routes(idx, run.cross_fit)
        served = CrossFitted(
            tuple(fit_variant(HEAD, data, idx[routes != k], y[idx[routes != k]]) for k in range(run.cross_fit))
        )
        certifying, weights = idx, certification_weights(draws)
    else:
        split = hold_out(draws, run)
        served = fit_variant(HEAD, data, idx[~split.held], y[idx[~split.held]])
        certifying, weights = idx[split.held], certification_weights(split.draws(draws))
    P_test = apply_variant(served, data, pool.test)
    confident, correct = P_test.max(1), P_test.argmax(1) == y[pool.test]
    found, at_80 = None, None
    if len(certifying):
        P = apply_variant(served, data, certifying)
        conf, right = P.max(1), P.argmax(1) == y[certifying]
        found = select_threshold(
            conf, right, target=run.target_precision, confidence_level=run.confidence_level, weights=weights
        )
        # what limits certifying 80%: the certifying items above the test part's 80% threshold
        above = conf >= np.quantile(confident, 0.2)
        precision, bound, effective = weighted_lower_bound(right[above], weights[above], run.confidence_level)
        at_80 = {"items": int(above.sum()), "effective": effective, "precision": precision, "bound": bound}
    auto = confident >= found.threshold if found else np.zeros(len(pool.test), dtype=bool)
    return {
        "served_accuracy": float(correct.mean()),
        "threshold": found.threshold if found else None,
        "auto_share": float(auto.mean()),
        "true_precision": float(correct[auto].mean()) if auto.any() else None,
        "certifying": int((weights > 0).sum()),
        "certifying_effective": float(weights.sum() ** 2 / (weights**2).sum()) if weights.any() else 0.0,
        "at_80": at_80,
    }


def replay(pool: Pool, rule: DrawRule | None, run: RunConfig, size: int, max_labels: int, every: int, seed: int):
    """A point every `every` labels (`certified_point`), and each active round's counters."""
    data, y = pool.hidden_data, pool.y
    items = np.concatenate([pool.start, pool.rest])
    rng = np.random.default_rng(seed + 7919)
    labelled, queue = list(pool.start), list(pool.rest)
    start_chance = len(pool.start) / len(items)
    draws: dict[int, list[Draw]] = {int(i): [Draw(start_chance, "start")] for i in pool.start}
    points, counters, next_point = [], [], len(labelled)
    k = data.L.shape[1]
    round_ = 0
    run_at = dataclasses.replace(run, seed=seed)  # the hold-out drawn by the replay's seed
    while True:
        idx = np.array(labelled)
        at_point = len(idx) >= next_point or len(idx) >= max_labels
        head = fit_variant(HEAD, data, idx, y[idx]) if at_point or rule is not None else None
        if at_point:
            accuracy = float((apply_variant(head, data, pool.test).argmax(1) == y[pool.test]).mean())
            certified = certified_point(pool, idx, [tuple(draws[int(i)]) for i in idx], run_at)
            points.append({"labels": len(idx), "test_accuracy": accuracy, **certified})
            next_point += every
        if len(idx) >= max_labels:
            return points, counters
        round_ += 1
        if rule is None:  # a file taken whole, round after round: one frame of equal chances (untilted)
            for i in queue[:size]:
                draws[int(i)] = [Draw(1.0, "random")]
            labelled += queue[:size]
            queue = queue[size:]
            continue
        P = apply_variant(head, data, items)
        counts = np.bincount(y[idx], minlength=k)
        held = np.isin(items, idx)
        gains, sure = gain(P, counts, rule), automatic(P, run.target_precision)
        chances = inclusion(gains, held, rule, sure)
        taken_all = draw(chances, rng)
        fresh = [n for n in taken_all if not held[n]]
        for n in taken_all:  # an item drawn again counts in this round's frame too
            draws.setdefault(int(items[n]), []).append(Draw(float(chances[n]), f"round{round_}", float(P[n].max())))
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


def first_reaching(points: list[dict], key: str, value: float) -> int | None:
    return next((p["labels"] for p in points if p[key] is not None and p[key] >= value - 1e-12), None)


def median_labels(reached: list[int | None]) -> int | None:
    """The median, counting a replay that never got there as past every other."""
    return sorted(reached, key=lambda v: float("inf") if v is None else v)[(len(reached) - 1) // 2]


def summary(runs: dict[str, list[dict]], at: tuple[int, ...], shares: tuple[float, ...], target: float) -> dict:
    """Per rule: median test accuracy at each of `at` labels (interpolated), labels to random's median
    accuracy at its most labels, labels to each certified automatic share of `shares` (median and by
    seed), the certified points whose true precision fell below `target`, and the counters' medians
    over the rounds before 300 labels and after."""

    def accuracy_at(points, n):
        return float(np.interp(n, [p["labels"] for p in points], [p["test_accuracy"] for p in points]))

    accuracy = None
    if "random" in runs:
        accuracy = float(np.median([r["points"][-1]["test_accuracy"] for r in runs["random"]]))
    found = {}
    for name, replays in runs.items():
        reached = [first_reaching(r["points"], "test_accuracy", accuracy) for r in replays] if accuracy else []
        certified = [p for r in replays for p in r["points"] if p["true_precision"] is not None]
        to_certified = {
            f"{share:.0%}": [first_reaching(r["points"], "auto_share", share) for r in replays] for share in shares
        }
        rounds = [c for r in replays for c in r["counters"]]

        def median(key, early, rounds=rounds):
            values = [c[key] for c in rounds if c[key] is not None and ((c["labels"] < 300) == early)]
            return float(np.median(values)) if values else None

        found[name] = {
            **{f"accuracy_at_{n}": float(np.median([accuracy_at(r["points"], n) for r in replays])) for n in at},
            "labels_to_random_accuracy": median_labels(reached) if reached else None,
            "per_seed_labels_to_random_accuracy": reached,
            **{f"labels_to_{share}_certified": median_labels(seeds) for share, seeds in to_certified.items()},
            "per_seed_labels_to_certified": to_certified,
            "certified_points": len(certified),
            "certified_below_target": sum(p["true_precision"] < target for p in certified),
            **{
                f"{key}_{'early' if early else 'late'}": median(key, early)
                for key in ("floor_share", "sure_share", "drawing_accuracy", "options_under_3")
                for early in (True, False)
            },
        }
    return {"random_accuracy_at_most_labels": accuracy, "rules": found}


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
    parser.add_argument("--cross-fit", type=int, default=0, help="certify out of fold on K folds (0: held out)")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.5, 0.8], help="certified shares to report")
    parser.add_argument("--prompt-format", default="llamadecide-3")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--sample", type=int, default=None, help="replay a seeded sample of the file's items")
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=Path("runs/draw-rules"))
    args = parser.parse_args(argv)
    rules = args.rule or ["random", "floor=0.2"]
    dataset = DATASETS[args.dataset]
    task = load_task(dataset.task)
    items = read_labelled(dataset.path, text_column=dataset.text_column, label_column=dataset.label_column)
    if args.sample:  # a seeded sample of the file, in the file's order
        items = [items[i] for i in np.sort(np.random.default_rng(0).permutation(len(items))[: args.sample])]
    y = np.array([task.gold_index(item.label) for item in items])
    args.out.mkdir(parents=True, exist_ok=True)
    config = RunConfig(
        out_dir=args.out,
        prompt_formats=(args.prompt_format,),
        target_precision=args.target_precision,
        cross_fit=args.cross_fit,
    )
    engine = engine_for(args.model, n_ctx=8192)
    try:
        scored = score_pool(LocalBackend(engine), task, items, np.arange(len(items)), config, args.out / "cache.sqlite")
    finally:
        engine.close()
    data = next(d for d in scored.values() if d.hidden is not None)
    runs: dict[str, list[dict]] = {}
    for text in rules:
        rule = parse_rule(text, args.round_size)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            pool = pool_for(data, y, args.start_labels, args.test, seed)
            points, counters = replay(pool, rule, config, args.round_size, args.max_labels, args.measure_every, seed)
            runs.setdefault(text, []).append({"seed": seed, "points": points, "counters": counters})
            shown = " ".join(f"{p['labels']}:{p['test_accuracy']:.3f}/{p['auto_share']:.2f}" for p in points)
            print(text, "seed", seed, "labels:accuracy/certified share", shown, flush=True)
    result = {
        "dataset": args.dataset,
        "head": HEAD.label,
        "round_size": args.round_size,
        "start_labels": args.start_labels,
        "test": args.test,
        "target_precision": args.target_precision,
        "cross_fit": args.cross_fit,
        "summary": summary(runs, (300, 600, 1000), tuple(args.shares), args.target_precision),
        "runs": runs,
    }
    (args.out / "draw-rules.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
