"""What reading a hidden state costs: the tap (inside the call, no vocabulary projection) against
llama.cpp's embeddings mode (every row an output, every row projected), and the tap at the block a
head reads (`--head-depth`: the call stops there), per head prompt format, one input at a time as a
single client sends them (a script that prints figures).

    python -m benchmarks.hidden_states [--model NAME] [--dataset banking77] [--items 30]
        [--prompt-formats llamadecide-3 llamadecide-6] [--head-depth 0.85]

Each configuration runs in the order tap, embeddings mode, tap at the block, tap, on one engine per
way; the final states must be bit-identical across the two ways.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks.datasets import DATASETS
from benchmarks.engines import engine_for
from llamadecide.calibration.config import head_layer
from llamadecide.calibration.data import load_task, read_labelled
from llamadecide.decisions import Scoring
from llamadecide.decisions.measuring import Measurer
from llamadecide.engine import Engine, resolve_model_path
from llamadecide.engine.model_files import BLOCK_DEPTH


def measure(
    engine: Engine, texts: list[str], question, prompt_format: str, layer: int | None = None
) -> tuple[list[float], float, np.ndarray]:
    """Seconds per hidden state, rows per input, and the states, after pinning the question."""
    measurer = Measurer(engine)
    measurer.hidden(texts[0], question, Scoring(prompt_format=prompt_format), layer=layer)
    seconds, states = [], []
    rows = engine.counters["rows"]
    for text in texts:
        began = time.perf_counter()
        states.append(measurer.hidden(text, question, Scoring(prompt_format=prompt_format), layer=layer))
        seconds.append(time.perf_counter() - began)
    return seconds, (engine.counters["rows"] - rows) / len(texts), np.array(states)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--dataset", default="banking77", choices=list(DATASETS))
    parser.add_argument("--items", type=int, default=30)
    parser.add_argument("--prompt-formats", nargs="+", default=["llamadecide-3", "llamadecide-6"])
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument(
        "--head-depth",
        type=float,
        default=BLOCK_DEPTH,
        help="where the block a head reads lies (the default model's measured depth)",
    )
    args = parser.parse_args(argv)
    data = DATASETS[args.dataset]
    task = load_task(data.task)
    labelled = read_labelled(data.path, text_column=data.text_column, label_column=data.label_column)
    texts = [item.text for item in labelled[:: max(1, len(labelled) // args.items)][: args.items]]
    path = resolve_model_path(args.model)
    engines = {tap: engine_for(path, n_ctx=args.n_ctx, hidden_tap=tap) for tap in (True, False)}
    question = task.question()
    layer = head_layer(engines[True].n_layer, args.head_depth)
    print(f"{path.name}, {args.dataset}, {len(texts)} inputs one at a time")
    print("| prompt format | hidden state read | rows / input | p50 ms | mean ms |")
    print("| --- | --- | ---: | ---: | ---: |")
    for prompt_format in args.prompt_formats:
        states = {}
        for tap, block in ((True, None), (False, None), (True, layer), (True, None)):
            engines[tap].clear_cache()
            seconds, rows, read = measure(engines[tap], texts, question, prompt_format, block)
            if block is None:
                states[tap] = read
            way = (
                f"block {block} of {engines[tap].n_layer} (tap, stops there)"
                if block is not None
                else ("final state, inside the call (tap)" if tap else "final state, embeddings mode")
            )
            print(
                f"| {prompt_format} | {way} | {rows:.1f} | {statistics.median(seconds) * 1000:.1f} | "
                f"{statistics.mean(seconds) * 1000:.1f} |",
                flush=True,
            )
        if not np.array_equal(states[True], states[False]):
            print(f"{prompt_format}: the two ways differ (max {np.abs(states[True] - states[False]).max():.3g})")
            return 1
    print("states bit-identical both ways")
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
