"""One plan: for each model, calibrate on the same split and flags, serve the chosen profile and
measure it with the bench's load code, then price it per instance. Each finished step is kept in the
model's folder, so an interrupted plan resumes where it stopped (calibrate's own cache resumes a
model's scoring)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamadecide.bench.load import run_level, summarise
from llamadecide.bench.server_process import ServerProcess
from llamadecide.calibration.backends import LocalBackend
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.run import calibrate
from llamadecide.calibration.steps import split
from llamadecide.engine import Engine
from llamadecide.engine.model_files import BUNDLED, installed, resolve_model_path
from llamadecide.errors import InvalidRequestError
from llamadecide.planning.choice import instance_rows, pareto_front, recommend, recommend_by_total
from llamadecide.settings import Settings

STEP_FILE = "plan-step.json"


@dataclass(frozen=True)
class PlanConfig:
    out_dir: Path
    models: tuple[str, ...]
    run: RunConfig  # calibrate's flags, the same for every model (its out_dir is each model's folder)
    concurrency: tuple[int, ...] = (1, 8)
    requests: int = 32  # measured requests per concurrency level
    warmup: int = 2
    workload_items: int = 64  # test items the served measurement cycles through
    # Engine settings the user gave (the flags of `plan`), for every model's calibration and server.
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)
    min_auto_share: float | None = None
    review_cost: float | None = None  # USD a person's review of one escalated decision costs


def installed_models() -> tuple[str, ...]:
    """Every bundled model whose packages are installed (the plan's default)."""
    return tuple(name for name in BUNDLED if installed(name))


def model_key(model: str) -> str:
    """A model's name in the plan: a bundled name as it is, a GGUF path by its file name."""
    return model if model in BUNDLED else Path(model).name.removesuffix(".gguf")


def check_models(models: tuple[str, ...]) -> tuple[str, ...]:
    """Refuse, before anything loads, a model that is neither bundled nor an existing path, and two
    models that would share a folder."""
    unknown = [m for m in models if m not in BUNDLED and not Path(m).expanduser().exists()]
    if unknown:
        raise InvalidRequestError(
            f"unknown model {', '.join(map(repr, unknown))}: pass a bundled name ({', '.join(BUNDLED)}) or a GGUF path",
            param="model",
        )
    keys = [model_key(m) for m in models]
    if len(set(keys)) != len(keys):
        raise InvalidRequestError(f"two models share a name in the plan: {keys}", param="model")
    if not models:
        raise InvalidRequestError("no model to plan with: install one (`llamadecide models`) or pass --model")
    return models


def read_gpu_results(paths: list[Path], task: Task) -> dict[str, tuple[float, str]]:
    """GPU throughput per model from `llamadecide bench --gpu on --model M` results files: the best
    decision level measured on the GPU, with where it comes from."""
    found: dict[str, tuple[float, str]] = {}
    for path in paths:
        try:
            results = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InvalidRequestError(f"--gpu-results {path}: {exc}", param="gpu_results") from exc
        if not results.get("model"):
            raise InvalidRequestError(
                f"--gpu-results {path} does not say which model it measured (rerun `llamadecide bench --gpu on "
                "--model M` there)",
                param="gpu_results",
            )
        if results.get("task") != task.name:
            raise InvalidRequestError(
                f"--gpu-results {path} measured task {results.get('task')!r}, not {task.name!r}", param="gpu_results"
            )
        levels = [
            level
            for level in results.get("levels", [])
            if str(level.get("device", "")).startswith("gpu") and level.get("kind") == "decision"
        ]
        if not levels:
            raise InvalidRequestError(f"--gpu-results {path} holds no decision level measured on a GPU")
        best = max(levels, key=lambda level: level["throughput_rps"])
        served = f"profile {results['profile']}" if results.get("profile") else "zero-shot"
        found[model_key(str(results["model"]))] = (
            best["throughput_rps"],
            f"measured on GPU ({Path(path).name}: {best['concurrency']} clients, {served})",
        )
    return found


def plan(
    task: Task,
    items: list[LabelledItem],
    config: PlanConfig,
    prices: dict,
    gpu_results: dict[str, tuple[float, str]] | None = None,
    on_step: Callable[[str, str], None] = lambda model, step: None,
) -> dict:
    """Measure every model, price it per instance, recommend; write plan.json. A model that fails to
    load or to serve is a row saying so."""
    for item in items:  # a label outside the options is refused before any model loads
        task.gold_index(item.label)
    _, test_idx = split(len(items), config.run.calibration_size, config.run.test_size, config.run.seed)
    step = max(1, len(test_idx) // config.workload_items)
    workload = [items[i] for i in test_idx[::step][: config.workload_items]]
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    models = []
    for model in config.models:
        row = _one_model(model, task, items, workload, config, on_step)
        if not row.get("error"):
            gpu = (gpu_results or {}).get(row["model"])
            row["instances"] = instance_rows(
                prices,
                throughput_rps=row["throughput_rps"],
                cpu_vcpu=row["measured_on_vcpu"],
                auto_share=row["auto_share"] if row["threshold"] is not None else None,
                model_bytes=row["model_bytes"],
                gpu_rps=gpu[0] if gpu else None,
                gpu_basis=gpu[1] if gpu else "measured on GPU",
                review_cost=config.review_cost,
            )
        models.append(row)
    result = {
        "task": task.name,
        "items": len(items),
        "split": {"calibration": config.run.calibration_size, "test": len(test_idx), "seed": config.run.seed},
        "target_precision": config.run.target_precision,
        "confidence_level": config.run.confidence_level,
        "machine": {"cpus": os.cpu_count()},
        "prices": prices.get("source"),
        "models": models,
        "pareto": [{"model": m, "instance": i} for m, i in pareto_front(models)],
        "recommendation": (
            recommend_by_total(models, config.review_cost)
            if config.review_cost is not None
            else recommend(models, config.run.target_precision, config.min_auto_share)
        ),
        "review_cost": config.review_cost,
    }
    (out / "plan.json").write_text(json.dumps(result, indent=2, default=float))
    return result


def _one_model(
    model: str,
    task: Task,
    items: list[LabelledItem],
    workload: list[LabelledItem],
    config: PlanConfig,
    on_step: Callable[[str, str], None],
) -> dict:
    key = model_key(model)
    folder = Path(config.out_dir) / "models" / key
    folder.mkdir(parents=True, exist_ok=True)
    state_path = folder / STEP_FILE
    fingerprint = _fingerprint(model, config)
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    if state.get("fingerprint") != fingerprint:
        state = {"fingerprint": fingerprint}
    resumed = [step for step in ("calibration", "served") if step in state]
    try:
        path = resolve_model_path(model)
        if "calibration" not in state:
            on_step(key, "calibrating")
            engine = Engine(Settings(**{**config.engine, "model": str(path)}).engine_config())
            try:
                summary = calibrate(LocalBackend(engine), task, items, dataclasses.replace(config.run, out_dir=folder))
            finally:
                engine.close()
            state["calibration"] = _calibration_figures(summary)
            state_path.write_text(json.dumps(state, indent=2))
        if "served" not in state:
            on_step(key, "serving")
            state["served"] = _serve_and_measure(path, folder, task, workload, config)
            state_path.write_text(json.dumps(state, indent=2))
    except Exception as exc:  # one model's failure is its row, not the end of the plan
        on_step(key, "failed")
        return {"model": key, "path": model, "error": f"{type(exc).__name__}: {exc}"}
    on_step(key, "done")
    served = state["served"]
    return {
        "model": key,
        "path": str(path),
        "model_bytes": path.stat().st_size,
        **state["calibration"],
        "p50_s": served["p50_s"],
        "throughput_rps": served["throughput_rps"],
        "measured_on_vcpu": served["vcpu"],
        "levels": served["levels"],
        "calibration_dir": str(folder.relative_to(config.out_dir)),
        "resumed": resumed,
    }


def _fingerprint(model: str, config: PlanConfig) -> str:
    """What a model's finished steps depend on: reused only when all of it is unchanged."""
    run = {k: v for k, v in dataclasses.asdict(config.run).items() if k not in ("out_dir", "show_progress")}
    what = {
        "model": model,
        "run": run,
        "concurrency": config.concurrency,
        "requests": config.requests,
        "workload_items": config.workload_items,
        "engine": config.engine,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _env_value(value: Any) -> str:
    """A setting as its LLAMADECIDE_* variable spells it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _calibration_figures(summary: dict) -> dict:
    test = summary["test"]["calibrated"]
    threshold = summary["threshold"]["calibration"]
    on_test = summary["threshold"]["test"]
    return {
        "accuracy": test["accuracy"],
        "ece": test["ece_width"],
        "brier": test["brier"],
        "threshold": threshold["threshold"] if threshold else None,
        # The guarantee is stated on the calibration part (held-out predictions); auto_share and
        # precision_on_test are what the threshold did on the test part.
        "guarantee": (
            f"precision >= {threshold['lower_bound']:.3f} with {threshold['confidence_level']:.0%} confidence "
            f"(Clopper-Pearson, {threshold['auto']} calibration items)"
            if threshold
            else f"precision {summary['threshold']['target']} not reachable at any threshold"
        ),
        "auto_share": on_test["coverage"] if on_test else 0.0,
        "precision_on_test": on_test["precision"] if on_test else None,
        "method": summary["chosen"]["label"],
        "prompt_format": summary["prompt_format"],
        "calibrate_s": summary["cost"]["total_s"],
    }


def _serve_and_measure(path: Path, folder: Path, task: Task, workload: list[LabelledItem], config: PlanConfig) -> dict:
    """The calibrated profile served as users run it (a `llamadecide serve` process on this machine's
    CPU), measured at each concurrency by the bench's load code."""
    profile = json.loads((folder / "profile.json").read_text())["name"]
    golds = [task.gold_index(item.label) for item in workload]
    key = secrets.token_hex(16)
    env = {
        **{f"LLAMADECIDE_{name.upper()}": _env_value(value) for name, value in config.engine.items()},
        "LLAMADECIDE_API_KEY": key,
        "LLAMADECIDE_QUEUE_SIZE": str(max(config.concurrency) + 4),
    }
    levels = []
    with ServerProcess(
        "--model", str(path), "--profiles-dir", str(folder), "--n-gpu-layers", "0", env=env, log_dir=folder
    ) as server:
        for concurrency in config.concurrency:
            records, wall, work = asyncio.run(
                run_level(
                    server.url,
                    key,
                    "decision",
                    task,
                    workload,
                    golds,
                    concurrency,
                    config.requests,
                    config.warmup,
                    profile=profile,
                )
            )
            figures = summarise(records, wall)
            if figures["error_rate"]:
                raise RuntimeError(f"{figures['error_rate']:.0%} of served decisions failed: {figures['first_error']}")
            levels.append({"concurrency": concurrency, **figures, "engine": work})
    lowest = min(levels, key=lambda level: level["concurrency"])
    return {
        "p50_s": lowest["p50_s"],
        "throughput_rps": max(level["throughput_rps"] for level in levels),
        "vcpu": os.cpu_count() or 1,
        "levels": [{k: v for k, v in level.items() if k != "first_error"} for level in levels],
    }
