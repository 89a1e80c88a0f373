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
ModelOption = Annotated[Optional[str], typer.Option("--model", "-m", help=f"GGUF file, directory or bundled model name (default: /opt/ml/model's GGUF, else {_DEFAULT}; see `llamadecide models`)")]
CtxOption = Annotated[Optional[int], typer.Option("--n-ctx", help="Context size in tokens")]
ThreadsOption = Annotated[Optional[int], typer.Option("--threads", "-t", help="CPU threads")]
GpuLayersOption = Annotated[Optional[int], typer.Option("--n-gpu-layers", "-ngl", help="Layers on the GPU (-1: all)")]


def settings_from(**overrides: Any) -> Settings:
    """Settings from the environment, with the flags the user actually passed on top."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def run_server(settings: Settings, *, log_level: str = "info", **uvicorn_options: Any) -> int:
    """Serve until stopped; the exit status is 1, with the one-line reason on stderr, when the model
    cannot load (checked before listening where the file alone tells, else as soon as loading fails),
    so a container or a supervisor sees the failure at once."""
    import uvicorn

    from llamadecide.engine.model_files import gguf_problem
    from llamadecide.errors import ModelLoadError
    from llamadecide.server import create_app

    try:
        problem = gguf_problem(settings.model_path())
    except (ModelLoadError, OSError) as exc:
        problem = str(exc)
    if problem is not None:
        typer.echo(f"error: the model cannot load: {problem}", err=True)
        return 1
    server: uvicorn.Server | None = None

    def stop(_reason: str) -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_load_error=stop)
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                                           access_log=False, **uvicorn_options))
    server.run()
    if app.state.runtime.load_error:
        typer.echo(f"error: the model cannot load: {app.state.runtime.load_error}", err=True)
        return 1
    return 0


def fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)
