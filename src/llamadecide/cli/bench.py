"""`llamadecide bench`: the load benchmark (llamadecide.bench.load) with its outputs."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
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
    from llamadecide.bench.load import asdict_records, floor_figures, row_seconds, run_level, summarise
    from llamadecide.bench.results import markdown, plot, print_tables
    from llamadecide.bench.server_process import ServerProcess
    from llamadecide.calibration.data import load_task, read_labelled
    from llamadecide.cli.common import fail, wide_console
    from llamadecide.engine import gpu_offload_supported
    from llamadecide.engine.model_files import default_model
    from llamadecide.errors import LlamaDecideError
    from llamadecide.prices import cost_table, load_prices

    console = wide_console(140)
    if data is None:
        if not REPOSITORY_DATA.is_file():
            raise fail(
                "pass --data FILE with labelled items (and --task, --text-column, --label-column for it): "
                "the default AG News workload is only beside a repository checkout"
            )
        data = REPOSITORY_DATA
    try:
        the_task = load_task(task)
        table_prices = load_prices(prices)  # refused now, not after the measuring
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    labelled = read_labelled(data, text_column=text_column, label_column=label_column)
    step = max(1, len(labelled) // items)
    sample = labelled[::step][:items]
    golds = [the_task.gold_index(i.label) for i in sample]
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "task": the_task.name,
        "items": len(sample),
        "requests_per_level": requests,
        "levels": [],
        "threads": [],
        "machine": {"cpus": os.cpu_count()},
        # What `plan --gpu-results` matches a model by; unknown for a server started elsewhere.
        "model": model or (None if url else default_model()),
    }
    records_file = (out / "records.jsonl").open("w")

    profile_name = None
    if profile is not None:
        from llamadecide.calibration.profile import CalibrationProfile, profile_files

        files = profile_files(profile) if profile.is_dir() else [profile]
        profile_name = CalibrationProfile.load(files[0]).name
        results["profile"] = profile_name
    if predicate:
        results["predicate"] = predicate

    # The compute floor: what the engine takes per row in a large call, measured here before any server
    # starts (same machine, same run), per device.
    seconds_per_row: dict[str, float] = {}

    def floor_for(device: str, layers: int) -> None:
        if url is not None and model is None:
            return  # the server's model is not known here
        from llamadecide.engine import resolve_model_path

        seconds_per_row[device] = row_seconds(resolve_model_path(model), [i.text for i in sample], n_gpu_layers=layers)
        results.setdefault("seconds_per_row", {})[device] = seconds_per_row[device]
        console.print(f"{device}: {seconds_per_row[device] * 1000:.2f} ms a row in a 512-row call (the floor's unit)")

    def measure(base_url: str, device: str, kinds: tuple[str, ...], levels: list[int]) -> None:
        for kind in kinds:
            for c in levels:
                recs, wall, work = asyncio.run(
                    run_level(
                        base_url,
                        api_key,
                        kind,
                        the_task,
                        sample,
                        golds,
                        c,
                        requests,
                        warmup,
                        profile=profile_name,
                        predicate=predicate,
                    )
                )
                summary = {"device": device, "kind": kind, "concurrency": c, **summarise(recs, wall)}
                if kind == "decision":
                    summary.update(floor_figures(summary, work, seconds_per_row.get(device.split(",")[0])))
                results["levels"].append(summary)
                for r in asdict_records(recs):
                    records_file.write(json.dumps({"device": device, "concurrency": c, **r}) + "\n")
                floor = (
                    f"  {summary['rows_per_request']:.0f} rows/req, "
                    f"{summary['decisions_per_engine_run'] or 0:.1f} "
                    f"per engine run"
                    if "rows_per_request" in summary
                    else ""
                )
                if "floor_efficiency" in summary:
                    floor += f", floor efficiency {summary['floor_efficiency']:.2f}"
                console.print(
                    f"{device} {kind:8s} c={c:<3d} p50 {summary['p50_s'] or 0:.3f}s  p95 "
                    f"{summary['p95_s'] or 0:.3f}s  "
                    f"{summary['throughput_rps']:.2f} req/s  errors {summary['error_rate']:.1%}{floor}"
                )

    def with_server(args: list[str], device: str, kinds, levels, env: dict | None = None) -> None:
        if url:
            measure(url, device, kinds, levels)
            return
        model_args = ["--model", model] if model else []
        profile_args = ["--profiles-dir", str(profile)] if profile else []
        with ServerProcess(
            *model_args, *profile_args, *args, env={"LLAMADECIDE_QUEUE_SIZE": str(max(levels) + 4), **(env or {})}
        ) as server:
            measure(server.url, device, kinds, levels)

    kinds = ("decision", "chat") if chat else ("decision",)
    floor_for("cpu", 0)
    for batch in decision_batch or [None]:
        label = "cpu" if batch is None else f"cpu, batch {batch}"
        first = batch is None or batch == decision_batch[0]
        with_server(
            ["--n-gpu-layers", "0"],
            label,
            kinds if first else ("decision",),
            concurrency,
            env={"LLAMADECIDE_DECISION_BATCH": str(batch)} if batch is not None else None,
        )
    gpu_present = shutil.which("nvidia-smi") is not None and gpu_offload_supported()
    if gpu == "on" or (gpu == "auto" and gpu_present):
        floor_for("gpu", -1)
        for batch in decision_batch or [None]:
            label = "gpu" if batch is None else f"gpu, batch {batch}"
            first = batch is None or batch == decision_batch[0]
            with_server(
                ["--n-gpu-layers", "-1"],
                label,
                kinds if first else ("decision",),
                concurrency,
                env={"LLAMADECIDE_DECISION_BATCH": str(batch)} if batch is not None else None,
            )
        results["gpu"] = "measured"
    else:
        results["gpu"] = (
            (
                "not measured: no GPU on this machine"
                if not shutil.which("nvidia-smi")
                else "not measured: llama-cpp-python was built without GPU offload"
            )
            + " (build with LLAMADECIDE_CMAKE_EXTRA=-DGGML_CUDA=on bash scripts/install.sh, then "
            "llamadecide bench --gpu on)"
        )
        console.print(f"[yellow]GPU {results['gpu']}[/yellow]")
    for t in threads:
        recs, wall = (None, None)
        model_args = ["--model", model] if model else []
        with ServerProcess(*model_args, "--threads", str(t), "--n-gpu-layers", "0") as server:
            recs, wall, _ = asyncio.run(
                run_level(server.url, api_key, "decision", the_task, sample, golds, 1, max(8, requests // 4), warmup)
            )
        results["threads"].append({"threads": t, **summarise(recs, wall)})
    records_file.close()

    for r in results["levels"]:  # throughput against the lowest concurrency of the same server and workload
        first = min(
            (x for x in results["levels"] if (x["device"], x["kind"]) == (r["device"], r["kind"])),
            key=lambda x: x["concurrency"],
        )
        r["throughput_ratio"] = r["throughput_rps"] / first["throughput_rps"] if first["throughput_rps"] else None
    cpu_decisions = [r for r in results["levels"] if r["device"].startswith("cpu") and r["kind"] == "decision"]
    best_cpu = max(cpu_decisions, key=lambda r: r["throughput_rps"])
    gpu_decisions = [r for r in results["levels"] if r["device"].startswith("gpu") and r["kind"] == "decision"]
    best_gpu = max(gpu_decisions, key=lambda r: r["throughput_rps"]) if gpu_decisions else None
    results["cost"] = {
        "source": table_prices["source"],
        "best_cpu_concurrency": best_cpu["concurrency"],
        "rows": cost_table(
            table_prices,
            cpu_rps=best_cpu["throughput_rps"],
            cpu_vcpu=os.cpu_count() or 1,
            gpu_rps=best_gpu["throughput_rps"] if best_gpu else None,
        ),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))
    plot(results, out / "latency_throughput.png")
    print_tables(results, console)
    console.print(f"wrote {out}/results.json, results.md, latency_throughput.png, records.jsonl")
