"""TypeSafe System One (`POST /v1/systemone`): strict, questions keyed by id."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import ConfigDict, Field

from llamadecide.server.protocol.common import Extension, Strict

Content = Union[str, dict[str, Any], list[Any]]


class NoulCriteria(Strict):
    true: Optional[Content] = None
    false: Optional[Content] = None


class NoulQuestion(Strict):
    type: Literal["noul"]
    instructions: Optional[Content] = None
    criteria: Optional[NoulCriteria] = None


class ChoiceQuestion(Strict):
    type: Literal["choice"]
    instructions: Optional[Content] = None
    criteria: dict[str, Optional[Content]] = Field(min_length=2, max_length=255)


class ScoreQuestion(Strict):
    type: Literal["score"]
    instructions: Optional[Content] = None
    criteria: list[Content] = Field(min_length=2, max_length=10)


class BoxQuestion(Strict):
    type: Literal["box"]
    instructions: Optional[Content] = None


Question = Annotated[Union[NoulQuestion, ChoiceQuestion, ScoreQuestion, BoxQuestion], Field(discriminator="type")]


class Asset(Strict):
    type: Optional[Literal["image"]] = None
    format: Optional[str] = None
    data_base64: Optional[str] = None
    part: Optional[str] = None


class SystemOneRequest(Strict):
    """Unknown fields inside questions are refused. Unknown top-level fields (a client's trace id,
    a seed) are accepted, as the System One spec asks, but not silently: the answer names them in
    `x_ignored_fields`."""

    model_config = ConfigDict(extra="allow")

    model: Optional[str] = Field(None, max_length=200)
    state: Content
    questions: dict[str, Question] = Field(min_length=1, max_length=400)
    images: Optional[list[Any]] = None
    assets: Optional[dict[str, Asset]] = None
    llamadecide: Optional[Extension] = None
