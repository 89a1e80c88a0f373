"""`llamadecide bench`: the load benchmark (llamadecide.bench.load) with its outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

# The AG News copy of a repository checkout (data/); an installed package has no default data.
REPOSITORY_DATA = Path(__file__).resolve().parents[3] / "data" / "agnews" / "test.tsv"


def bench_command(
    url: Annotated[
        Optional[str], typer.Option("--url", help="A running server (default: start one per configuration)")
    ] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key")] = None,
    data: Annotated[
        Optional[Path],
        typer.Option(
            "--data",
            help="Labelled items for the workload (CSV, TSV or JSONL; default: the repository's AG News copy, "
            "when it is there)",
        ),
    ] = None,
    task: Annotated[
        str, typer.Option("--task", help="Task file, or a packaged task: agnews, sst2, banking77, banking77-phrases")
    ] = "agnews",
    text_column: Annotated[str, typer.Option("--text-column")] = "0",
    label_column: Annotated[str, typer.Option("--label-column")] = "1",
    items: Annotated[int, typer.Option("--items", help="Labelled items to cycle through")] = 64,
    concurrency: Annotated[list[int], typer.Option("--concurrency", help="Concurrency levels (repeat)")] = [1, 4, 16],
    requests: Annotated[int, typer.Option("--requests", help="Measured requests per level")] = 32,
    warmup: Annotated[int, typer.Option("--warmup", help="Unmeasured requests before each level")] = 2,
    threads: Annotated[list[int], typer.Option("--threads", help="CPU thread counts to sweep (repeat)")] = [],
    profile: Annotated[
        Optional[Path],
        typer.Option(
            "--profile",
            help="Serve this calibration profile (a calibrate --out folder) and send its name with every "
            "decision: the served method, e.g. a head, as users run it",
        ),
    ] = None,
    predicate: Annotated[
        Optional[str],
        typer.Option("--predicate", help="Ask this yes/no question of every item instead of the task's question"),
    ] = None,
    chat: Annotated[
        bool, typer.Option("--chat/--no-chat", help="Also measure generate-and-parse over chat completions")
    ] = True,
    decision_batch: Annotated[
        list[int],
        typer.Option(
            "--decision-batch",
            help="Server setting decision_batch values to compare, a server each (repeat; default: the server's own)",
        ),
    ] = [],
    gpu: Annotated[str, typer.Option("--gpu", help="auto (when a GPU build and device exist), on, off")] = "auto",
    model: Annotated[Optional[str], typer.Option("--model")] = None,
    prices: Annotated[
        Optional[Path], typer.Option("--prices", help="Price table JSON (default: the shipped one)")
    ] = None,
    out: Annotated[
        Path,
        typer.Option("--out", help="Directory for results.json, results.md, latency_throughput.png, records.jsonl"),
    ] = Path("bench-out"),
) -> None:
    """Latency and throughput by concurrency; decisions vs generate-and-parse; CPU vs GPU; cost per 1,000 requests."""
    from llamadecide.bench.results import print_tables
    from llamadecide.bench.run import plan_for_file, run_bench
    from llamadecide.calibration.data import load_task
    from llamadecide.cli.common import fail, wide_console
    from llamadecide.errors import LlamaDecideError
    from llamadecide.prices import load_prices

    console = wide_console(140)
    data = data or default_workload()
    try:
        table_prices = load_prices(prices)  # refused now, not after the measuring
        plan = plan_for_file(
            data,
            load_task(task),
            text_column,
            label_column,
            items,
            profile,
            url=url,
            api_key=api_key,
            model=model,
            predicate=predicate,
            kinds=("decision", "chat") if chat else ("decision",),
            concurrency=tuple(concurrency),
            requests=requests,
            warmup=warmup,
            decision_batch=tuple(decision_batch),
            threads=tuple(threads),
            gpu=gpu,
        )
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    out.mkdir(parents=True, exist_ok=True)
    with (out / "records.jsonl").open("w") as records:
        results = run_bench(plan, records, console.print, table_prices)
    write_results(results, out)
    print_tables(results, console)
    console.print(f"wrote {out}/results.json, results.md, latency_throughput.png, records.jsonl")


def default_workload() -> Path:
    """The repository's AG News copy, the workload when no --data is given."""
    from llamadecide.cli.common import fail

    if not REPOSITORY_DATA.is_file():
        raise fail(
            "pass --data FILE with labelled items (and --task, --text-column, --label-column for it): "
            "the default AG News workload is only in a repository checkout"
        )
    return REPOSITORY_DATA


def write_results(results: dict, out: Path) -> None:
    from llamadecide.bench.results import markdown, plot

    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))
    plot(results, out / "latency_throughput.png")
