"""One `llamadecide bench` run as a list of steps: pick the workload, measure the compute floor,
serve and load each device's servers at each concurrency, sweep thread counts, then the throughput
ratios and the cost table. The CLI only turns flags into a `BenchPlan` and writes the results."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from llamadecide.bench.load import asdict_records, floor_figures, row_seconds, run_level, summarise
from llamadecide.bench.server_process import ServerProcess
from llamadecide.calibration.data import LabelledItem, Task, file_fingerprint
from llamadecide.prices import cost_table


@dataclass(frozen=True)
class BenchPlan:
    task: Task
    items: list[LabelledItem]  # the workload, cycled through
    url: str | None = None  # a running server; None: start one per configuration
    api_key: str | None = None
    model: str | None = None
    profile_dir: Path | None = None
    profile_name: str | None = None
    predicate: str | None = None
    kinds: tuple[str, ...] = ("decision", "chat")
    concurrency: tuple[int, ...] = (1, 4, 16)
    requests: int = 32
    warmup: int = 2
    decision_batch: tuple[int, ...] = ()
    threads: tuple[int, ...] = ()
    gpu: str = "auto"  # auto, on, off
    accuracy_note: str | None = None  # why accuracy is not measured, when it is not

    @property
    def golds(self) -> list[int]:
        return [self.task.gold_index(item.label) for item in self.items]


@dataclass
class Bench:
    plan: BenchPlan
    records: IO[str]
    say: Callable[[str], None] = print
    results: dict = field(default_factory=dict)
    seconds_per_row: dict[str, float] = field(default_factory=dict)

    def floor(self, device: str, layers: int) -> None:
        """What the engine takes per row in a large call, measured before any server starts (same
        machine, same run): the unit of the compute floor."""
        if self.plan.url is not None and self.plan.model is None:
            return  # the server's model is not known here
        from llamadecide.engine import resolve_model_path

        seconds = row_seconds(
            resolve_model_path(self.plan.model), [i.text for i in self.plan.items], n_gpu_layers=layers
        )
        self.seconds_per_row[device] = seconds
        self.results.setdefault("seconds_per_row", {})[device] = seconds
        self.say(f"{device}: {seconds * 1000:.2f} ms a row in a 512-row call (the floor's unit)")

    def level(self, base_url: str, device: str, kind: str, concurrency: int) -> dict:
        """One concurrency level: its latency and throughput (and for decisions, the compute floor)."""
        plan = self.plan
        records, wall, work = asyncio.run(
            run_level(
                base_url,
                plan.api_key,
                kind,
                plan.task,
                plan.items,
                plan.golds,
                concurrency,
                plan.requests,
                plan.warmup,
                profile=plan.profile_name,
                predicate=plan.predicate,
            )
        )
        summary = {"device": device, "kind": kind, "concurrency": concurrency, **summarise(records, wall)}
        if kind == "decision":
            summary.update(floor_figures(summary, work, self.seconds_per_row.get(device.split(",")[0])))
        if plan.accuracy_note:
            summary.pop("accuracy", None)
            summary["accuracy_note"] = plan.accuracy_note
        for record in asdict_records(records):
            self.records.write(json.dumps({"device": device, "concurrency": concurrency, **record}) + "\n")
        self.say(level_line(summary))
        return summary

    def device(self, device: str, layers: int) -> None:
        """Every decision_batch value's server on a device, each loaded at every concurrency."""
        plan = self.plan
        self.floor(device, layers)
        for batch in plan.decision_batch or (None,):
            label = device if batch is None else f"{device}, batch {batch}"
            kinds = plan.kinds if batch is None or batch == plan.decision_batch[0] else ("decision",)
            env = {"LLAMADECIDE_DECISION_BATCH": str(batch)} if batch is not None else {}
            with self.server(["--n-gpu-layers", str(layers)], env, max(plan.concurrency)) as base_url:
                for kind in kinds:
                    for concurrency in plan.concurrency:
                        self.results["levels"].append(self.level(base_url, label, kind, concurrency))

    def server(self, args: list[str], env: dict[str, str], most_clients: int) -> _Served:
        return _Served(self.plan, args, {"LLAMADECIDE_QUEUE_SIZE": str(most_clients + 4), **env})

    def thread_sweep(self) -> None:
        plan = self.plan
        for threads in plan.threads:
            model_args = ["--model", plan.model] if plan.model else []
            with ServerProcess(*model_args, "--threads", str(threads), "--n-gpu-layers", "0") as server:
                records, wall, _ = asyncio.run(
                    run_level(
                        server.url,
                        plan.api_key,
                        "decision",
                        plan.task,
                        plan.items,
                        plan.golds,
                        1,
                        max(8, plan.requests // 4),
                        plan.warmup,
                    )
                )
            self.results["threads"].append({"threads": threads, **summarise(records, wall)})


class _Served:
    """A server for a configuration (started here, or the one at `url`), as a context giving its URL."""

    def __init__(self, plan: BenchPlan, args: list[str], env: dict[str, str]) -> None:
        self.plan, self.args, self.env = plan, args, env
        self.process: ServerProcess | None = None

    def __enter__(self) -> str:
        if self.plan.url:
            return self.plan.url
        model_args = ["--model", self.plan.model] if self.plan.model else []
        profile_args = ["--profiles-dir", str(self.plan.profile_dir)] if self.plan.profile_dir else []
        self.process = ServerProcess(*model_args, *profile_args, *self.args, env=self.env).start()
        return self.process.url

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.stop()


def level_line(summary: dict) -> str:
    floor = (
        f"  {summary['rows_per_request']:.0f} rows/req, {summary['decisions_per_engine_run'] or 0:.1f} per engine run"
        if "rows_per_request" in summary
        else ""
    )
    if "floor_efficiency" in summary:
        floor += f", floor efficiency {summary['floor_efficiency']:.2f}"
    return (
        f"{summary['device']} {summary['kind']:8s} c={summary['concurrency']:<3d} p50 {summary['p50_s'] or 0:.3f}s  "
        f"p95 {summary['p95_s'] or 0:.3f}s  {summary['throughput_rps']:.2f} req/s  "
        f"errors {summary['error_rate']:.1%}{floor}"
    )


def gpu_wanted(gpu: str) -> tuple[bool, str | None]:
    """Whether to measure the GPU, and why not when not."""
    from llamadecide.engine import gpu_offload_supported

    present = shutil.which("nvidia-smi") is not None and gpu_offload_supported()
    if gpu == "on" or (gpu == "auto" and present):
        return True, None
    why = (
        "not measured: no GPU on this machine"
        if not shutil.which("nvidia-smi")
        else "not measured: llama-cpp-python was built without GPU offload"
    )
    return False, why + (
        " (build with LLAMADECIDE_CMAKE_EXTRA=-DGGML_CUDA=on bash scripts/install.sh, then llamadecide bench --gpu on)"
    )


def run_bench(plan: BenchPlan, records: IO[str], say: Callable[[str], None], prices: dict) -> dict:
    """Every level of the plan measured, the thread sweep, throughput ratios and costs."""
    from llamadecide.engine.model_files import default_model

    bench = Bench(plan, records, say)
    bench.results = {
        "task": plan.task.name,
        "items": len(plan.items),
        "requests_per_level": plan.requests,
        "levels": [],
        "threads": [],
        "machine": {"cpus": os.cpu_count()},
        # What `plan --gpu-results` matches a model by; unknown for a server started elsewhere.
        "model": plan.model or (None if plan.url else default_model()),
        **({"profile": plan.profile_name} if plan.profile_name else {}),
        **({"predicate": plan.predicate} if plan.predicate else {}),
        **({"accuracy": plan.accuracy_note} if plan.accuracy_note else {}),
    }
    bench.device("cpu", 0)
    wanted, why = gpu_wanted(plan.gpu)
    if wanted:
        bench.device("gpu", -1)
        bench.results["gpu"] = "measured"
    else:
        bench.results["gpu"] = why
        say(f"GPU {why}")
    bench.thread_sweep()
    throughput_ratios(bench.results["levels"])
    bench.results["cost"] = costs(bench.results["levels"], prices)
    return bench.results


def throughput_ratios(levels: list[dict]) -> None:
    """Each level's throughput against the lowest concurrency of the same server and workload."""
    for level in levels:
        first = min(
            (x for x in levels if (x["device"], x["kind"]) == (level["device"], level["kind"])),
            key=lambda x: x["concurrency"],
        )
        level["throughput_ratio"] = (
            level["throughput_rps"] / first["throughput_rps"] if first["throughput_rps"] else None
        )


def costs(levels: list[dict], prices: dict) -> dict:
    """Cost per 1,000 requests per instance, from the best decision throughput on each device."""
    cpu = [r for r in levels if r["device"].startswith("cpu") and r["kind"] == "decision"]
    best_cpu = max(cpu, key=lambda r: r["throughput_rps"])
    gpu = [r for r in levels if r["device"].startswith("gpu") and r["kind"] == "decision"]
    best_gpu = max(gpu, key=lambda r: r["throughput_rps"]) if gpu else None
    return {
        "source": prices["source"],
        "best_cpu_concurrency": best_cpu["concurrency"],
        "rows": cost_table(
            prices,
            cpu_rps=best_cpu["throughput_rps"],
            cpu_vcpu=os.cpu_count() or 1,
            gpu_rps=best_gpu["throughput_rps"] if best_gpu else None,
        ),
    }


def workload(labelled: list[LabelledItem], size: int, *, exclude: set[int] = frozenset()) -> list[LabelledItem]:
    """`size` items spread over the file (files are often sorted by label), skipping `exclude`."""
    kept = [item for n, item in enumerate(labelled) if n not in exclude]
    step = max(1, len(kept) // size)
    return kept[::step][:size]


def profile_holdout(
    profile_dir: Path, data: Path, text_column: str, label_column: str, n: int
) -> tuple[set[int], str | None]:
    """The file rows a served profile was calibrated on, to keep out of a workload whose accuracy is
    measured; or why its accuracy cannot be measured on this file (another file, or no split recorded)."""
    from llamadecide.calibration.profile import CalibrationProfile, profile_files
    from llamadecide.calibration.steps import split

    files = profile_files(profile_dir) if profile_dir.is_dir() else [profile_dir]
    profile = CalibrationProfile.load(files[0])
    recorded = (profile.metrics or {}).get("split")
    if profile.dataset_fingerprint != file_fingerprint(data, text_column, label_column):
        return set(), "not measured: the profile was calibrated on other data (its fingerprint differs)"
    if not recorded or recorded.get("items") != n:
        return set(), "not measured: the profile does not record which items it was calibrated on"
    cal, _ = split(n, recorded["calibration"], recorded["test"], recorded["seed"])
    return {int(i) for i in cal}, None


def plan_for_file(
    data: Path,
    task: Task,
    text_column: str,
    label_column: str,
    size: int,
    profile: Path | None,
    **options,
) -> BenchPlan:
    """A plan whose workload is `size` items of a labelled file; with a served profile, its name and
    only the items it was not calibrated on (or why its accuracy is not measured)."""
    from llamadecide.calibration.data import read_labelled
    from llamadecide.calibration.profile import CalibrationProfile, profile_files

    labelled = read_labelled(data, text_column=text_column, label_column=label_column)
    held, note, name = set(), None, None
    if profile is not None:
        held, note = profile_holdout(profile, data, text_column, label_column, len(labelled))
        name = CalibrationProfile.load((profile_files(profile) if profile.is_dir() else [profile])[0]).name
    return BenchPlan(
        task=task,
        items=workload(labelled, size, exclude=held),
        profile_dir=profile,
        profile_name=name,
        accuracy_note=note,
        **options,
    )
