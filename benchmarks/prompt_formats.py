"""What a decision costs per prompt format, and what it gets right (a script that prints figures).

    python -m benchmarks.prompt_formats --dataset {agnews,sst2,banking77} [...] --items N [--model M]
        [--shots-per-class 1 2] [--json FILE]

Per data set, the same N test items are decided in sequence, as a running server sees them (warm,
a different input each time), once per prompt format: the state-first format `llamadecide-1`, and each
question-first format (`llamadecide-2`, `llamadecide-3`) zero-shot and with k demonstrations (k per
class, balanced, from the data set's labelled part; the evaluated items are never shown). A prompt format's
first request evaluates (and pins) its question prefix: it is timed apart as `first_s` and not
counted in the per-request figures. Per prompt_format: evaluated rows (tokens) and llama_decode calls per
request, p50 / p95 latency, accuracy of the argmax, and the ratios to `llamadecide-1`.

--max-bound runs every prompt format once per bound (0, the server's default: exact; above 0, a large answer
trie is expanded best-first: the setting `max_probability_bound`), reporting the largest bound an answer
had. --head-labels N
also fits, for each question-first prompt format and for the head formats (`llamadecide-4`, the question
without its options; `llamadecide-5`, the input alone), a head on the hidden state alone (with the
lexical expert unless --no-lexical; C by cross-validation) on N items of the labelled part, and
decides the same test items with it: that head evaluates the prompt only. Its price (rows, p50)
stands beside its accuracy and NLL (the mean negative log-probability of the gold option).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.datasets import DATASETS
from benchmarks.engines import engine_for
from llamadecide.calibration.config import head_layer
from llamadecide.calibration.cross_validation import cross_validated
from llamadecide.calibration.data import load_task, read_labelled
from llamadecide.calibration.fitting import HEAD_C_GRID, Candidate, fit_head
from llamadecide.calibration.profile import HeadParams
from llamadecide.calibration.steps import split
from llamadecide.calibration.variants import choose_demonstrations
from llamadecide.decisions import Decider, Scoring
from llamadecide.decisions.maths import HIDDEN_ONLY
from llamadecide.decisions.measuring import Measurer
from llamadecide.decisions.prompt import HEAD_ONLY_FORMATS, INPUT_ONLY, PROMPT_FORMAT_VERSION, QUESTION_FIRST_FORMATS
from llamadecide.decisions.scoring import Demonstration, Head
from llamadecide.engine import Engine, resolve_model_path
from llamadecide.engine.model_files import BLOCK_DEPTH


def run_prompt_format(
    engine: Engine,
    decider: Decider,
    question,
    texts: list[str],
    gold: np.ndarray,
    rule: Scoring,
    method: str = "zero-shot",
) -> dict:
    engine.clear_cache()
    began = time.perf_counter()
    decider.decide(texts[-1], [question], scoring=rule)  # evaluates and pins the question prefix (not counted)
    first = time.perf_counter() - began
    seconds, rows, calls, correct, cached, bounds, losses = [], [], [], [], [], [], []
    for text, y in zip(texts[:-1], gold[:-1]):
        before = dict(engine.counters)
        began = time.perf_counter()
        decision = decider.decide(text, [question], scoring=rule)
        seconds.append(time.perf_counter() - began)
        rows.append(engine.counters["rows"] - before["rows"])
        calls.append(engine.counters["decode_calls"] - before["decode_calls"])
        cached.append(decision.extra["cached_tokens"])
        correct.append(int(np.argmax(decision.answers[0].probabilities)) == int(y))
        losses.append(-float(np.log(max(decision.answers[0].probabilities[int(y)], 1e-12))))
        bounds.append(decision.answers[0].probability_bound)
    return {
        "prompt_format": rule.prompt_format,
        "shots": len(rule.demonstrations),
        "method": method,
        "max_probability_bound": decider.max_bound,  # allowed
        "probability_bound": float(max(bounds)),  # the largest an answer had
        "items": len(seconds),
        "rows_per_request": float(np.mean(rows)),
        "decode_calls": float(np.mean(calls)),
        "cached_tokens": float(np.median(cached)),
        "p50_s": float(np.median(seconds)),
        "p95_s": float(np.percentile(seconds, 95)),
        "first_s": first,
        "accuracy": float(np.mean(correct)),
        "nll": float(np.mean(losses)),
    }


def fit_hidden_head(
    measurer: Measurer,
    question,
    rule: Scoring,
    texts: list[str],
    y: np.ndarray,
    *,
    lexical: bool = True,
    layer: int | None = None,
) -> Head:
    """A head on the hidden state alone (of block `layer`, None: the final state; with the lexical
    expert), C chosen by cross-validated NLL among calibrate's grid, fitted on these labelled items
    (hidden states read 16 to a call)."""
    H = np.array(
        [
            h
            for start in range(0, len(texts), 16)
            for h in measurer.hidden_many(
                texts[start : start + 16],
                question,
                rule,
                layer=layer,
            )
        ]
    )
    L = np.zeros((len(texts), len(question.options)))  # not read by this head
    best = min(
        HEAD_C_GRID,
        key=lambda C: cross_validated(
            L,
            None,
            y,
            Candidate("head", False, C=C, lexical=lexical, features=HIDDEN_ONLY),
            hidden=H,
            texts=texts if lexical else None,
        )["nll"],
    )
    fitted = fit_head(L, H, y, C=best, texts=texts if lexical else None, features=HIDDEN_ONLY)
    return HeadParams.from_calibrator(fitted, layer).build()


def run_dataset(engine: Engine, name: str, args) -> list[dict]:
    dataset = DATASETS[name]
    task = load_task(dataset.task)
    items = read_labelled(dataset.path, text_column=dataset.text_column, label_column=dataset.label_column)
    y = np.array([task.gold_index(item.label) for item in items])
    pool, test = split(len(items), dataset.labelled, args.items + 1, args.seed)
    texts = [items[i].text for i in test]
    question = task.question()
    rules = [Scoring(prompt_format=PROMPT_FORMAT_VERSION)]
    for prompt_format in (*QUESTION_FIRST_FORMATS, INPUT_ONLY):
        rules.append(Scoring(prompt_format=prompt_format))
        for per_class in args.shots_per_class if prompt_format not in HEAD_ONLY_FORMATS else ():
            chosen = choose_demonstrations(items, y, pool, per_class * len(task.options), args.seed)
            rules.append(
                Scoring(
                    prompt_format=prompt_format,
                    demonstrations=tuple(Demonstration(items[i].text, int(y[i])) for i in chosen),
                )
            )
    rows = []

    def record(row: dict) -> None:
        rows.append({"dataset": name, "options": len(task.options), **row})
        print(json.dumps(rows[-1]), flush=True)

    for rule in rules:
        if args.prompt_formats and rule.prompt_format not in args.prompt_formats:
            continue
        for max_bound in args.max_bound if rule.prompt_format not in HEAD_ONLY_FORMATS else ():  # those show no options
            record(run_prompt_format(engine, Decider(engine, max_bound=max_bound), question, texts, y[test], rule))
        if args.head_labels and rule.prompt_format != PROMPT_FORMAT_VERSION:
            shown = {d.input for d in rule.demonstrations}
            labelled = [int(i) for i in pool if items[i].text not in shown][: args.head_labels]
            for depth in args.head_depth:
                layer = head_layer(engine.n_layer, depth)
                head = fit_hidden_head(
                    Measurer(engine),
                    question,
                    rule,
                    [items[i].text for i in labelled],
                    y[labelled],
                    lexical=args.lexical,
                    layer=layer,
                )
                expert = " + lexical" if args.lexical else ""
                where = "final hidden state" if layer is None else f"block {layer} of {engine.n_layer}"
                row = run_prompt_format(
                    engine,
                    Decider(engine),
                    question,
                    texts,
                    y[test],
                    replace(rule, head=head),
                    method=f"head, {where}{expert} ({len(labelled)} labels)",
                )
                record({**row, "head_layer": layer})
    baseline = next(
        (
            r
            for r in rows
            if r["prompt_format"] == PROMPT_FORMAT_VERSION
            and r["shots"] == 0
            and r["method"] == "zero-shot"
            and r["max_probability_bound"] == min(args.max_bound, default=0.0)
        ),
        None,
    )
    for row in rows:
        if baseline is not None:
            row["p50_speedup"] = baseline["p50_s"] / row["p50_s"]
            row["rows_ratio"] = row["rows_per_request"] / baseline["rows_per_request"]
    return rows


def print_table(rows: list[dict], console: Console, title: str) -> None:
    table = Table(title=title)
    for column in (
        "data set",
        "prompt_format",
        "shots",
        "method",
        "allowed bound",
        "rows/request",
        "decode calls",
        "p50 s",
        "p95 s",
        "first s",
        "accuracy",
        "NLL",
        "p50 speed-up",
    ):
        table.add_column(column, justify="left" if column in ("data set", "prompt format") else "right")
    for r in rows:
        table.add_row(
            r["dataset"],
            r["prompt_format"],
            str(r["shots"]),
            r["method"],
            f"{r['max_probability_bound']:g}",
            f"{r['rows_per_request']:.1f}",
            f"{r['decode_calls']:.2f}",
            f"{r['p50_s']:.3f}",
            f"{r['p95_s']:.3f}",
            f"{r['first_s']:.2f}",
            f"{r['accuracy']:.3f}",
            f"{r['nll']:.3f}",
            f"{r['p50_speedup']:.2f}x" if "p50_speedup" in r else "-",
        )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", nargs="+", default=["agnews"], choices=list(DATASETS))
    parser.add_argument("--items", type=int, default=40, help="test items decided per prompt format")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="bundled model name or GGUF path")
    parser.add_argument(
        "--shots-per-class",
        type=int,
        nargs="*",
        default=[1],
        help="question-first prompt formats with this many demonstrations per class (none: zero-shot only)",
    )
    parser.add_argument("--prompt-formats", "--layouts", nargs="*", default=None, help="only these prompt formats")
    parser.add_argument(
        "--max-bound",
        type=float,
        nargs="*",
        default=[0.0],
        help="answer bounds to run each prompt format with (0: exact answer tries; none: heads only)",
    )
    parser.add_argument(
        "--head-labels",
        type=int,
        default=0,
        help="also fit and time a head on the hidden state (+ lexical) on this many labelled items, "
        "every prompt format but llamadecide-1 (0: none)",
    )
    parser.add_argument("--no-lexical", dest="lexical", action="store_false", help="heads without the lexical expert")
    parser.add_argument(
        "--head-depth",
        type=float,
        nargs="+",
        default=[BLOCK_DEPTH],
        help="where the heads read, as shares of the model's blocks (1: the final state); one head per depth",
    )
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--n-gpu-layers", type=int, default=0, help="layers on the GPU (-1: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write {'rows': [...]} with every figure here")
    args = parser.parse_args(argv)
    path = resolve_model_path(args.model)
    engine = engine_for(path, n_ctx=args.n_ctx, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers)
    rows: list[dict] = []
    try:
        for name in args.dataset:
            rows.extend(run_dataset(engine, name, args))
    finally:
        engine.close()
    device = "GPU" if args.n_gpu_layers else "CPU"
    title = f"{path.name} · {device} · {engine.n_threads} threads · {platform.processor() or platform.machine()}"
    print_table(rows, Console(width=150), title)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "model": path.name,
                    "device": device,
                    "threads": engine.n_threads,
                    "machine": platform.machine(),
                    "rows": rows,
                },
                indent=2,
            ),
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
