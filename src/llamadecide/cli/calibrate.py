"""`llamadecide calibrate` and `llamadecide compare`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from llamadecide.calibration.config import RunConfig
from llamadecide.cli.common import CtxOption, GpuLayersOption, ModelOption, ThreadsOption, fail, settings_from
from llamadecide.errors import LlamaDecideError

DEFAULTS = RunConfig(out_dir=Path("calibration-out"))  # every default below is RunConfig's

# Options `calibrate` and `plan` share, declared once (their defaults stay RunConfig's, at each use).
LabelledFileArgument = Annotated[Path, typer.Argument(help="Labelled file: CSV, TSV or JSONL")]
TextColumnOption = Annotated[
    str, typer.Option("--text-column", help="Column (name, or index for headerless files) holding the text")
]
LabelColumnOption = Annotated[str, typer.Option("--label-column", help="Column holding the gold label")]
CalibrationSizeOption = Annotated[
    Optional[int], typer.Option("--calibration-size", help="Items to fit on (default: a third)")
]
TestSizeOption = Annotated[Optional[int], typer.Option("--test-size", help="Items to measure on (default: the rest)")]
SeedOption = Annotated[int, typer.Option("--seed", help="Split seed")]
TargetPrecisionOption = Annotated[
    float, typer.Option("--target-precision", help="Precision the automatically handled answers must reach")
]
ConfidenceOption = Annotated[float, typer.Option("--confidence", help="Confidence of that guarantee")]


def calibrate_command(
    data: LabelledFileArgument,
    task: Annotated[Path, typer.Option("--task", help="Task file (YAML or JSON): question, options, label mapping")],
    text_column: TextColumnOption = "text",
    label_column: LabelColumnOption = "label",
    backend: Annotated[
        Optional[str],
        typer.Option("--backend", help="local (default), an http(s):// server URL, or sagemaker:ENDPOINT[@REGION]"),
    ] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="Key for an http backend")] = None,
    calibration_size: CalibrationSizeOption = DEFAULTS.calibration_size,
    test_size: TestSizeOption = DEFAULTS.test_size,
    seed: SeedOption = DEFAULTS.seed,
    target_precision: TargetPrecisionOption = DEFAULTS.target_precision,
    confidence_level: ConfidenceOption = DEFAULTS.confidence_level,
    conformal_alpha: Annotated[
        float, typer.Option("--conformal-alpha", help="Miscoverage of conformal sets")
    ] = DEFAULTS.conformal_alpha,
    compare_modes: Annotated[
        bool, typer.Option("--compare-modes", help="Also score in the other mode (text vs labels) and keep the better")
    ] = DEFAULTS.compare_modes,
    rotations: Annotated[
        int,
        typer.Option(
            "--rotations",
            help="Also score labels mode with this many option-order rotations (with --compare-modes or a labels task)",
        ),
    ] = DEFAULTS.rotations,
    prior_correction: Annotated[
        bool, typer.Option("--prior/--no-prior", help="Also try content-free prior correction")
    ] = DEFAULTS.prior_correction,
    head: Annotated[
        bool, typer.Option("--head/--no-head", help="Also try a head on the hidden state (local backend)")
    ] = DEFAULTS.head,
    lexical: Annotated[
        bool,
        typer.Option(
            "--lexical/--no-lexical",
            help="Also try heads fused with a lexical expert (character n-gram TF-IDF of the input)",
        ),
    ] = DEFAULTS.lexical,
    head_depth: Annotated[
        Optional[float],
        typer.Option(
            "--head-depth",
            min=0.05,
            max=1.0,
            help="Where heads read the hidden state, as a share of the model's blocks (1: the final state); "
            "a decision then runs the model only that deep (default: the depth measured for the model, "
            "0.85 on the default model, else 1)",
        ),
    ] = DEFAULTS.head_depth,
    shots: Annotated[
        int,
        typer.Option(
            "--shots",
            min=0,
            help="Also try showing this many labelled calibration items "
            "before each question (k-shot, local backend; scores every item once more)",
        ),
    ] = DEFAULTS.shots,
    prompt_formats: Annotated[
        Optional[list[str]],
        typer.Option(
            "--prompt-format",
            help="Prompt formats to compare (repeat): llamadecide-1 (state first), llamadecide-2 and "
            "llamadecide-3 (question first: the question is evaluated once per server, not per request), "
            "llamadecide-4 to llamadecide-6 (a head's prompt, answering nothing; hidden states only); "
            f"local backend (default: {', '.join(DEFAULTS.prompt_formats)})",
        ),
    ] = None,
    layout_alias: Annotated[
        Optional[list[str]], typer.Option("--layout", hidden=True, help="The old spelling of --prompt-format")
    ] = None,
    shots_per_class: Annotated[
        list[int],
        typer.Option(
            "--shots-per-class",
            min=0,
            help="Question-first many-shot: this many labelled calibration items per class in "
            "the shared prefix (repeat to try several; 0: zero-shot only); the items "
            "shown are left out of fitting and measuring",
        ),
    ] = list(DEFAULTS.shots_per_class),
    row_budget: Annotated[
        int,
        typer.Option(
            "--row-budget",
            min=0,
            help="Most evaluated rows the scoring may cost (120,000: about 10 minutes on 2 CPU cores with the default "
            "model); over it the costliest variants are left out and many-option answers scored on a subsample, all "
            "said in the report. 0: no limit",
        ),
    ] = DEFAULTS.row_budget or 0,
    out: Annotated[Path, typer.Option("--out", help="Output directory (cache, plots, report, profile)")] = Path(
        "calibration-out"
    ),
    profile_name: Annotated[
        Optional[str], typer.Option("--profile-name", help="Name of the written profile (default: the task's)")
    ] = None,
    model: ModelOption = None,
    n_ctx: CtxOption = None,
    threads: ThreadsOption = None,
    n_gpu_layers: GpuLayersOption = None,
) -> None:
    """Measure and calibrate a task on labelled data; write a report and a calibration profile."""
    from llamadecide.calibration.backends import backend_from
    from llamadecide.calibration.data import file_fingerprint, load_task, read_labelled
    from llamadecide.calibration.report import print_summary
    from llamadecide.calibration.run import calibrate
    from llamadecide.decisions.prompt import check_prompt_format
    from llamadecide.engine import Engine

    formats = [*(prompt_formats or []), *(layout_alias or [])] or list(DEFAULTS.prompt_formats)
    try:
        the_task = load_task(task)
        items = read_labelled(data, text_column=text_column, label_column=label_column)
        settings = settings_from(model=model, n_ctx=n_ctx, n_threads=threads, n_gpu_layers=n_gpu_layers)
        chosen = backend_from(backend, engine_factory=lambda: Engine(settings.engine_config()), api_key=api_key)
        config = RunConfig(
            out_dir=out,
            calibration_size=calibration_size,
            test_size=test_size,
            seed=seed,
            target_precision=target_precision,
            confidence_level=confidence_level,
            conformal_alpha=conformal_alpha,
            compare_modes=compare_modes,
            profile_name=profile_name,
            rotations=rotations,
            prior_correction=prior_correction,
            head=head,
            lexical=lexical,
            head_depth=head_depth,
            shots=shots,
            prompt_formats=tuple(check_prompt_format(name) for name in formats),
            shots_per_class=tuple(shots_per_class),
            row_budget=row_budget or None,
            dataset_fingerprint=file_fingerprint(data, text_column, label_column),
        )
        try:
            summary = calibrate(chosen, the_task, items, config)
        finally:
            getattr(chosen, "close", lambda: None)()
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    print_summary(summary)
    typer.echo(f"wrote {out}/report.html, {out}/summary.json, {out}/profile.json")


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
