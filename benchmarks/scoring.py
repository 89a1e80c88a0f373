"""Scoring benchmark: what a K-option decision costs against evaluating its prompt once.

    python -m benchmarks.scoring [--model PATH] [--repeats 7] [--json]

The ticket is about 300 tokens. For K = 2, 5, 20 it prints the prompt-only latency (prompt
evaluated from an empty cache, last logits read), the decision latency (same empty cache, all K
options scored exactly), their ratio, the warm decision latency (the cache holds the previous
request, another ticket, so only the shared system instruction is reused: what a running server
sees), and the naive latency (one full evaluation of prompt + option per option). Targets:
decision / prompt-only <= 1.25 at K = 5, naive / decision >= 3 at K = 5, warm decision < 2 s at
K = 5.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from llamadecide.decisions import Decider, choice
from llamadecide.decisions.measuring import Measurer
from llamadecide.decisions.prompt import build_messages
from llamadecide.engine import Engine
from llamadecide.settings import Settings

TICKET = (
    "Subject: Charged twice and now locked out of my account\n\n"
    "Hello, I have been a customer for about three years and I have never had a problem until "
    "this week. On Monday I renewed my annual plan with the Visa card ending in 4421, and the "
    "payment page showed an error, so I tried again. Both attempts went through: my bank "
    "statement shows two charges of 129.00 dollars on the same day. Since then, when I try to "
    "sign in on the web site or in the mobile app, I get a message saying that my account is "
    "suspended pending verification, and the password reset email never arrives, not even in "
    "the spam folder. I need the duplicate charge refunded and access restored before Friday, "
    "because our team uses the shared workspace for a client presentation. I already opened a "
    "chat yesterday but the agent disconnected after twenty minutes. Please call me back at the "
    "number on file or reply to this email.\n\n"
    "Some details that may help: the order numbers are 88412 and 88413, both at 10:42 in the "
    "morning, and the confirmation emails went to my work address, which is also the login. I "
    "changed the password on that account last month after your security notice, and I use the "
    "authenticator app for two-step sign-in, which still shows codes. My colleague, who is an "
    "admin on the same workspace, cannot see my user in the member list any more. Thank you, Dana"
)
PREVIOUS_TICKET = "Hi, the invoice for November lists three seats but we only have two users. Can you fix it?"
TEAMS = [
    "billing",
    "account security",
    "technical support",
    "sales",
    "customer success",
    "shipping",
    "returns",
    "legal",
    "privacy",
    "partnerships",
    "mobile app",
    "web platform",
    "identity verification",
    "payments engineering",
    "fraud prevention",
    "enterprise accounts",
    "education discounts",
    "hardware repairs",
    "developer relations",
    "general enquiries",
]


def _median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def measure(engine: Engine, k: int, repeats: int) -> dict:
    decider, measurer = Decider(engine), Measurer(engine)
    question = choice("Which team should handle this ticket?", TEAMS[:k])
    item = measurer.planner.tokenize(TICKET, question)
    prompt = engine.tokenize_prompt(engine.render_chat(build_messages(TICKET, question)))

    def decide_fresh() -> None:
        engine.clear_cache()
        decider.decide(TICKET, [question])

    def decide_warm() -> float:
        engine.clear_cache()
        decider.decide(PREVIOUS_TICKET, [question])
        began = time.perf_counter()
        decider.decide(TICKET, [question])
        return time.perf_counter() - began

    engine.prompt_seconds(prompt)  # warm-up
    decide_fresh()
    prompt_only = statistics.median(engine.prompt_seconds(prompt) for _ in range(repeats))
    decision = _median_seconds(decide_fresh, repeats)
    warm = statistics.median(decide_warm() for _ in range(repeats))
    naive = _median_seconds(lambda: measurer.decide_naive(TICKET, question), max(3, repeats // 2))
    return {
        "k": k,
        "prompt_tokens": len(prompt),
        "answer_tokens": sum(len(s) - b for s, b in zip(item.sequences, item.boundaries)),
        "prompt_only_ms": prompt_only * 1000,
        "decision_ms": decision * 1000,
        "ratio": decision / prompt_only,
        "warm_decision_ms": warm * 1000,
        "naive_ms": naive * 1000,
        "speedup_vs_naive": naive / decision,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default=None, help="GGUF path or bundled model name (default: the default bundled model)"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--n-gpu-layers", type=int, default=None)
    parser.add_argument("--flash-attn", action="store_true", help="use flash attention")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--options", type=int, nargs="+", default=[2, 5, 20])
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    args = parser.parse_args(argv)
    overrides = {
        "model": args.model,
        "n_threads": args.threads,
        "n_gpu_layers": args.n_gpu_layers,
        "flash_attn": args.flash_attn or None,
    }
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    engine = Engine(settings.engine_config())
    rows = [measure(engine, k, args.repeats) for k in args.options]
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        table = Table(
            title=f"scoring: {engine.model_name}, {engine.n_threads} threads, "
            f"n_gpu_layers={engine.n_gpu_layers}"
            f"{', flash attention' if engine.config.flash_attn else ''}"
        )
        for column in (
            "K",
            "prompt tok",
            "answer tok",
            "prompt-only ms",
            "decision ms",
            "ratio",
            "warm ms",
            "naive ms",
            "vs naive",
        ):
            table.add_column(column, justify="right")
        for r in rows:
            table.add_row(
                str(r["k"]),
                str(r["prompt_tokens"]),
                str(r["answer_tokens"]),
                f"{r['prompt_only_ms']:.1f}",
                f"{r['decision_ms']:.1f}",
                f"{r['ratio']:.3f}",
                f"{r['warm_decision_ms']:.1f}",
                f"{r['naive_ms']:.1f}",
                f"{r['speedup_vs_naive']:.1f}x",
            )
        console = Console()
        console.print(table)
        for r in rows:
            if r["k"] == 5:
                ok_ratio, ok_naive = r["ratio"] <= 1.25, r["speedup_vs_naive"] >= 3.0
                console.print(
                    f"K=5 target decision/prompt-only <= 1.25: {'met' if ok_ratio else 'NOT met'} ({r['ratio']:.3f})"
                )
                console.print(
                    f"K=5 target naive/decision >= 3: {'met' if ok_naive else 'NOT met'} ({r['speedup_vs_naive']:.1f}x)"
                )
                ok_warm = r["warm_decision_ms"] < 2000
                console.print(
                    f"K=5 target warm decision < 2 s: {'met' if ok_warm else 'NOT met'} "
                    f"({r['warm_decision_ms'] / 1000:.2f} s)"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
