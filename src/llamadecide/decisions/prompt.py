"""The versioned prompt format. Changing any text here changes every probability: bump
PROMPT_FORMAT_VERSION, since calibration profiles are bound to it.

Layout (llamadecide-1): a fixed system instruction; one user turn holding the state first and
the question after it; the assistant turn opened by the model's chat template. The state comes
first so that several questions about one state share its evaluated KV prefix.

Demonstrations (k-shot, chosen by calibration from labelled items) are earlier exchanges in the
same layout, each a user turn with its input and the question and an assistant turn with its
answer, placed after the system instruction: every item asked with the same demonstrations shares
their evaluated KV prefix. Without demonstrations the prompt is unchanged.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from llamadecide.decisions.questions import Question
from llamadecide.errors import InvalidRequestError

PROMPT_FORMAT_VERSION = "llamadecide-1"

SYSTEM_PROMPT = (
    "You are a careful classifier. Read the input, then answer the question about it with "
    "exactly one of the allowed answers, written exactly as listed, and nothing else."
)


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


def question_block(question: Question) -> str:
    answers = question.answer_texts()
    lines = [f"Question: {question.instructions.strip()}"]
    if question.type == "predicate":
        lines.append("Answer yes if the statement or question holds for the input, no otherwise.")
    elif question.type == "score":
        lines.append("The levels are ordered from lowest to highest.")
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
    lines.append("Answer:" if question.mode == "text" else "Answer with the label only:")
    return "\n".join(lines)


def build_messages(state_text: str, question: Question,
                   demonstrations: Sequence[tuple[str, str]] = ()) -> list[dict[str, str]]:
    """The chat for one question about one state; `demonstrations` are (input text, answer text)
    exchanges shown before it."""
    block = question_block(question)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for text, answer in demonstrations:
        messages.append({"role": "user", "content": f"Input:\n{text}\n\n{block}"})
        messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": f"Input:\n{state_text}\n\n{block}"})
    return messages
