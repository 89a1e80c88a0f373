"""`llamadecide plan`: calibrate and serve each model on the same task, price it per instance, recommend."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llamadecide.calibration.config import RunConfig
from llamadecide.cli.calibrate import (
    GUARANTEE_FLAGS,
    SPLIT_FLAGS,
    LabelColumnOption,
    LabelledFileArgument,
    TaskOption,
    TextColumnOption,
)
from llamadecide.cli.common import fail, wide_console
from llamadecide.cli.flags import SCORING_SETTINGS, config_flags, given_settings, settings_flags
from llamadecide.settings import Settings

# The model is the plan's own repeated --model; the other engine settings hold for every model.
PLAN_ENGINE_SETTINGS = tuple(name for name in SCORING_SETTINGS if name != "model")


@config_flags(RunConfig, *SPLIT_FLAGS, *GUARANTEE_FLAGS, "row_budget")
@settings_flags(*PLAN_ENGINE_SETTINGS)
def plan_command(
    data: LabelledFileArgument,
    task: TaskOption,
    settings: Settings,
    run: dict,
    text_column: TextColumnOption = "text",
    label_column: LabelColumnOption = "label",
    models: Annotated[
        list[str],
        typer.Option(
            "--model", "-m", help="Bundled model name or GGUF path (repeat; default: every installed bundled model)"
        ),
    ] = [],
    min_auto_share: Annotated[
        Optional[float],
        typer.Option(
            "--min-auto-share",
            min=0.0,
            max=1.0,
            help="Share of items a recommended model must handle automatically (default: the best share any "
            "model reaches, less 5 points)",
        ),
    ] = None,
    review_cost: Annotated[
        Optional[float],
        typer.Option(
            "--review-cost",
            min=0.0,
            help="USD a person's review of one escalated decision costs: each model x instance is then priced in "
            "total per 1,000 decisions (compute and reviews) and recommended by it",
        ),
    ] = None,
    requests: Annotated[int, typer.Option("--requests", min=1, help="Measured requests per concurrency level")] = 32,
    concurrency: Annotated[
        list[int], typer.Option("--concurrency", min=1, help="Concurrency levels served (repeat)")
    ] = [1, 8],
    prices: Annotated[
        Optional[Path], typer.Option("--prices", help="Price table JSON (default: the shipped one)")
    ] = None,
    gpu_results: Annotated[
        list[Path],
        typer.Option(
            "--gpu-results",
            help="results.json of `llamadecide bench --gpu on --model M` on a GPU machine (repeat): prices GPU "
            "instances for that model; without one a GPU instance is 'not measured'",
        ),
    ] = [],
    out: Annotated[Path, typer.Option("--out", help="Output directory (plan.json, report.html, models/)")] = Path(
        "plan-out"
    ),
) -> None:
    """Which model on which instance handles a task at a precision for the least money: calibrate and serve
    each model, price it per instance, recommend. Resumable: rerun the same command after an interruption."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from llamadecide.calibration.data import file_fingerprint, load_task, read_labelled
    from llamadecide.cli.calibrate import run_config
    from llamadecide.errors import LlamaDecideError
    from llamadecide.planning.report import pareto_plot, print_plan, write_html
    from llamadecide.planning.run import PlanConfig, check_models, installed_models, plan, read_gpu_results
    from llamadecide.prices import load_prices

    console = wide_console(140)
    try:  # everything the user passed is checked before a model loads
        the_task = load_task(task)
        items = read_labelled(data, text_column=text_column, label_column=label_column)
        chosen = check_models(tuple(models) or installed_models())
        table = load_prices(prices)
        gpu = read_gpu_results(gpu_results, the_task)
        config = PlanConfig(
            out_dir=out,
            models=chosen,
            run=run_config(
                out, run, dataset_fingerprint=file_fingerprint(data, text_column, label_column), show_progress=False
            ),
            concurrency=tuple(concurrency),
            requests=requests,
            engine=settings.model_dump(include=given_settings(settings, PLAN_ENGINE_SETTINGS)),
            min_auto_share=min_auto_share,
            review_cost=review_cost,
        )
        with Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
        ) as progress:
            bar = progress.add_task(f"{len(chosen)} models", total=len(chosen))

            def on_step(model: str, step: str) -> None:
                progress.update(bar, description=f"{model}: {step}")
                if step in ("done", "failed"):
                    progress.advance(bar)

            result = plan(the_task, items, config, table, gpu, on_step=on_step)
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    pareto_plot(result, out / "pareto.png")
    write_html(result, out)
    print_plan(result, console)
    console.print(f"wrote {out}/plan.json, {out}/report.html, {out}/pareto.png, {out}/models/")
