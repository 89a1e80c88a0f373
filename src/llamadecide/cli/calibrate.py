"""`llamadecide calibrate` and `llamadecide compare`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from llamadecide.calibration.config import RunConfig
from llamadecide.cli.common import fail
from llamadecide.cli.flags import SCORING_SETTINGS, config_flags, settings_flags
from llamadecide.errors import LlamaDecideError
from llamadecide.settings import Settings

# Arguments `calibrate`, `plan` and `simulate` share that set no RunConfig field.
LabelledFileArgument = Annotated[Path, typer.Argument(help="Labelled file: CSV, TSV or JSONL")]
TaskOption = Annotated[str, typer.Option("--task", help="Task file (YAML or JSON), or a packaged task name")]
TextColumnOption = Annotated[
    str, typer.Option("--text-column", help="Column (name, or index for headerless files) holding the text")
]
LabelColumnOption = Annotated[str, typer.Option("--label-column", help="Column holding the gold label")]
# The RunConfig fields of a labelled file's split, and of what a threshold guarantees and is
# certified on: every command that certifies takes the second, those that split a file the first.
SPLIT_FLAGS = ("calibration_size", "test_size", "seed")
GUARANTEE_FLAGS = ("target_precision", "confidence_level", "certify_share", "certify_tilt", "cross_fit")
# The RunConfig fields a calibration run takes as flags.
RUN_FLAGS = (
    *SPLIT_FLAGS,
    *GUARANTEE_FLAGS,
    "conformal_alpha",
    "compare_modes",
    "rotations",
    "prior_correction",
    "head",
    "lexical",
    "head_depth",
    "shots",
    "prompt_formats",
    "shots_per_class",
    "row_budget",
    "profile_name",
)


@config_flags(RunConfig, *RUN_FLAGS, panel="Calibration")
@settings_flags(*SCORING_SETTINGS)
def calibrate_command(
    task: TaskOption,
    settings: Settings,
    run: dict,
    data: Annotated[
        Optional[Path], typer.Argument(help="Labelled file: CSV, TSV or JSONL (optional with --labels)")
    ] = None,
    text_column: TextColumnOption = "text",
    label_column: LabelColumnOption = "label",
    labels: Annotated[
        Optional[str],
        typer.Option(
            "--labels",
            help="A label store (SQLite file or s3://bucket/prefix): its labels of the task train, those of known "
            "chance certify (escalations, audits, random draws); with DATA, beside the file's. Without --test-size "
            "the figures are measured on the items held out to certify",
        ),
    ] = None,
    label_profile: Annotated[
        Optional[str],
        typer.Option("--label-profile", help="With --labels: only the labels of decisions served with this profile"),
    ] = None,
    parent: Annotated[
        Optional[Path],
        typer.Option(
            "--parent",
            help="The profile this run refits (a profile file or calibrate --out folder): the new profile is its next "
            "version, named after it, and is compared with what it served",
        ),
    ] = None,
    backend: Annotated[
        Optional[str],
        typer.Option("--backend", help="local (default), an http(s):// server URL, or sagemaker:ENDPOINT[@REGION]"),
    ] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="Key for an http backend")] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory (cache, plots, report, profile)")] = Path(
        "calibration-out"
    ),
) -> None:
    """Measure and calibrate a task on labelled data (a file, a label store, or both); write a report and a
    calibration profile."""
    from llamadecide.calibration.backends import backend_from
    from llamadecide.calibration.data import load_task
    from llamadecide.calibration.profile import PROFILE_FILE
    from llamadecide.calibration.report import print_summary
    from llamadecide.calibration.run import calibrate
    from llamadecide.engine import Engine
    from llamadecide.labels.refit import refit_items

    if data is None and labels is None:
        raise fail("give a labelled file, --labels STORE, or both")
    try:
        the_task = load_task(task)
        found = refit_items(the_task, data, text_column, label_column, labels, label_profile, parent)
        items, fingerprint, lineage = found.items, found.fingerprint, found.lineage
        if labels is not None:
            run = labelled_split(run, len(items))
        config = run_config(out, run, dataset_fingerprint=fingerprint)
        chosen = backend_from(backend, engine_factory=lambda: Engine(settings.engine_config()), api_key=api_key)
        try:
            summary = calibrate(chosen, the_task, items, config, lineage)
        finally:
            getattr(chosen, "close", lambda: None)()
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    print_summary(summary)
    written = summary["profile"]["file"]
    typer.echo(f"wrote {out}/report.html, {out}/summary.json, {out}/{written}")
    if written != PROFILE_FILE:
        typer.echo(
            f"version {summary['profile']['version']} certifies no threshold at precision "
            f"{summary['threshold']['target']}: its parent stays served; rename {out}/{written} to {PROFILE_FILE} "
            "to serve it anyway (every decision would go to review)"
        )


def labelled_split(run: dict, n: int) -> dict:
    """With a label store, every item is calibration unless a test part is asked for (without one,
    measured on the items held out to certify)."""
    test = run.get("test_size") or 0
    return {**run, "test_size": test, "calibration_size": run.get("calibration_size") or n - test}


def run_config(out: Path, run: dict, **computed) -> RunConfig:
    """The run's configuration from its flags, prompt formats checked before any model loads."""
    from llamadecide.decisions.prompt import check_prompt_format

    if "prompt_formats" in run:
        run = {**run, "prompt_formats": tuple(check_prompt_format(name) for name in run["prompt_formats"])}
    return RunConfig(out_dir=out, **run, **computed)


def compare_command(
    a: Annotated[Path, typer.Argument(help="Probability log, predictions.jsonl or calibration output directory")],
    b: Annotated[Path, typer.Argument(help="The same, from the other model version")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    html: Annotated[Optional[Path], typer.Option("--html", help="Also write an HTML report here")] = None,
) -> None:
    """Agreement, flip rate, KL divergence and accuracy/ECE change between two runs."""
    from llamadecide.calibration.compare import compare, read_records, write_html

    try:
        result = compare(read_records(a), read_records(b))
    except (LlamaDecideError, OSError, KeyError, json.JSONDecodeError) as exc:
        raise fail(getattr(exc, "message", str(exc))) from exc
    if html:
        write_html(result, html, str(a), str(b))
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    table = Table(title=f"{a} vs {b}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key in (
        "matched",
        "agreement",
        "flip_rate",
        "mean_kl_a_b",
        "accuracy_a",
        "accuracy_b",
        "accuracy_change",
        "ece_a",
        "ece_b",
        "ece_change",
    ):
        if key in result:
            value = result[key]
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console = Console()
    console.print(table)
    for flip in result["flips"][:10]:
        console.print(
            f"  {flip['key']}: {flip['a']} ({flip['p_a']:.2f}) -> {flip['b']} ({flip['p_b']:.2f})"
            + (f", label {flip['label']}" if flip["label"] is not None else "")
        )
