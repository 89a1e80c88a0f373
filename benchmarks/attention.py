"""What deterministic attention costs: the flash-attention kernels side by side, on one model.

    python -m benchmarks.attention [--model M] [--pins 700 3000] [--rows 30] [--prompt 512] [--json FILE]

ggml reads its attention switches once per process, so each kernel runs in a process of its own,
one after another on the same machine:

- `invariant`: the batch-invariant tiled kernel (GGML_CPU_FA_INVARIANT, the engine's default);
- `row kernel`: ggml's row kernel at every size (GGML_CPU_FA_ROW_KERNEL, the engine's earlier way);
- `flash, stock`: released flash attention (tiled from 64 query rows), calls up to n_batch;
- `no flash`: flash attention off, llama.cpp's released default, calls up to n_batch.

Printed per kernel: milliseconds for ROWS new rows after a pinned prefix of each length (median of
--repeat calls, a different tail each time), for a PROMPT-token prompt from an empty cache, and the
largest difference of the ROWS rows' log-probabilities between alone and beside another input in
one call and after unrelated traffic (0 means bit for bit; only the deterministic kernels promise it).
With --call-sizes, also what one call costs by its number of rows (a prompt from an empty cache, no
pin): the least-squares line through them gives a call's fixed cost and its cost a row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.engines import engine_for
from llamadecide.engine import Engine, ScoringInput

KERNELS = {  # name -> (environment, flash_attn, deterministic)
    "invariant": ({"GGML_CPU_FA_INVARIANT": "1", "GGML_CPU_FA_ROW_KERNEL": "0"}, True, True),
    "row kernel": ({"GGML_CPU_FA_INVARIANT": "0", "GGML_CPU_FA_ROW_KERNEL": "1"}, True, True),
    "flash, stock": ({"GGML_CPU_FA_INVARIANT": "0", "GGML_CPU_FA_ROW_KERNEL": "0"}, True, False),
    "no flash": ({"GGML_CPU_FA_INVARIANT": "0", "GGML_CPU_FA_ROW_KERNEL": "0"}, False, False),
}
TEXT = (
    "The committee reviewed the quarterly figures, asked for the missing invoices, and agreed to meet "
    "again after the audit. "
)


def _tokens(engine: Engine, count: int, salt: int = 0) -> list[int]:
    words = engine.tokenize(f"Item {salt}. " + TEXT * (count // 10 + 8), special=False)
    return words[:count]


def _rows_after(engine: Engine, pin: list[int], tail: list[int]) -> list[np.ndarray]:
    """`tail` evaluated after the pinned prefix: one call of len(tail) rows, the last one's output read."""
    return engine.score_trie(pin + tail[:-1], [[tail[-1]]]).rows


