"""The versioned prompt formats. Changing any text here changes every probability: add a new
version instead, since calibration profiles are bound to the format they were fitted with.

`llamadecide-1` (state first): a fixed system instruction; one user turn holding the state first
and the question after it; the assistant turn opened by the model's chat template. Several
questions about one state share the state's evaluated KV prefix. Demonstrations (k-shot) are
earlier exchanges in the same prompt_format, each repeating the question, placed after the system
instruction.

`llamadecide-2` and `llamadecide-3` (question first): the system instruction and the question block
(instructions and every allowed answer, with descriptions) open the conversation, with
demonstrations as earlier `input -> answer` exchanges; only the last user turn depends on the
request. Every request asking the same question shares that prefix (the engine pins it), so a
decision pays for its last turn, not for the question block. In `llamadecide-2` that turn is the
input followed by the allowed answers' names (what the model reads last before answering: without
it, zero-shot accuracy falls by 10 to 25 points on the default model); in `llamadecide-3` it is the
input and the question's instructions only, the cheapest turn for questions with many options, whose
accuracy comes from demonstrations in the prefix. Demonstrations take that short turn in both
formats (with the names recapped in each, a many-shot prefix would grow with options x
demonstrations), so both share one pinned prefix.

`llamadecide-4` and `llamadecide-5` are for a head on the hidden state alone, which learns the
options from labels and reads no answer, so its prompt need not list them. `llamadecide-4` is
`llamadecide-3` without the allowed answers (the question's instructions only, a pinned prefix of a
few dozen tokens instead of one that grows with the options); `llamadecide-5` is the input alone
after a fixed system text, the same prompt for every question on the model, so several such heads
about one input read one hidden state. `llamadecide-6` keeps `llamadecide-3`'s pinned prefix (the
question with every allowed answer) and sends the input alone after it, as the prefix announces
("Each of my next messages is one input"): the question's context at the rows of `llamadecide-5`.
Their answers are never scored (`HEAD_ONLY_FORMATS`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llamadecide.decisions.questions import Question
from llamadecide.errors import InvalidRequestError

PROMPT_FORMAT_VERSION = "llamadecide-1"  # the default prompt format
QUESTION_FIRST = "llamadecide-2"  # question first, the answers' names after the input
INPUT_LAST = "llamadecide-3"  # question first, the input and the instructions only after it
INSTRUCTIONS_ONLY = "llamadecide-4"  # llamadecide-3 without the allowed answers (a head's prompt)
INPUT_ONLY = "llamadecide-5"  # the input alone, the same prompt for every question (a head's prompt)
BARE_INPUT_LAST = "llamadecide-6"  # llamadecide-3's pinned question, then the input alone (a head's prompt)
QUESTION_FIRST_FORMATS = (QUESTION_FIRST, INPUT_LAST, INSTRUCTIONS_ONLY, BARE_INPUT_LAST)
# Prompts whose answers are never scored (no answer prompt after the input): a head on the hidden state alone.
HEAD_ONLY_FORMATS = (INSTRUCTIONS_ONLY, INPUT_ONLY, BARE_INPUT_LAST)
PROMPT_FORMATS = (PROMPT_FORMAT_VERSION, QUESTION_FIRST, INPUT_LAST, INSTRUCTIONS_ONLY, INPUT_ONLY, BARE_INPUT_LAST)

SYSTEM_PROMPT = (
    "You are a careful classifier. Read the input, then answer the question about it with "
    "exactly one of the allowed answers, written exactly as listed, and nothing else."
)
INPUT_ONLY_SYSTEM_PROMPT = "You are a careful classifier. Read the input; questions about it follow."


def render_state(state: Any) -> str:
    """The state as the model sees it: strings verbatim, anything else as JSON text."""
    if isinstance(state, str):
        text = state
    elif state is None:
        text = ""
    else:
        text = json.dumps(state, ensure_ascii=False, indent=2)
    if not text.strip():
        raise InvalidRequestError("the state (input) is empty; there is nothing to decide about", param="input")
    return text


def check_prompt_format(prompt_format: str) -> str:
    if prompt_format not in PROMPT_FORMATS:
        raise InvalidRequestError(
            f"unknown prompt format {prompt_format!r}; known: {', '.join(PROMPT_FORMATS)}", param="prompt_format"
        )
    return prompt_format


def question_block(question: Question, *, closing: bool = True, options: bool = True) -> str:
    answers = question.answer_texts()
    lines = [f"Question: {question.instructions.strip()}"]
    if question.type == "predicate":
        lines.append("Answer yes if the statement or question holds for the input, no otherwise.")
    elif question.type == "score":
        lines.append("The levels are ordered from lowest to highest.")
    if not options:
        return "\n".join(lines + ([answer_prompt(question)] if closing else []))
    lines.append("Allowed answers:")
    for option, answer in zip(question.options, answers):
        described = option.description.strip() if option.description else ""
        if question.mode == "labels":
            shown = option.text if not described else f"{option.text}: {described}"
            if shown == answer:
                lines.append(f"- {answer}")
            else:
                lines.append(f"- {answer} = {shown}")
        else:
            lines.append(f"- {answer}" + (f" ({described})" if described else ""))
    if closing:
        lines.append(answer_prompt(question))
    return "\n".join(lines)


def answer_prompt(question: Question) -> str:
    return "Answer:" if question.mode == "text" else "Answer with the label only:"


def build_messages(
    state_text: str,
    question: Question,
    demonstrations: Sequence[tuple[str, str]] = (),
    prompt_format: str = PROMPT_FORMAT_VERSION,
) -> list[dict[str, str]]:
    """The chat for one question about one state; `demonstrations` are (input text, answer text)
    exchanges shown before it. Every message but the last is the same for every state."""
    if check_prompt_format(prompt_format) == INPUT_ONLY:
        if demonstrations:
            raise InvalidRequestError(
                f"{INPUT_ONLY!r} shows the input alone: it takes no demonstrations", param="prompt_format"
            )
        return [
            {"role": "system", "content": INPUT_ONLY_SYSTEM_PROMPT},
            {"role": "user", "content": f"Input:\n{state_text}"},
        ]
    if prompt_format in QUESTION_FIRST_FORMATS:
        return _question_first(
            state_text,
            question,
            demonstrations,
            recap_answers=prompt_format == QUESTION_FIRST,
            options=prompt_format != INSTRUCTIONS_ONLY,
            bare=prompt_format == BARE_INPUT_LAST,
        )
    block = question_block(question)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for text, answer in demonstrations:
        messages.append({"role": "user", "content": f"Input:\n{text}\n\n{block}"})
        messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": f"Input:\n{state_text}\n\n{block}"})
    return messages


def _question_first(
    state_text: str,
    question: Question,
    demonstrations: Sequence[tuple[str, str]],
    *,
    recap_answers: bool,
    options: bool = True,
    bare: bool = False,
) -> list[dict[str, str]]:
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": question_block(question, closing=False, options=options) + "\n\n" + SESSION_OPENING,
        },
        {"role": "assistant", "content": SESSION_ACKNOWLEDGEMENT},
    ]
    # Demonstrations take the short turn in both formats: recapping every answer's name in each of
    # them would make a many-shot prefix grow with options x demonstrations (77 x 77 names is over
    # 30,000 tokens). Both formats then share one pinned prefix.
    for text, answer in demonstrations:
        turn = f"Input:\n{text}" if bare else _question_first_turn(text, question, recap_answers=False)
        messages.append({"role": "user", "content": turn})
        messages.append({"role": "assistant", "content": answer})
    turn = f"Input:\n{state_text}" if bare else _question_first_turn(state_text, question, recap_answers)
    messages.append({"role": "user", "content": turn})
    return messages


SESSION_OPENING = "Each of my next messages is one input. Answer the question about it with one allowed answer."
SESSION_ACKNOWLEDGEMENT = "Understood."


def _question_first_turn(text: str, question: Question, recap_answers: bool) -> str:
    if recap_answers:
        return f"Input:\n{text}\n\nAllowed answers: {', '.join(question.answer_texts())}\n{answer_prompt(question)}"
    return f"Input:\n{text}\n\nQuestion: {question.instructions.strip()}\n{answer_prompt(question)}"
