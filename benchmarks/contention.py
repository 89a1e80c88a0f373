"""What another busy process does to decision latency, with OpenMP's ACTIVE (spinning) and
PASSIVE (sleeping) thread wait policies (a script that prints figures).

    python -m benchmarks.contention [--model NAME] [--decisions 12] [--busy 1]

For each policy, a fresh process (the policy is read when llama.cpp's OpenMP runtime loads) runs
the same decisions alone, then beside `--busy` processes that spin on the CPU for the duration
(bounded: they stop by themselves). Prints p50 latency and the slowdown under contention.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

TICKET = (
    "I was charged twice for my subscription this month. The second payment went through on the 3rd and "
    "my bank shows both. I want the duplicate refunded and I want to know why it happened. "
) * 3
OPTIONS = ["billing", "technical support", "account security", "sales", "cancellations"]


def _spin(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    x = 0
    while time.monotonic() < deadline:
        x += 1


def _measure(model: str | None, decisions: int) -> None:
    """Child process: print the latency of each decision as JSON."""
    from benchmarks.engines import engine_for
    from llamadecide.decisions import Decider, choice

    engine = engine_for(model, n_ctx=4096)
    decider = Decider(engine)
    question = choice("Which team should handle this ticket?", OPTIONS)
    times = []
    for i in range(decisions + 1):
        engine.clear_cache()  # every decision evaluates its whole prompt
        began = time.perf_counter()
        decider.decide(TICKET + f" (ticket {i})", [question])
        times.append(time.perf_counter() - began)
    print(json.dumps(times[1:]))  # the first warms up


def run(policy: str, model: str | None, decisions: int, busy: int) -> float:
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    command = [sys.executable, "-m", "benchmarks.contention", "--child", "--decisions", str(decisions)]
    if model:
        command += ["--model", model]
    spinners = [multiprocessing.Process(target=_spin, args=(600.0,), daemon=True) for _ in range(busy)]
    for spinner in spinners:
        spinner.start()
    try:
        output = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=True).stdout
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()
    return statistics.median(json.loads(output.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--decisions", type=int, default=12)
    parser.add_argument("--busy", type=int, default=1, help="spinning processes beside the engine")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _measure(args.model, args.decisions)
        return 0
    table = Table(title=f"decision p50 latency, {os.cpu_count()} cores, {args.busy} busy process(es) beside it")
    for column in ("OMP_WAIT_POLICY", "alone (s)", "contended (s)", "slowdown"):
        table.add_column(column, justify="right")
    for policy in ("ACTIVE", "PASSIVE"):
        alone = run(policy, args.model, args.decisions, 0)
        contended = run(policy, args.model, args.decisions, args.busy)
        table.add_row(policy, f"{alone:.3f}", f"{contended:.3f}", f"{contended / alone:.1f}x")
    Console(width=120).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
