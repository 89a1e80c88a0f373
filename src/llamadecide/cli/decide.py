"""`llamadecide decide`: one decision on the terminal."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from llamadecide.cli.common import CtxOption, GpuLayersOption, ModelOption, ThreadsOption, fail, settings_from, wide_console
from llamadecide.decisions import Answer, Decider, choice, predicate, score
from llamadecide.engine import Engine
from llamadecide.errors import LlamaDecideError


def decide_command(
    text: Annotated[str, typer.Argument(help="The state to decide about (use - to read standard input)")],
    question: Annotated[str, typer.Option("--question", "-q", help="The question's instructions")],
    option: Annotated[Optional[list[str]], typer.Option("--option", "-o", help="A declared option (repeat); for score questions, the levels lowest first")] = None,
    kind: Annotated[str, typer.Option("--type", help="choice, predicate or score")] = "choice",
    mode: Annotated[Optional[str], typer.Option("--mode", help="text (score the option text) or labels (score A/B/C... or level numbers)")] = None,
    length_normalize: Annotated[bool, typer.Option("--length-normalize", help="Divide each option's log-likelihood by its token count")] = False,
    prior_correction: Annotated[bool, typer.Option("--prior-correction", help="Divide out the model's answer distribution on content-free inputs")] = False,
    rotations: Annotated[int, typer.Option("--rotations", help="Ask with the option list rotated this many times and average (order bias)")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
    model: ModelOption = None,
    n_ctx: CtxOption = None,
    threads: ThreadsOption = None,
    n_gpu_layers: GpuLayersOption = None,
) -> None:
    """Print a probability for every declared option."""
    from llamadecide.decisions import Scoring

    if text == "-":
        text = typer.get_text_stream("stdin").read()
    options = option or []
    try:
        if kind == "choice":
            q = choice(question, options, mode=mode or "text")
        elif kind == "predicate":
            if options:
                raise fail("a predicate has fixed answers (yes/no); drop --option")
            q = predicate(question, mode=mode or "text")
        elif kind == "score":
            q = score(question, options, mode=mode or "labels")
        else:
            raise fail(f"unknown --type {kind!r}; use choice, predicate or score")
        settings = settings_from(model=model, n_ctx=n_ctx, n_threads=threads, n_gpu_layers=n_gpu_layers)
        engine = Engine(settings.engine_config())
        decision = Decider(engine).decide(text, [q], scoring=Scoring(length_normalize=length_normalize, prior_correction=prior_correction, rotations=rotations))
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    answer = decision.answers[0]
    if as_json:
        typer.echo(json.dumps(answer_json(answer, engine.model_name, decision.seconds), indent=2))
    else:
        print_answer(answer, engine.model_name, decision.seconds)


def answer_json(answer: Answer, model_name: str, seconds: float) -> dict:
    payload: dict = {
        "model": model_name,
        "type": answer.question.type,
        "choice": answer.choice,
        "confidence": answer.confidence,
        "label_mass": answer.label_mass,
        "prompt_format": answer.prompt_format,
        "mode": answer.question.mode,
        "probabilities": [
            {"value": o.value, "probability": o.probability, "logprob": o.logprob, "tokens": o.n_tokens}
            for o in answer.options
        ],
        "seconds": seconds,
    }
    if answer.question.type == "score":
        payload["score"] = answer.score
    if answer.question.type == "predicate":
        payload["probability"] = answer.probability
    return payload


def print_answer(answer: Answer, model_name: str, seconds: float) -> None:
    console = wide_console(120)
    table = Table(title=escape(answer.question.instructions), title_justify="left")
    table.add_column("option")
    table.add_column("probability", justify="right")
    table.add_column("", min_width=20)
    table.add_column("log p", justify="right", style="dim")
    table.add_column("tokens", justify="right", style="dim")
    names = {id(o): (declared.text if answer.question.type == "score" else str(o.value))  # a score's level names
             for o, declared in zip(answer.options, answer.question.options)}
    for o in sorted(answer.options, key=lambda o: -o.probability):
        bar = "█" * round(o.probability * 30)
        style = "bold green" if o is answer.top else ""
        table.add_row(escape(names[id(o)]), f"{o.probability:.3f}", bar, f"{o.logprob:.2f}" if o.logprob is not None else "-", str(o.n_tokens), style=style)
    console.print(table)
    extra = f"score {answer.score:.2f}  " if answer.question.type == "score" else ""
    console.print(
        f"{extra}confidence {answer.confidence:.3f}  "
        + (f"label mass {answer.label_mass:.3f}  " if answer.label_mass is not None else "")
        + f"{answer.prompt_format} ({answer.question.mode} mode{_method(answer)})  {model_name}  {seconds * 1000:.0f} ms",
        style="dim",
    )


def _method(answer: Answer) -> str:
    parts = []
    if answer.scoring.prior_correction:
        parts.append("prior-corrected")
    if answer.scoring.rotations > 1:
        parts.append(f"{answer.scoring.rotations} rotations")
    return "".join(f", {p}" for p in parts)
