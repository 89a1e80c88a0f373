"""`llamadecide serve`: the HTTP server."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

from llamadecide.cli.common import (
    CtxOption,
    GpuLayersOption,
    ModelOption,
    ThreadsOption,
    fail,
    setting_help,
    settings_from,
)


def serve_command(
    model: ModelOption = None,
    host: Annotated[Optional[str], typer.Option("--host", help=setting_help("host"))] = None,
    port: Annotated[Optional[int], typer.Option("--port", "-p", help=setting_help("port"))] = None,
    api_key: Annotated[
        Optional[str],
        typer.Option(
            "--api-key",
            help="Require Authorization: Bearer KEY on /v1 routes and /invocations (visible in `ps`: prefer "
            "--api-key-file or LLAMADECIDE_API_KEY)",
            envvar=None,
        ),
    ] = None,
    api_key_file: Annotated[
        Optional[Path], typer.Option("--api-key-file", help="Read the API key from this file (first line)")
    ] = None,
    queue_size: Annotated[
        Optional[int],
        typer.Option("--queue-size", min=1, help=setting_help("queue_size")),
    ] = None,
    n_ctx: CtxOption = None,
    threads: ThreadsOption = None,
    n_gpu_layers: GpuLayersOption = None,
    probability_log: Annotated[
        Optional[str], typer.Option("--probability-log", help=setting_help("probability_log"))
    ] = None,
    profiles_dir: Annotated[Optional[str], typer.Option("--profiles-dir", help=setting_help("profiles_dir"))] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning, error")] = "info",
) -> None:
    """Serve OpenAI-compatible chat, /v1/decisions, /v1/systemone and the SageMaker routes."""
    if api_key_file is not None:
        try:
            api_key = api_key_file.read_text(encoding="utf-8").splitlines()[0].strip()
        except (OSError, IndexError):
            raise fail(f"cannot read an API key from {api_key_file}") from None
    settings = settings_from(
        model=model,
        host=host,
        port=port,
        api_key=api_key,
        n_ctx=n_ctx,
        n_threads=threads,
        n_gpu_layers=n_gpu_layers,
        probability_log=probability_log,
        profiles_dir=profiles_dir,
        queue_size=queue_size,
    )
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from llamadecide.server.runner import run_server

    code = run_server(settings, log_level=log_level)
    if code:
        raise typer.Exit(code)
