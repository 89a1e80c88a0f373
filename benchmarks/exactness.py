"""How exact are the scores? Prints, per question, the log-probability differences between:

- batched: the trie-batched decision path,
- naive: prompt + option evaluated from scratch, one option at a time,
- shifted: the same from-scratch evaluation with its tokens one KV cell further along,
- exact: a float64 NumPy forward pass of the same dequantized GGUF weights (bench/reference.py).

    python -m benchmarks.exactness [--model PATH]

"shifted - naive" is llama.cpp's sensitivity to KV layout, and "batched - naive" to batch
composition: both 0 in the engine's deterministic call shapes (`engine/decoder.py`), nonzero with
`deterministic` off. "naive - exact" is llama.cpp's distance from exact arithmetic (8-bit
activations inside matmuls, f16 KV cache).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.engines import engine_for
from benchmarks.reference import ReferenceModel
from llamadecide.decisions import Decider, choice, predicate
from llamadecide.engine import Engine, resolve_model_path

TICKET = "I was charged twice for my subscription this month and I want a refund for the second payment."
DATA = Path(__file__).resolve().parents[1] / "data"


def questions() -> list[tuple[str, object]]:
    cases = [
        (TICKET, choice("Which team should handle this ticket?", ["billing", "technical support", "account security"])),
        (TICKET, choice("Which team?", ["billing", "Billing", "bIlling", "BILLING"])),
        (TICKET, predicate("The customer asks for money back.")),
        (
            "Please put me through to technical support.",
            choice("Which department?", ["technical", "technical support"]),
        ),
    ]
    intents = DATA / "banking77" / "categories.json"
    if intents.exists():
        cases.append(
            ("I still have not received my new card.", choice("Which intent?", json.loads(intents.read_text())[:20]))
        )
    return cases


def shifted_naive(engine: Engine, tokens: list[int], start: int) -> np.ndarray:
    """From-scratch evaluation with one unrelated cell in front (another sequence, masked)."""
    return engine.score_naive(tokens, start, displaced=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    args = parser.parse_args(argv)
    path = resolve_model_path(args.model)
    engine = engine_for(path, n_ctx=4096)
    reference = ReferenceModel(path)
    decider = Decider(engine)
    table = Table(title=f"log-probability differences in nats, {engine.model_name} (max / mean over options)")
    for column in (
        "question",
        "K",
        "batched - naive",
        "shifted - naive",
        "naive - exact",
        "batched - exact",
        "prob. gap batched/exact",
    ):
        table.add_column(column, justify="right")
    for state, question in questions():
        item = decider.planner.tokenize(state, question)
        batched = [float(o.logprob) for o in decider.decide(state, [question]).answers[0].options]
        naive, shifted, exact = [], [], []
        for sequence, boundary in zip(item.sequences, item.boundaries):
            naive.append(float(engine.score_naive(sequence, boundary).sum()))
            shifted.append(float(shifted_naive(engine, sequence, boundary).sum()))
            exact.append(float(reference.continuation_logprobs(sequence[:boundary], sequence[boundary:]).sum()))
        b, n, s, x = (np.array(v) for v in (batched, naive, shifted, exact))

        def cell(d: np.ndarray) -> str:
            return f"{np.abs(d).max():.3f} / {np.abs(d).mean():.3f}"

        def softmax(v: np.ndarray) -> np.ndarray:
            w = np.exp(v - v.max())
            return w / w.sum()

        gap = np.abs(softmax(b) - softmax(x)).max()
        table.add_row(
            question.instructions[:28], str(len(b)), cell(b - n), cell(s - n), cell(n - x), cell(b - x), f"{gap:.3f}"
        )
    Console(width=170).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
