"""Options shared by the verbs that load a model, turned into Settings."""

from __future__ import annotations

import os
from typing import Annotated, Any, Optional

import typer

from llamadecide.engine.model_files import DEFAULT_MODEL
from llamadecide.settings import Settings

# The help names the default in force (LLAMADECIDE_DEFAULT_MODEL changes it; a bad value is
# reported when a model is loaded, not here).
_DEFAULT = os.environ.get("LLAMADECIDE_DEFAULT_MODEL") or DEFAULT_MODEL
ModelOption = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help=f"GGUF file, directory or bundled model name (default: /opt/ml/model's GGUF, else "
        f"{_DEFAULT}; see `llamadecide models`)",
    ),
]
CtxOption = Annotated[Optional[int], typer.Option("--n-ctx", help="Context size in tokens")]
ThreadsOption = Annotated[Optional[int], typer.Option("--threads", "-t", help="CPU threads")]
GpuLayersOption = Annotated[Optional[int], typer.Option("--n-gpu-layers", "-ngl", help="Layers on the GPU (-1: all)")]


def wide_console(minimum: int):
    """A rich console at least `minimum` columns wide, so tables keep whole names and commands in a
    pipe or a narrow terminal (where rich would fall back to 80 columns and cut them)."""
    from rich.console import Console

    return Console(width=max(Console().width, minimum))


def settings_from(**overrides: Any) -> Settings:
    """Settings from the environment, with the flags the user actually passed on top."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)
