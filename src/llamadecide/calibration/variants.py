"""The variants a calibration run puts items to the model in (scoring mode, rotations, k-shot,
prompt format), their scores, and their demonstrations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.decisions.prompt import HEAD_ONLY_FORMATS, PROMPT_FORMAT_VERSION, QUESTION_FIRST_FORMATS
from llamadecide.decisions.scoring import Demonstration, Scoring, route


@dataclass(frozen=True)
class Variant:
    """How items are put to the model: scoring mode and number of option-order rotations."""

    mode: str
    rotations: int = 1
    shots: int = 0  # demonstrations from the labelled part put before each item
    prompt_format: str = PROMPT_FORMAT_VERSION

    def rule(self, demonstrations: tuple[Demonstration, ...] = ()) -> Scoring:
        """The prompt this variant asks in, with the demonstrations shown before every item."""
        return Scoring(rotations=self.rotations, demonstrations=demonstrations, prompt_format=self.prompt_format)

    @property
    def hidden_only(self) -> bool:
        """A prompt format without the options: only a head on its hidden state reads it (no answer is scored)."""
        return self.prompt_format in HEAD_ONLY_FORMATS

    @property
    def label(self) -> str:
        return (
            f"{self.mode} mode"
            + (f", {self.prompt_format}" if self.prompt_format != PROMPT_FORMAT_VERSION else "")
            + (f", {self.rotations} rotations" if self.rotations > 1 else "")
            + (f", {self.shots}-shot" if self.shots else "")
        )


@dataclass
class VariantScores:
    L: np.ndarray  # items x options: log-likelihoods
    lengths: np.ndarray | None  # token counts (local backend)
    hidden: np.ndarray | None  # items x hidden size, at the answer position (local backend)
    content_free: tuple[np.ndarray, np.ndarray | None] | None  # rows on content-free inputs, their lengths
    demonstrations: tuple[Demonstration, ...] = ()  # shown before every item (k-shot variants)
    texts: list[str] | None = None  # every item's input as the model sees it (for a head's lexical expert)
    shown: tuple[int, ...] = ()  # the items shown as demonstrations (question-first: never scored)
    answered: np.ndarray | None = None  # items whose answers were scored (None: every used item)
    has_hidden: np.ndarray | None = None  # items with a hidden state (None: the answered ones)
    hidden_only: bool = False  # no answer scored at all (`Variant.hidden_only`): L holds zeros
    # What serving costs per item, in weighted evaluated rows (`Backend.cost`): (answers, hidden state
    # alone); None where the backend cannot tell (a remote one).
    served_rows: tuple[float, float] | None = None
    hidden_layer: int | None = None  # the block whose output `hidden` is (None: the final state)
    inputs: list[str] | None = None  # every item's input, as a cross-fitted calibrator routes it (`scoring.route`)

    def routes(self, idx: np.ndarray, folds: int) -> np.ndarray:
        """The fold of a cross-fitted calibration that answers each of the items `idx`."""
        if self.inputs is None:
            raise ValueError("cross-fitting routes each item by its input; these scores carry none")
        return np.array([route(self.inputs[i], folds) for i in idx], dtype=int)


def variants_for(task: Task, config: RunConfig, *, demonstrations: bool = True) -> list[Variant]:
    """The default mode first; the other mode with --compare-modes; labels mode with rotations;
    the default mode with demonstrations (k-shot) where the backend can show them."""
    default_mode = config.only_mode or task.question().mode
    modes = [default_mode] + ([m for m in ("text", "labels") if m != default_mode] if config.compare_modes else [])
    found = [Variant(m) for m in modes]
    if config.rotations > 1 and task.type != "score" and "labels" in modes:
        found.append(Variant("labels", min(config.rotations, len(task.options))))
    if config.shots > 0 and demonstrations:
        found.append(Variant(default_mode, shots=config.shots))
    for prompt_format in config.prompt_formats if demonstrations else ():
        if prompt_format in HEAD_ONLY_FORMATS:
            if config.head:
                found.append(Variant(default_mode, prompt_format=prompt_format))
        elif prompt_format in QUESTION_FIRST_FORMATS:
            found.append(Variant(default_mode, prompt_format=prompt_format))
            found.extend(
                Variant(default_mode, shots=n * len(task.options), prompt_format=prompt_format)
                for n in sorted(set(config.shots_per_class))
                if n > 0
            )
    return found


def demonstration_items(scored: dict[Variant, VariantScores]) -> np.ndarray:
    """Items shown as demonstrations in a question-first variant's shared prefix: no variant is
    fitted or measured on them (that variant could not be: they are part of its prompt)."""
    return np.array(
        sorted(
            {
                i
                for variant, data in scored.items()
                if variant.prompt_format in QUESTION_FIRST_FORMATS
                for i in data.shown
            }
        ),
        dtype=int,
    )


def choose_demonstrations(
    items: list[LabelledItem], y: np.ndarray, pool: np.ndarray, shots: int, seed: int = 0
) -> list[int]:
    """`shots` labelled items to show before every question: the classes taken in turn (a seeded
    order), each time a random item of that class, from its shorter half while it lasts (a short
    prefix keeps the prompt cheap), so the answers shown are balanced and interleaved."""
    rng = np.random.default_rng(seed)
    by_class: dict[int, list[int]] = {}
    for i in pool:
        by_class.setdefault(int(y[i]), []).append(int(i))
    for c, members in by_class.items():
        members.sort(key=lambda i: (len(items[i].text), i))
        half = (len(members) + 1) // 2
        by_class[c] = list(rng.permutation(members[:half])) + list(rng.permutation(members[half:]))
    classes = list(rng.permutation(sorted(by_class)))
    chosen: list[int] = []
    while len(chosen) < shots and any(by_class.values()):
        for c in classes:
            if by_class[c] and len(chosen) < shots:
                chosen.append(int(by_class[c].pop(0)))
    return chosen
