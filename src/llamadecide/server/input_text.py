"""A decision request's input and descriptions as the text the model reads: OpenAI Decisions
`input` (a string, user messages, or a conversation with tool items) and System One content."""

from __future__ import annotations

import json
from typing import Any

from llamadecide.errors import InvalidRequestError, UnsupportedError
from llamadecide.server.protocol import decisions as oa


def content_text(content: Any) -> str:
    """System One content: text as is, JSON values as JSON text."""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _part_text(part: Any, where: str) -> str:
    if isinstance(part, (oa.InputText, oa.OutputText)):
        return part.text
    if isinstance(part, oa.InputJSON):
        return json.dumps(part.data, ensure_ascii=False, indent=2)
    if isinstance(part, oa.Refusal):
        return f"[refused: {part.refusal}]"
    if isinstance(part, oa.InputImage):
        raise UnsupportedError("image input is not supported: this server runs a text-only model", param=where)
    raise InvalidRequestError(f"unsupported content part {type(part).__name__}", param=where)


def openai_content_text(content: str | list, where: str) -> str:
    """OpenAI message content (a string or parts) as text; `where` names it in a refusal."""
    if isinstance(content, str):
        return content
    return "\n".join(_part_text(part, f"{where}[{j}]") for j, part in enumerate(content))


def render_openai_input(value: str | list) -> str:
    """The `input` of a Decisions request as the text the model reads. A string, or a list of
    user messages, is the plain text (so both spellings give the same prompt); a conversation
    with other roles or tool items becomes a transcript with one labelled block per item."""
    if isinstance(value, str):
        return value
    if all(isinstance(item, oa.Message) and item.role == "user" for item in value):
        return "\n\n".join(openai_content_text(item.content, f"input[{i}].content") for i, item in enumerate(value))
    calls: set[str] = set()
    blocks: list[str] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if isinstance(item, oa.Message):
            blocks.append(f"{item.role}: {openai_content_text(item.content, where + '.content')}")
        elif isinstance(item, (oa.FunctionCall, oa.CustomToolCall)):
            calls.add(item.call_id)
            payload = item.arguments if isinstance(item, oa.FunctionCall) else item.input
            blocks.append(f"tool call {item.name} (id {item.call_id}): {payload}")
        else:
            if item.call_id not in calls:
                raise InvalidRequestError(
                    f"tool output for call id {item.call_id!r} has no matching call before it", param=f"{where}.call_id"
                )
            output = (
                item.output if isinstance(item.output, str) else openai_content_text(item.output, where + ".output")
            )
            blocks.append(f"tool output (id {item.call_id}): {output}")
    return "\n\n".join(blocks)
