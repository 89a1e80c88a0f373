"""OpenAI Decisions (`POST /v1/decisions`): strict, bounded, discriminated on `type`."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Discriminator, Field, StrictBool, StrictStr, Tag

from llamadecide.server.protocol.common import Extension, Strict


class CacheBreakpoint(Strict):
    mode: Literal["explicit"]


class InputText(Strict):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: Optional[CacheBreakpoint] = None


class InputImage(Strict):
    type: Literal["input_image"]
    image_url: str
    detail: Optional[Literal["low", "high", "auto", "original"]] = None
    prompt_cache_breakpoint: Optional[CacheBreakpoint] = None


class InputJSON(Strict):
    type: Literal["input_json"]
    data: Union[dict[str, Any], list[dict[str, Any]]]
    prompt_cache_breakpoint: Optional[CacheBreakpoint] = None


class OutputText(Strict):
    type: Literal["output_text"]
    text: str


class Refusal(Strict):
    type: Literal["refusal"]
    refusal: str


InputPart = Annotated[Union[InputText, InputImage, InputJSON], Field(discriminator="type")]
AssistantPart = Annotated[Union[OutputText, Refusal], Field(discriminator="type")]


class Message(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "developer", "system", "assistant"]
    content: Union[str, list[Union[InputPart, AssistantPart]]]
    phase: Optional[Literal["commentary", "final_answer"]] = None


class FunctionCall(Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: Optional[str] = None
    namespace: Optional[str] = None
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


class FunctionCallOutput(Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, list[InputPart]]
    id: Optional[str] = None
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


class CustomToolCall(Strict):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: Optional[str] = None
    namespace: Optional[str] = None
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


class CustomToolCallOutput(Strict):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: Union[str, list[InputPart]]
    id: Optional[str] = None
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


def _item_type(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("type", "message")
    return getattr(value, "type", "message")


InputItem = Annotated[
    Union[
        Annotated[Message, Tag("message")],
        Annotated[FunctionCall, Tag("function_call")],
        Annotated[FunctionCallOutput, Tag("function_call_output")],
        Annotated[CustomToolCall, Tag("custom_tool_call")],
        Annotated[CustomToolCallOutput, Tag("custom_tool_call_output")],
    ],
    Discriminator(_item_type),
]

Instructions = Union[Annotated[str, Field(min_length=1, max_length=20_000)], list[InputPart]]


class PredicateQuestion(Strict):
    type: Literal["predicate"]
    instructions: Instructions
    name: Optional[str] = Field(None, max_length=200)


class ChoiceItem(Strict):
    value: Union[StrictStr, StrictBool]
    description: Optional[str] = Field(None, max_length=2000)


class ChoiceQuestion(Strict):
    type: Literal["choice"]
    instructions: Instructions
    choices: list[ChoiceItem] = Field(min_length=2, max_length=255)
    name: Optional[str] = Field(None, max_length=200)


class Level(Strict):
    label: str = Field(min_length=1, max_length=200)
    description: Optional[str] = Field(None, max_length=2000)


class ScoreQuestion(Strict):
    type: Literal["score"]
    instructions: Instructions
    levels: list[Level] = Field(min_length=2, max_length=255)
    name: Optional[str] = Field(None, max_length=200)


Question = Annotated[Union[PredicateQuestion, ChoiceQuestion, ScoreQuestion], Field(discriminator="type")]


class PromptCacheOptions(Strict):
    mode: Optional[Literal["implicit", "explicit"]] = None
    ttl: Optional[str] = None


class DecisionRequest(Strict):
    model: str = Field(min_length=1, max_length=200)
    input: Union[Annotated[str, Field(max_length=6_000_000)], list[InputItem]]
    questions: list[Question] = Field(min_length=1, max_length=400)
    prompt_cache_key: Optional[str] = Field(None, max_length=1000)
    prompt_cache_options: Optional[PromptCacheOptions] = None
    safety_identifier: Optional[str] = Field(None, max_length=1000)
    llamadecide: Optional[Extension] = None
