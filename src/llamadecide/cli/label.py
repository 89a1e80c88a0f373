"""`llamadecide label`: label an unlabelled file from nothing, the items drawn for the most gain per
label, on the review page (`labels.labelling`, `server.labelling_app`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llamadecide.calibration.config import RunConfig
from llamadecide.cli.calibrate import GUARANTEE_FLAGS, TaskOption, TextColumnOption
from llamadecide.cli.common import fail
from llamadecide.cli.flags import SCORING_SETTINGS, config_flags, settings_flags
from llamadecide.errors import LlamaDecideError
from llamadecide.labels.active import DrawRule
from llamadecide.settings import Settings


@config_flags(
    RunConfig,
    "seed",
    *GUARANTEE_FLAGS,
    "head",
    "lexical",
    "head_depth",
    "prompt_formats",
    "row_budget",
)
@config_flags(DrawRule, "size", "floor", "sure", panel="Drawing", into="rule")
@settings_flags(*SCORING_SETTINGS)
def label_command(
    data: Annotated[Path, typer.Argument(help="Unlabelled file: CSV, TSV or JSON Lines")],
    task: TaskOption,
    store: Annotated[str, typer.Option("--store", help="The label store: a SQLite file (or s3://bucket/prefix)")],
    settings: Settings,
    run: dict,
    rule: dict,
    text_column: TextColumnOption = "text",
    id_column: Annotated[
        Optional[str], typer.Option("--id-column", help="Column or field of each item's id (default: its line)")
    ] = None,
    profile: Annotated[
        Optional[Path],
        typer.Option("--profile", help="Draw by this profile's answers before the first refit (default: zero-shot)"),
    ] = None,
    refit_every: Annotated[int, typer.Option("--refit-every", min=1, help="Labels between background refits")] = 20,
    until_auto_share: Annotated[
        Optional[float],
        typer.Option("--until-auto-share", min=0.0, max=1.0, help="Stop once a refit certifies this share of the pool"),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address the page listens on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port the page listens on")] = 8001,
) -> None:
    """Serve the review page over an unlabelled file: items drawn for the most gain per label, each with
    its recorded chance (so every label certifies), refitted in the background; resumable from the store."""
    import numpy as np
    import uvicorn

    from llamadecide.calibration.backends import LocalBackend
    from llamadecide.calibration.data import file_fingerprint, load_task
    from llamadecide.cli.calibrate import run_config
    from llamadecide.engine import Engine
    from llamadecide.labels.labelling import LabellingConfig, LabellingSession, initial_probabilities, pool_items
    from llamadecide.labels.replay import score_pool
    from llamadecide.labels.store import open_store
    from llamadecide.server.labelling_app import create_labelling_app

    try:
        the_task = load_task(task)
        pool = pool_items(data, text_column, id_column)
        fingerprint = file_fingerprint(data, text_column, id_column or "")
        config = LabellingConfig(
            run=run_config(Path(f"{store}.runs"), {**run, "show_progress": True}, dataset_fingerprint=fingerprint),
            rule=DrawRule(**rule),
            refit_every=refit_every,
            until_auto_share=until_auto_share,
            pool_name=fingerprint[:12],
        )
        engine = Engine(settings.engine_config())
        cache = Path(f"{store}.cache.sqlite") if not store.startswith("s3://") else Path("label-cache.sqlite")
        scored = score_pool(LocalBackend(engine), the_task, pool, np.arange(len(pool)), config.run, cache)
        initial = initial_probabilities(engine, the_task, pool, scored, profile)
        held = open_store(store)
    except LlamaDecideError as exc:
        raise fail(exc.message) from exc
    session = LabellingSession(
        the_task, pool, scored, held, config, initial=initial, seed=config.run.seed + len(held.labelled())
    )
    session.fill_queue()
    server = uvicorn.Server(uvicorn.Config(create_labelling_app(session), host=host, port=port, log_level="warning"))
    typer.echo(f"label {len(pool)} items at http://{host}:{port}/review (labels kept in {store}; Ctrl-C stops)")
    session.on_done = lambda: setattr(server, "should_exit", True)
    try:
        server.run()
    finally:
        held.close()
        engine.close()
    status = session.status()
    typer.echo(
        f"{status['labels']} labels in {store}; certified automatic share "
        + ("none yet" if status["certified_auto_share"] is None else f"{status['certified_auto_share']:.1%}")
        + f" at precision {status['target_precision']}"
    )
