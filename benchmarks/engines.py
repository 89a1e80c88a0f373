"""An engine for a benchmark, configured as the settings configure every engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llamadecide.engine import Engine
from llamadecide.settings import Settings


def engine_for(model: str | Path | None, **settings: Any) -> Engine:
    """The engine for a model (a path, a bundled name, or None: the default) with these settings
    changed; settings given as None keep their value from the environment or default."""
    given = {name: value for name, value in settings.items() if value is not None}
    return Engine(Settings(model=None if model is None else str(model), **given).engine_config())
