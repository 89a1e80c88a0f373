"""What one calibration run does (`calibration.run.calibrate`), declared once: the CLI's flags take
their defaults from here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamadecide.decisions.prompt import INPUT_LAST, PROMPT_FORMAT_VERSION, QUESTION_FIRST


def head_layer(n_layer: int, depth: float) -> int | None:
    """The block a head reads at `depth` of a model of `n_layer` blocks (None: the final state)."""
    if not 0 < depth <= 1:
        raise ValueError("the head depth is a share of the model's blocks, in (0, 1]")
    if depth == 1:
        return None
    return max(0, min(n_layer - 2, round(depth * n_layer) - 1))


@dataclass(frozen=True)
class RunConfig:
    out_dir: Path
    calibration_size: int | None = None
    test_size: int | None = None
    seed: int = 0
    target_precision: float = 0.95
    confidence_level: float = 0.95
    conformal_alpha: float = 0.1
    compare_modes: bool = False
    rotations: int = 1  # also score with this many option-order rotations (chosen only if better)
    prior_correction: bool = True  # also try content-free prior correction
    head: bool = True  # also try a head on the hidden state (local backend)
    lexical: bool = True  # also try each head fused with a lexical expert on the input text
    # Where heads read the hidden state, as a share of the model's blocks (`head_layer`; 1: the final
    # state). None: the depth measured for the model (`model_files.measured_head_depth`: 0.85 on the
    # default model, a block that does as well as the final state and stops the call there; the
    # final state for models where none was measured or none did as well).
    head_depth: float | None = None
    only_mode: str | None = None  # score in this mode instead of the task's default
    shots: int = 0  # also score with this many labelled demonstrations before each item (local backend)
    # Prompt formats to measure (besides the state-first default, local backend only): each
    # question-first one zero-shot, and with this many demonstrations per class for each number given
    # (many-shot: they live in the shared prefix).
    # The head formats (`llamadecide-4` to `-6`) are measured on request: `-6` ties `-3` on AG News and
    # SST-2 at 0.5 to 0.8 of the rows and loses 1.6 points on Banking77, and measuring it on every
    # item adds about a fifth to a calibration (docs/measurements.md).
    prompt_formats: tuple[str, ...] = (PROMPT_FORMAT_VERSION, QUESTION_FIRST, INPUT_LAST)
    shots_per_class: tuple[int, ...] = (1,)
    # Most evaluated rows (weighted by the pinned prefix they attend to) the scoring may cost, about
    # ten minutes on 2 CPU cores with the default model; over it, the costliest variants are left out
    # and many-option answers scored on a subsample (`budget.plan_scoring`). None: no limit.
    row_budget: int | None = 120_000
    min_answered: int = 100  # over the budget, answers are scored on a subsample of at least this many items
    bins: int = 15
    bootstrap_rounds: int = 200
    profile_name: str | None = None
    dataset_fingerprint: str = ""
    show_progress: bool = True
