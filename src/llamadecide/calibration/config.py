"""What one calibration run does (`calibration.run.calibrate`), declared once: each field's default
and meaning (its `help`) are what the CLI's flags show (`cli/flags.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamadecide.decisions.prompt import INPUT_LAST, PROMPT_FORMAT_VERSION, QUESTION_FIRST
from llamadecide.errors import InvalidRequestError


def head_layer(n_layer: int, depth: float) -> int | None:
    """The block a head reads at `depth` of a model of `n_layer` blocks (None: the final state)."""
    if not 0 < depth <= 1:
        raise ValueError("the head depth is a share of the model's blocks, in (0, 1]")
    if depth == 1:
        return None
    return max(0, min(n_layer - 2, round(depth * n_layer) - 1))


def option(default: Any, help: str, *flags: str, **bounds: float) -> Any:
    """A field with its meaning; `flags` name its CLI flag where the field's name does not make it,
    `bounds` (min, max) what the flag accepts."""
    return field(default=default, metadata={"help": help, "flags": flags, "bounds": bounds})


@dataclass(frozen=True)
class RunConfig:
    out_dir: Path
    calibration_size: int | None = option(None, "Items to fit on (default: a third)")
    test_size: int | None = option(None, "Items to measure on (default: the rest)")
    seed: int = option(0, "Split seed")
    target_precision: float = option(0.95, "Precision the automatically handled answers must reach", min=0.0, max=1.0)
    confidence_level: float = option(0.95, "Confidence of that guarantee", "--confidence", min=0.0, max=1.0)
    certify_share: float = option(
        0.5,
        "Share of the labelled items of known chance held out of choosing and fitting, the threshold then "
        "certified on the served model's own probabilities for them (0: certified out of fold on every item, "
        "which reads optimistic: docs/calibration.md)",
        min=0.0,
        max=0.9,
    )
    # Off by default until measured on the review stream: on the labelling orders (docs/measurements.md
    # "Labelling orders") 0.6 gave accuracy and certified share on Banking77 and AG News, and thresholds
    # as honest as untilted on the same seeds.
    certify_tilt: float = option(
        0.0,
        "How far each item's chance of being held out to certify leans toward the items the model that drew "
        "them was surest of, as a share of the furthest it can lean (0: every item the same chance; items "
        "with no recorded confidence keep the share): the sure items certify, the unsure ones teach "
        "(docs/calibration.md)",
        min=0.0,
        max=0.9,
    )
    cross_fit: int = option(
        0,
        "Serve this many fold calibrations, each decision answered by one chosen by a hash of its input and "
        "each fitted without the labels of the inputs it answers, and certify on every label (0: one "
        "calibration, certified on the held-out share; docs/calibration.md)",
        min=0,
        max=20,
    )
    conformal_alpha: float = option(0.1, "Miscoverage of conformal sets", min=0.0, max=1.0)
    compare_modes: bool = option(False, "Also score in the other mode (text vs labels) and keep the better")
    rotations: int = option(
        1,
        "Also score labels mode with this many option-order rotations (with --compare-modes or a labels task; "
        "chosen only if better)",
        min=1,
    )
    prior_correction: bool = option(True, "Also try content-free prior correction", "--prior/--no-prior")
    head: bool = option(True, "Also try a head on the hidden state (local backend)")
    lexical: bool = option(True, "Also try heads fused with a lexical expert (character n-gram TF-IDF of the input)")
    # The default depth is measured per model (`model_files.measured_head_depth`: 0.85 on the default
    # model, a block that does as well as the final state and stops the call there; the final state
    # for models where none was measured or none did as well).
    head_depth: float | None = option(
        None,
        "Where heads read the hidden state, as a share of the model's blocks (1: the final state); a decision "
        "then runs the model only that deep (default: the depth measured for the model, 0.85 on the default "
        "model, else 1)",
        min=0.05,
        max=1.0,
    )
    only_mode: str | None = None  # score in this mode instead of the task's default (the research benches)
    shots: int = option(
        0,
        "Also try showing this many labelled calibration items before each question (k-shot, local backend; "
        "scores every item once more)",
        min=0,
    )
    # The head formats (`llamadecide-4` to `-6`) are measured on request: `-6` ties `-3` on AG News and
    # SST-2 at 0.5 to 0.8 of the rows and loses 1.6 points on Banking77, and measuring it on every
    # item adds about a fifth to a calibration (docs/measurements.md).
    prompt_formats: tuple[str, ...] = option(
        (PROMPT_FORMAT_VERSION, QUESTION_FIRST, INPUT_LAST),
        "Prompt formats to compare (repeat): llamadecide-1 (state first), llamadecide-2 and llamadecide-3 "
        "(question first: the question is evaluated once per server, not per request), llamadecide-4 to "
        "llamadecide-6 (a head's prompt, answering nothing; hidden states only); local backend",
        "--prompt-format",
    )
    shots_per_class: tuple[int, ...] = option(
        (1,),
        "Question-first many-shot: this many labelled calibration items per class in the shared prefix (repeat "
        "to try several; 0: zero-shot only); the items shown are left out of fitting and measuring",
        min=0,
    )
    row_budget: int = option(
        120_000,
        "Most evaluated rows (weighted by the pinned prefix they attend to) the scoring may cost (120,000: about "
        "10 minutes on 2 CPU cores with the default model); over it the costliest variants are left out and "
        "many-option answers scored on a subsample, all said in the report. 0: no limit",
        min=0,
    )
    min_answered: int = 100  # over the budget, answers are scored on a subsample of at least this many items
    bins: int = 15
    bootstrap_rounds: int = 200
    profile_name: str | None = option(None, "Name of the written profile (default: the task's)")
    dataset_fingerprint: str = ""
    show_progress: bool = True

    def __post_init__(self) -> None:
        if self.cross_fit == 1:
            raise InvalidRequestError("cross-fitting needs two folds or more (0: none)", param="cross_fit")
