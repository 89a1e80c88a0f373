"""What the verbs share besides their flags (`cli/flags.py`): how a refusal is said, wide tables."""

from __future__ import annotations

import typer


def wide_console(minimum: int):
    """A rich console at least `minimum` columns wide, so tables keep whole names and commands in a
    pipe or a narrow terminal (where rich would fall back to 80 columns and cut them)."""
    from rich.console import Console

    return Console(width=max(Console().width, minimum))


def fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)
