"""`llamadecide models`: the bundled models, their size, licence and install state."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from llamadecide.cli.common import fail, wide_console
from llamadecide.engine import model_files
from llamadecide.errors import LlamaDecideError


def models_command(
    assemble: Annotated[Optional[str], typer.Option("--assemble", help="Assemble (and verify) this model now")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
) -> None:
    """List the bundled models (the default is marked) or assemble one from its installed parts."""
    if assemble:
        try:
            path = model_files.bundled_model_path(assemble)
        except LlamaDecideError as exc:
            raise fail(exc.message) from exc
        typer.echo(str(path))
        return
    default = model_files.default_bundled_model()
    rows = []
    for model in model_files.BUNDLED.values():
        rows.append(
            {
                "name": model.name,
                "default": model.name == default,
                "title": model.title,
                "kind": model.kind,
                "size_bytes": model.size or None,
                "licence": model.licence,
                "install": model.install,
                "state": model_files.install_state(model.name),
                "note": model.note,
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="Bundled models")
    for column in ("name", "kind", "size", "licence", "state", "install with"):
        table.add_column(column)
    for row in rows:
        size = f"{row['size_bytes'] / 2**20:.0f} MiB" if row["size_bytes"] else "-"
        name = row["name"] + (" (default)" if row["default"] else "")
        table.add_row(
            *(escape(cell) for cell in (name, row["kind"], size, row["licence"], row["state"], row["install"]))
        )
    wide_console(160).print(table)
