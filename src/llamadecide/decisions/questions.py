"""Question types: choice, predicate (yes/no) and score (ordered levels).

Each question reduces to a list of options; an option has the value reported back to the
caller, the text shown to (and expected from) the model, and an optional description.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Union

from llamadecide.errors import InvalidRequestError

OptionValue = Union[str, bool, int]
Mode = Literal["text", "labels"]
QuestionType = Literal["choice", "predicate", "score"]

MAX_OPTIONS = 255
MAX_SCORE_LEVELS = 255


@dataclass(frozen=True)
class Option:
    value: OptionValue
    text: str
    description: str | None = None


@dataclass(frozen=True)
class Question:
    type: QuestionType
    instructions: str
    options: tuple[Option, ...]
    name: str | None = None
    mode: Mode = "text"

    def __post_init__(self) -> None:
        param = f"questions[{self.name}]" if self.name else "questions"
        if not self.instructions or not self.instructions.strip():
            raise InvalidRequestError("a question needs non-empty instructions", param=f"{param}.instructions")
        if self.mode not in ("text", "labels"):
            raise InvalidRequestError(f"unknown scoring mode {self.mode!r}; use 'text' or 'labels'", param=param)
        if len(self.options) < 2:
            raise InvalidRequestError(
                f"a {self.type} question needs at least 2 options, got {len(self.options)}", param=f"{param}.options"
            )
        if len(self.options) > MAX_OPTIONS:
            raise InvalidRequestError(
                f"a question may have at most {MAX_OPTIONS} options, got {len(self.options)}", param=f"{param}.options"
            )
        seen_values: set[tuple[type, OptionValue]] = set()
        seen_texts: dict[str, tuple[OptionValue, str]] = {}  # text without surrounding whitespace -> (value, text)
        for option in self.options:
            key = (type(option.value), option.value)
            if key in seen_values:
                raise InvalidRequestError(f"duplicate option {option.value!r}", param=f"{param}.options")
            seen_values.add(key)
            if not option.text.strip():
                raise InvalidRequestError("an option's text must not be empty or blank", param=f"{param}.options")
            stripped = option.text.strip()
            if stripped in seen_texts:
                other, other_text = seen_texts[stripped]
                if other_text != option.text:
                    raise InvalidRequestError(
                        f"options {other!r} and {option.value!r} differ only in surrounding whitespace, which the "
                        "model cannot tell apart; rename one",
                        param=f"{param}.options",
                    )
                if self.mode == "text":
                    raise InvalidRequestError(
                        f"options {other!r} and {option.value!r} are both shown to the model as "
                        f"{option.text!r}; rename one or use labels mode",
                        param=f"{param}.options",
                    )
            seen_texts[stripped] = (option.value, option.text)

    def answer_texts(self) -> list[str]:
        """What the model is scored on saying for each option, in option order."""
        if self.mode == "text":
            return [o.text for o in self.options]
        return option_labels(self.type, len(self.options))


def option_labels(kind: QuestionType, count: int) -> list[str]:
    """Short labels for labels mode: digits for ordered levels, A, B, ... Z, AA, AB ... otherwise."""
    if kind == "score":
        return [str(i) for i in range(count)]
    letters = string.ascii_uppercase
    labels = list(letters)
    for first in letters:
        labels.extend(first + second for second in letters)
        if len(labels) >= count:
            break
    return labels[:count]


def _value_text(value: OptionValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def choice(
    instructions: str,
    options: Sequence[OptionValue | Option | tuple[OptionValue, str | None]],
    *,
    name: str | None = None,
    mode: Mode = "text",
) -> Question:
    """A choice among declared values; an item may be a value, (value, description) or an Option.
    Values are shown as plain text (true, 3, billing); when two typed values would read the same
    (True and "true", 1 and "1"), every value is shown as JSON instead (true, "true"), so the
    model can tell them apart and no valid choice list is refused."""
    pairs = [
        (item.value, item.description)
        if isinstance(item, Option)
        else item
        if isinstance(item, tuple)
        else (item, None)
        for item in options
    ]
    plain = [_value_text(value) for value, _ in pairs]
    typed_clash = len(set(plain)) < len(plain) and len({(type(v), v) for v, _ in pairs}) == len(pairs)
    render = (lambda v: json.dumps(v, ensure_ascii=False)) if typed_clash else _value_text
    built: list[Option] = []
    for item, (value, description) in zip(options, pairs):
        if isinstance(item, Option) and not typed_clash:
            built.append(item)
        else:
            built.append(Option(value, render(value), description))
    return Question("choice", instructions, tuple(built), name=name, mode=mode)


def predicate(
    instructions: str,
    *,
    name: str | None = None,
    true_description: str | None = None,
    false_description: str | None = None,
    mode: Mode = "text",
) -> Question:
    """Is the statement true of the input? Answered as the probability of `True`."""
    options = (Option(True, "yes", true_description), Option(False, "no", false_description))
    return Question("predicate", instructions, options, name=name, mode=mode)


def score(
    instructions: str,
    levels: Sequence[str | tuple[str, str | None]],
    *,
    name: str | None = None,
    mode: Mode = "labels",
) -> Question:
    """Ordered levels, lowest first; the answer's value is the expected level index. By default
    the model answers with the level number (labels mode)."""
    if len(levels) > MAX_SCORE_LEVELS:
        raise InvalidRequestError(f"a score may have at most {MAX_SCORE_LEVELS} levels", param="levels")
    built: list[Option] = []
    for index, level in enumerate(levels):
        label, description = level if isinstance(level, tuple) else (level, None)
        built.append(Option(index, label, description))
    return Question("score", instructions, tuple(built), name=name, mode=mode)
