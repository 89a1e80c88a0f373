"""Rotated option lists: position bias averaged out by asking a question with its options cyclically
shifted, and demonstrations answered in each rotation's own labels."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from llamadecide.decisions.questions import Question
from llamadecide.decisions.scoring import Demonstration
from llamadecide.errors import InvalidRequestError


def rotation_shifts(question: Question, rotations: int) -> list[int]:
    """Evenly spaced cyclic shifts of the option list, 0 first."""
    k = len(question.options)
    if rotations < 1:
        raise InvalidRequestError("rotations must be at least 1", param="rotations")
    if rotations == 1:
        return [0]
    if question.type == "score":
        raise InvalidRequestError(
            "a score's levels are ordered; rotating them would change their meaning", param="rotations"
        )
    if rotations > k:
        raise InvalidRequestError(f"at most {k} rotations for {k} options, got {rotations}", param="rotations")
    return sorted({(r * k) // rotations for r in range(rotations)})


def rotate(question: Question, shift: int) -> Question:
    if shift == 0:
        return question
    return replace(question, options=question.options[shift:] + question.options[:shift])


def shown(question: Question, demonstrations: Sequence[Demonstration], shift: int) -> list[tuple[str, str]]:
    """The demonstrations as (input, answer text) for the question rotated by `shift`: an option's
    answer text in labels mode is its position's label, so it moves with the rotation."""
    k = len(question.options)
    answers = rotate(question, shift).answer_texts()
    found = []
    for demonstration in demonstrations:
        if not 0 <= demonstration.option < k:
            raise InvalidRequestError(
                f"a demonstration answers option {demonstration.option}; the question has {k} options",
                param="demonstrations",
            )
        if not demonstration.input.strip():
            raise InvalidRequestError("a demonstration's input is empty", param="demonstrations")
        found.append((demonstration.input, answers[(demonstration.option - shift) % k]))
    return found
