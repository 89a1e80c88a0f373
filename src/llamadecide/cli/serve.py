"""`llamadecide serve`: the HTTP server; every setting is a flag (`cli/flags.py`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

from llamadecide.cli.common import fail
from llamadecide.cli.flags import ENGINE_SETTINGS, SERVER_SETTINGS, settings_flags
from llamadecide.settings import Settings


@settings_flags(*ENGINE_SETTINGS, *SERVER_SETTINGS)
def serve_command(
    settings: Settings,
    api_key_file: Annotated[
        Optional[Path], typer.Option("--api-key-file", help="Read the API key from this file (first line)")
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning, error")] = "info",
) -> None:
    """Serve OpenAI-compatible chat, /v1/decisions, /v1/systemone, labels and reviews, and the SageMaker routes."""
    if api_key_file is not None:
        try:
            key = api_key_file.read_text(encoding="utf-8").splitlines()[0].strip()
        except (OSError, IndexError):
            raise fail(f"cannot read an API key from {api_key_file}") from None
        settings = settings.model_copy(update={"api_key": key})
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from llamadecide.server.runner import run_server

    code = run_server(settings, log_level=log_level)
    if code:
        raise typer.Exit(code)
