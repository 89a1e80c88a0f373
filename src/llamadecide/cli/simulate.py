"""`llamadecide simulate`: reviews as labels, replayed on a labelled file (`labels.simulate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llamadecide.calibration.config import RunConfig
from llamadecide.cli.calibrate import (
    GUARANTEE_FLAGS,
    LabelColumnOption,
    LabelledFileArgument,
    TaskOption,
    TextColumnOption,
)
from llamadecide.cli.common import fail
from llamadecide.cli.flags import SCORING_SETTINGS, config_flags, settings_flags
from llamadecide.errors import LlamaDecideError
from llamadecide.labels.active import DrawRule
from llamadecide.labels.simulate import SimulationConfig
from llamadecide.settings import Settings


@config_flags(
    SimulationConfig,
    "start_labels",
    "stream",
    "test_size",
    "audit_rate",
    "refit_every",
    "seeds",
    "baseline_labels",
    "orders",
    "max_labels",
    "measure_every",
    panel="Simulation",
    into="simulation",
)
@config_flags(DrawRule, "size", "floor", "sure", panel="Drawing (with --order)", into="rule")
@config_flags(
    RunConfig,
    "seed",
    *GUARANTEE_FLAGS,
    "prior_correction",
    "head",
    "lexical",
    "head_depth",
    "prompt_formats",
    "row_budget",
    panel="Calibration",
)
@settings_flags(*SCORING_SETTINGS)
def simulate_command(
    data: LabelledFileArgument,
    task: TaskOption,
    settings: Settings,
    run: dict,
    simulation: dict,
    rule: dict,
    text_column: TextColumnOption = "text",
    label_column: LabelColumnOption = "label",
    out: Annotated[
        Path, typer.Option("--out", help="Output directory (simulation.json, simulation.png, cache)")
    ] = Path("simulation-out"),
) -> None:
    """Replay a labelled file as traffic: random labels to start, then every escalation and the audited share
    reviewed (the file's labels as the person) and the profile refitted every so many labels; each refit's
    certified automatic share and true precision measured on a test part never streamed."""
    from llamadecide.calibration.backends import LocalBackend
    from llamadecide.calibration.data import file_fingerprint, load_task, read_labelled
    from llamadecide.cli.calibrate import run_config
    from llamadecide.engine import Engine
    from llamadecide.labels.simulate import simulate

    unknown = sorted(set(simulation.get("orders", ())) - {"active", "random"})
    if unknown:
        raise fail(f"--order takes active or random, not {', '.join(unknown)}")
    try:
        the_task = load_task(task)
        items = read_labelled(data, text_column=text_column, label_column=label_column)
        for item in items:  # a label outside the options is refused before the model loads
            the_task.gold_index(item.label)
        config = SimulationConfig(
            out_dir=out,
            run=run_config(out, run, dataset_fingerprint=file_fingerprint(data, text_column, label_column)),
            rule=DrawRule(**rule),
            **simulation,
        )
        engine = Engine(settings.engine_config())
        try:
            result = simulate(LocalBackend(engine), the_task, items, config)
        finally:
            engine.close()
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    for order, found in result.get("orders", {}).items():
        shares = ", ".join(
            f"{share}: {found['median_labels_needed'][share]}" for share in found["median_labels_needed"]
        )
        typer.echo(f"{order}: median labels to each certified automatic share: {shares}")
    if "labels_for_that_accuracy" in result:
        typer.echo(
            f"random ordering's test accuracy at {result['random_accuracy_at_most_labels']['labels']} labels, "
            f"{result['random_accuracy_at_most_labels']['test_accuracy']:.3f}, reached with (median): "
            + ", ".join(f"{o} {n}" for o, n in result["labels_for_that_accuracy"].items())
        )
    for replay in result.get("replays", []):
        for point in replay["points"]:
            precision = "-" if point["true_precision"] is None else f"{point['true_precision']:.3f}"
            kept = point.get("serving", point.get("version")) != point.get("version")
            typer.echo(
                f"seed {replay['seed']}  labels {point['labels']:5d}  certified auto share {point['auto_share']:.3f}  "
                f"true precision {precision}  ({point['method']})"
                + (f"  version {point['serving']} stays served ({point['served_auto_share']:.3f})" if kept else "")
            )
    if result.get("baseline"):
        base = result["baseline"]
        typer.echo(f"baseline: {base['labels']} random labels certify {base['auto_share']:.3f}")
    typer.echo(f"wrote {out}/simulation.json, {out}/simulation.png")
