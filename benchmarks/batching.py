"""Many inputs per decode call: what sharing calls saves, and that it changes no answer.

    python -m benchmarks.batching [--model M] [--items 200] [--dataset agnews] [--json FILE]

For each prompt format and for a head's hidden state, the same items are decided one by one
(`Decider.decide`, `Measurer.hidden`) and in shared calls (`Decider.decide_many`,
`Measurer.hidden_many`, BATCH items at a time), on one engine. Printed per row: seconds per item each
way and their ratio, llama_decode calls, and the largest difference between an item's
probabilities (or hidden state) alone and batched, which the engine's deterministic call shapes
keep at 0.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.datasets import DATASETS
from benchmarks.engines import engine_for
from llamadecide.calibration.data import load_task, read_labelled
from llamadecide.decisions import Decider, DecisionInput, Scoring
from llamadecide.decisions.measuring import Measurer
from llamadecide.engine import Engine, resolve_model_path

BATCH = 16


def _timed(engine: Engine, work):
    before = dict(engine.counters)
    began = time.perf_counter()
    result = work()
    return result, time.perf_counter() - began, engine.counters["decode_calls"] - before["decode_calls"]


def measure(engine: Engine, texts: list[str], question, prompt_format: str) -> list[dict]:
    decider = Decider(engine)
    rule = Scoring(prompt_format=prompt_format)
    decider.decide(texts[0], [question], scoring=rule)  # pins the question prefix
    alone, alone_s, alone_calls = _timed(engine, lambda: [decider.decide(t, [question], scoring=rule) for t in texts])
    shared, shared_s, shared_calls = _timed(
        engine,
        lambda: [
            d
            for start in range(0, len(texts), BATCH)
            for d in decider.decide_many([DecisionInput(t, [question], rule) for t in texts[start : start + BATCH]])
        ],
    )
    gap = max(
        float(np.abs(np.array(a.answers[0].probabilities) - np.array(b.answers[0].probabilities)).max())
        for a, b in zip(alone, shared)
    )
    rows = [
        {
            "work": f"decision, {prompt_format}",
            "items": len(texts),
            "alone_s_per_item": alone_s / len(texts),
            "batched_s_per_item": shared_s / len(texts),
            "speedup": alone_s / shared_s,
            "alone_calls": alone_calls,
            "batched_calls": shared_calls,
            "max_difference": gap,
        }
    ]
    if prompt_format != "llamadecide-1":
        measurer = Measurer(engine)
        states, alone_s, alone_calls = _timed(
            engine, lambda: [measurer.hidden(t, question, Scoring(prompt_format=prompt_format)) for t in texts]
        )
        shared, shared_s, shared_calls = _timed(
            engine,
            lambda: [
                h
                for start in range(0, len(texts), BATCH)
                for h in measurer.hidden_many(
                    texts[start : start + BATCH], question, Scoring(prompt_format=prompt_format)
                )
            ],
        )
        gap = max(float(np.abs(a - b).max()) for a, b in zip(states, shared))
        rows.append(
            {
                "work": f"hidden state (a head's input), {prompt_format}",
                "items": len(texts),
                "alone_s_per_item": alone_s / len(texts),
                "batched_s_per_item": shared_s / len(texts),
                "speedup": alone_s / shared_s,
                "alone_calls": alone_calls,
                "batched_calls": shared_calls,
                "max_difference": gap,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--dataset", default="agnews", choices=list(DATASETS))
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--prompt-formats", "--layouts", nargs="+", default=["llamadecide-1", "llamadecide-3"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--n-gpu-layers", type=int, default=0)
    parser.add_argument("--json", default=None, help="write {'rows': [...]} here")
    args = parser.parse_args(argv)
    dataset = DATASETS[args.dataset]
    task = load_task(dataset.task)
    items = read_labelled(dataset.path, text_column=dataset.text_column, label_column=dataset.label_column)
    texts = [item.text for item in items[: args.items]]
    path = resolve_model_path(args.model)
    engine = engine_for(path, n_ctx=8192, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers)
    rows = []
    try:
        for prompt_format in args.prompt_formats:
            for row in measure(engine, texts, task.question(), prompt_format):
                rows.append({"model": path.name, "dataset": args.dataset, **row})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        engine.close()
    table = Table(
        title=f"{path.name} · {args.dataset} · {engine.n_threads} threads · {platform.machine()} · "
        f"{BATCH} items per batch"
    )
    for column in (
        "work",
        "items",
        "alone s/item",
        "batched s/item",
        "speed-up",
        "calls alone",
        "calls batched",
        "max |alone - batched|",
    ):
        table.add_column(column, justify="left" if column == "work" else "right")
    for r in rows:
        table.add_row(
            r["work"],
            str(r["items"]),
            f"{r['alone_s_per_item']:.3f}",
            f"{r['batched_s_per_item']:.3f}",
            f"{r['speedup']:.2f}x",
            str(r["alone_calls"]),
            str(r["batched_calls"]),
            f"{r['max_difference']:.2g}",
        )
    Console(width=160).print(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"rows": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
