"""Options shared by the verbs that load a model, turned into Settings."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from llamadecide.engine.model_files import ModelLocations
from llamadecide.settings import Settings

# The help names the default in force (LLAMADECIDE_DEFAULT_MODEL changes it; a bad value is
# reported when a model is loaded, not here).
_DEFAULT = ModelLocations().default_model
ModelOption = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help=f"GGUF file, directory or bundled model name (default: /opt/ml/model's GGUF, else "
        f"{_DEFAULT}; see `llamadecide models`)",
    ),
]


def setting_help(name: str) -> str:
    """A flag's help from the setting it sets: the one description, its default and its variable."""
    field = Settings.model_fields[name]
    default = "" if field.default is None else f"default {field.default}; "
    return f"{field.description} ({default}LLAMADECIDE_{name.upper()})"


CtxOption = Annotated[Optional[int], typer.Option("--n-ctx", help=setting_help("n_ctx"))]
ThreadsOption = Annotated[Optional[int], typer.Option("--threads", "-t", help=setting_help("n_threads"))]
GpuLayersOption = Annotated[Optional[int], typer.Option("--n-gpu-layers", "-ngl", help=setting_help("n_gpu_layers"))]


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