def worker(
    model: str,
    pins: list[int],
    rows: int,
    prompt: int,
    repeat: int,
    flash: bool,
    deterministic: bool,
    call_sizes: list[int] = (),
) -> dict:
    engine = engine_for(model, n_ctx=max(pins) + 1024, flash_attn=flash, deterministic=deterministic)
    out: dict = {"call_rows": engine.call_rows, "after_pin_ms": {}, "max_difference": {}}
    for length in pins:
        pin = _tokens(engine, length, salt=length)
        engine.clear_cache()
        engine.pin_prefix(pin)
        _rows_after(engine, pin, _tokens(engine, rows, salt=1000))  # warm-up
        times = []
        for r in range(repeat):
            tail = _tokens(engine, rows, salt=r + 1)
            began = time.perf_counter()
            _rows_after(engine, pin, tail)
            times.append((time.perf_counter() - began) * 1000)
        out["after_pin_ms"][length] = statistics.median(times)
        # the same rows alone on a fresh cache, beside another input in one call, and after other traffic
        tail = _tokens(engine, rows, salt=7)
        engine.clear_cache()
        engine.pin_prefix(pin)
        alone = engine.score_many([ScoringInput(pin + tail[:-1], [[tail[-1]]])])[0].rows[0]
        other = ScoringInput(pin + _tokens(engine, rows, salt=8)[:-1], [[tail[-1]]])
        beside = engine.score_many([other, ScoringInput(pin + tail[:-1], [[tail[-1]]])])[1].rows[0]
        engine.clear_cache()
        engine.prompt_seconds(_tokens(engine, 300, salt=9))
        engine.score_trie(_tokens(engine, 200, salt=10), [[tail[-1]]])
        engine.pin_prefix(pin)
        after = _rows_after(engine, pin, tail)[0]
        out["max_difference"][length] = max(float(np.abs(alone - beside).max()), float(np.abs(alone - after).max()))
    tokens = _tokens(engine, prompt, salt=11)
    out["prompt_ms"] = statistics.median(engine.prompt_seconds(tokens) * 1000 for _ in range(max(1, repeat // 2)))
    out["call_ms"] = {
        size: statistics.median(engine.prompt_seconds(_tokens(engine, size, salt=12 + r)) * 1000 for r in range(repeat))
        for size in call_sizes
    }
    engine.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="bundled model name or GGUF path (default: the default model)")
    parser.add_argument("--pins", type=int, nargs="+", default=[700, 3000], help="pinned prefix lengths (tokens)")
    parser.add_argument("--rows", type=int, default=30, help="new rows evaluated after the pinned prefix")
    parser.add_argument("--prompt", type=int, default=512, help="tokens of the prompt evaluated from an empty cache")
    parser.add_argument("--repeat", type=int, default=7, help="calls timed per figure (the median is printed)")
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--call-sizes", type=int, nargs="*", default=[], help="also time calls of these many rows")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _, flash, deterministic = KERNELS[args.worker]
        figures = worker(
            args.model, args.pins, args.rows, args.prompt, args.repeat, flash, deterministic, args.call_sizes
        )
        print(json.dumps(figures))
        return 0
    results = {}
    for name in args.kernels:
        env = {**os.environ, **KERNELS[name][0]}
        command = [
            sys.executable,
            "-m",
            "benchmarks.attention",
            "--worker",
            name,
            "--rows",
            str(args.rows),
            "--prompt",
            str(args.prompt),
            "--repeat",
            str(args.repeat),
            "--pins",
            *map(str, args.pins),
            "--call-sizes",
            *map(str, args.call_sizes),
        ]
        if args.model:
            command += ["--model", args.model]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    table = Table(title=f"Attention kernels, {args.model or 'default model'}, {os.cpu_count()} cores (ms, median)")
    table.add_column("kernel")
    table.add_column("call rows", justify="right")
    for length in args.pins:
        table.add_column(f"{args.rows} rows after {length}", justify="right")
    table.add_column(f"{args.prompt}-token prompt", justify="right")
    for length in args.pins:
        table.add_column(f"max diff ({length})", justify="right")
    for name, figures in results.items():
        table.add_row(
            name,
            str(figures["call_rows"]),
            *(f"{figures['after_pin_ms'][str(n)]:.0f}" for n in args.pins),
            f"{figures['prompt_ms']:.0f}",
            *(f"{figures['max_difference'][str(n)]:.2g}" for n in args.pins),
        )
    Console(width=200).print(table)
    if args.call_sizes:
        calls = Table(title="One call by its rows, from an empty cache (ms, median); fit: fixed + per row x rows")
        for column in ("kernel", *(f"{n} rows" for n in args.call_sizes), "fixed ms", "ms a row"):
            calls.add_column(column, justify="right")
        for name, figures in results.items():
            sizes = np.array(args.call_sizes, dtype=float)
            times = np.array([figures["call_ms"][str(n)] for n in args.call_sizes])
            per_row, fixed = np.polyfit(sizes, times, 1) if len(sizes) > 1 else (float("nan"), float("nan"))
            figures["call_fit"] = {"fixed_ms": float(fixed), "ms_per_row": float(per_row)}
            calls.add_row(name, *(f"{x:.0f}" for x in times), f"{fixed:.0f}", f"{per_row:.2f}")
        Console(width=200).print(calls)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "machine": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(),
                    "rows": args.rows,
                    "prompt": args.prompt,
                    "kernels": results,
                },
                handle,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
