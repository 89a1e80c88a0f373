"""`llamadecide decide`: one decision on the terminal, or every line of a file (`--data`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from llamadecide.cli.common import fail, wide_console
from llamadecide.cli.flags import SCORING_SETTINGS, settings_flags
from llamadecide.decisions import Answer, Decider, Question, Scoring, choice, predicate, score
from llamadecide.engine import Engine
from llamadecide.errors import LlamaDecideError
from llamadecide.settings import Settings


@settings_flags(*SCORING_SETTINGS)
def decide_command(
    settings: Settings,
    text: Annotated[
        Optional[str], typer.Argument(help="The state to decide about (use - to read standard input)")
    ] = None,
    question: Annotated[Optional[str], typer.Option("--question", "-q", help="The question's instructions")] = None,
    option: Annotated[
        Optional[list[str]],
        typer.Option("--option", "-o", help="A declared option (repeat); for score questions, the levels lowest first"),
    ] = None,
    kind: Annotated[str, typer.Option("--type", help="choice, predicate or score")] = "choice",
    mode: Annotated[
        Optional[str],
        typer.Option("--mode", help="text (score the option text) or labels (score A/B/C... or level numbers)"),
    ] = None,
    length_normalize: Annotated[
        bool, typer.Option("--length-normalize", help="Divide each option's log-likelihood by its token count")
    ] = False,
    prior_correction: Annotated[
        bool,
        typer.Option("--prior-correction", help="Divide out the model's answer distribution on content-free inputs"),
    ] = False,
    rotations: Annotated[
        int,
        typer.Option("--rotations", help="Ask with the option list rotated this many times and average (order bias)"),
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
    data: Annotated[
        Optional[Path], typer.Option("--data", help="Decide every line of this CSV, TSV or JSONL file (needs --out)")
    ] = None,
    out: Annotated[
        Optional[Path],
        typer.Option(
            "--out",
            help="With --data: the JSONL output, one line per input in input order; an interrupted run continues "
            "where it stopped",
        ),
    ] = None,
    profile: Annotated[
        Optional[Path],
        typer.Option(
            "--profile",
            help="Ask the question of a calibration profile (a calibrate --out folder or profile file) and apply it",
        ),
    ] = None,
    task: Annotated[
        Optional[str],
        typer.Option("--task", help="Ask the question of a task file (or a packaged task: agnews, sst2, banking77...)"),
    ] = None,
    text_column: Annotated[
        str,
        typer.Option(
            "--text-column",
            help="With --data: the column (name, or index for headerless files) or JSON field holding the text",
        ),
    ] = "text",
    id_column: Annotated[
        Optional[str],
        typer.Option(
            "--id-column", help="With --data: the column or field holding each input's id (default: its line number)"
        ),
    ] = None,
) -> None:
    """Print a probability for every declared option, or write one for every input of a file."""
    if data is not None:
        return _decide_file(
            data,
            out,
            question,
            settings,
            options=option or [],
            kind=kind,
            mode=mode,
            profile=profile,
            task=task,
            text_column=text_column,
            id_column=id_column,
        )
    if text is None or question is None:
        raise fail("give the text and --question (or --data FILE with --out, --profile or --task)")
    if text == "-":
        text = typer.get_text_stream("stdin").read()
    try:
        q = _question(question, option or [], kind, mode)
        engine = Engine(settings.engine_config())
        decision = Decider(engine).decide(
            text,
            [q],
            scoring=Scoring(length_normalize=length_normalize, prior_correction=prior_correction, rotations=rotations),
        )
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    answer = decision.answers[0]
    if as_json:
        typer.echo(json.dumps(answer_json(answer, engine.model_name, decision.seconds), indent=2))
    else:
        print_answer(answer, engine.model_name, decision.seconds)


def _question(instructions: str, options: list[str], kind: str, mode: str | None) -> Question:
    if kind == "choice":
        return choice(instructions, options, mode=mode or "text")
    if kind == "predicate":
        if options:
            raise fail("a predicate has fixed answers (yes/no); drop --option")
        return predicate(instructions, mode=mode or "text")
    if kind == "score":
        return score(instructions, options, mode=mode or "labels")
    raise fail(f"unknown --type {kind!r}; use choice, predicate or score")


def _decide_file(
    data: Path,
    out: Path | None,
    question: str | None,
    settings: Settings,
    *,
    options: list[str],
    kind: str,
    mode: str | None,
    profile: Path | None,
    task: str | None,
    text_column: str,
    id_column: str | None,
) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from llamadecide.bulk import decide_file, read_inputs
    from llamadecide.calibration.data import load_task
    from llamadecide.calibration.profile import CalibrationProfile, profile_files
    from llamadecide.decisions.prompt import PROMPT_FORMATS

    if out is None:
        raise fail("--data needs --out FILE.jsonl")
    if sum(x is not None for x in (question, profile, task)) != 1:
        raise fail("--data asks one question: give --question (with --option), --profile or --task")
    try:
        inputs = list(read_inputs(data, text_column=text_column, id_column=id_column))
        engine = Engine(settings.engine_config())
        threshold = None
        if profile is not None:
            files = profile_files(profile) if profile.is_dir() else [profile]
            if len(files) != 1:
                raise fail(f"{profile} holds {len(files)} profiles; name one file")
            chosen = CalibrationProfile.load(files[0])
            chosen.check_bound_to(engine.model_sha256, PROMPT_FORMATS)
            q, rule, threshold = chosen.question(), chosen.scoring(), chosen.threshold
        elif task is not None:
            q, rule = load_task(task).question(mode), Scoring()
        else:
            q, rule = _question(question or "", options, kind, mode), Scoring()
        with Progress(
            TextColumn("[bold]deciding"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        ) as progress:
            bar = progress.add_task("decide", total=len(inputs))
            counts = decide_file(
                Decider(engine),
                inputs,
                q,
                rule,
                out,
                threshold=threshold,
                progress=lambda n: progress.advance(bar, n) if n else progress.update(bar, completed=0),
            )
            progress.update(bar, completed=len(inputs))
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    typer.echo(
        f"{counts['decided']} decided, {counts['errors']} errors, {counts['skipped']} already in {out}", err=True
    )


def answer_json(answer: Answer, model_name: str, seconds: float) -> dict:
    from llamadecide.bulk import answer_record

    return {"model": model_name, **answer_record(answer), "seconds": seconds}


def print_answer(answer: Answer, model_name: str, seconds: float) -> None:
    console = wide_console(120)
    table = Table(title=escape(answer.question.instructions), title_justify="left")
    table.add_column("option")
    table.add_column("probability", justify="right")
    table.add_column("", min_width=20)
    table.add_column("log p", justify="right", style="dim")
    table.add_column("tokens", justify="right", style="dim")
    names = {
        id(o): (declared.text if answer.question.type == "score" else str(o.value))  # a score's level names
        for o, declared in zip(answer.options, answer.question.options)
    }
    for o in sorted(answer.options, key=lambda o: -o.probability):
        bar = "█" * round(o.probability * 30)
        style = "bold green" if o is answer.top else ""
        table.add_row(
            escape(names[id(o)]),
            f"{o.probability:.3f}",
            bar,
            f"{o.logprob:.2f}" if o.logprob is not None else "-",
            str(o.n_tokens),
            style=style,
        )
    console.print(table)
    extra = f"score {answer.score:.2f}  " if answer.question.type == "score" else ""
    console.print(
        f"{extra}confidence {answer.confidence:.3f}  "
        + (f"label mass {answer.label_mass:.3f}  " if answer.label_mass is not None else "")
        + f"{answer.prompt_format} ({answer.question.mode} mode{_method(answer)})  {model_name}  {seconds * 1000:.0f} "
        f"ms",
        style="dim",
    )


def _method(answer: Answer) -> str:
    parts = []
    if answer.scoring.prior_correction:
        parts.append("prior-corrected")
    if answer.scoring.rotations > 1:
        parts.append(f"{answer.scoring.rotations} rotations")
    return "".join(f", {p}" for p in parts)
