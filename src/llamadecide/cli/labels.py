"""`llamadecide labels`: the label store from the command line (A2I's output in, labels out)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from llamadecide.cli.common import fail
from llamadecide.errors import LlamaDecideError

labels_app = typer.Typer(no_args_is_help=True, help="The label store: import A2I's human loops, export labels.")
StoreOption = Annotated[str, typer.Option("--store", help="The label store: a SQLite file or s3://bucket/prefix")]


@labels_app.command("import")
def import_command(
    source: Annotated[str, typer.Argument(help="s3://bucket/prefix holding A2I human loops' output.json files")],
    store: StoreOption,
) -> None:
    """Read the answers of Amazon A2I human loops into the label store (source a2i)."""
    from llamadecide.labels.a2i import import_loops
    from llamadecide.labels.store import open_store

    try:
        held = open_store(store)
        try:
            found = import_loops(source, held)
        finally:
            held.close()
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    typer.echo(f"{found.labels} labels from {found.loops} human loops into {store}")
    for key, why in found.skipped.items():
        typer.echo(f"  skipped {key}: {why}", err=True)


@labels_app.command("export")
def export_command(
    store: StoreOption,
    out: Annotated[Path, typer.Option("--out", help="JSON Lines file: one labelled item a line")],
    profile: Annotated[Optional[str], typer.Option("--profile", help="Only this profile's items")] = None,
) -> None:
    """Write every labelled item with its input, label and how it came to be labelled."""
    from dataclasses import asdict

    from llamadecide.labels.store import open_store

    try:
        held = open_store(store)
        try:
            records = held.labelled(task=profile)
        finally:
            held.close()
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    with out.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps({**asdict(record.item), "label": record.label, "labelled": record.labelled}) + "\n")
    typer.echo(f"wrote {len(records)} labelled items to {out}")
