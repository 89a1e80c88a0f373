"""The engine's settings (no llama.cpp here). Every field but the model's path and chat template is
the setting of the same name (`settings.Settings`, where each is declared with its default and
meaning); `Settings.engine_config()` is the one place an `EngineConfig` is made, so the two cannot
disagree on a default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EngineConfig:
    model_path: Path
    chat_template: str | None  # Jinja source, or a built-in name (chatml, gemma), overriding the GGUF's
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_threads: int | None
    n_threads_batch: int | None
    n_gpu_layers: int
    n_seq_max: int
    pinned_prefixes: int
    pinned_cells: int
    call_cost_rows: int
    seed: int
    flash_attn: bool
    deterministic: bool
    no_mmap: bool
    repack: bool
    hidden_tap: bool
    verbose: bool
