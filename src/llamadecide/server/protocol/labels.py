"""Labels for served decisions (`POST /v1/labels`) and the review queue (`GET /v1/reviews`):
llamadecide's own wire, strict (unknown fields are refused) and bounded."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field, StrictBool, StrictInt, StrictStr

from llamadecide.server.protocol.common import Strict

MAX_LABELS = 1000  # labels in one body

# A declared option's value as answers carry it: a string, true/false for a predicate, a score's level
# index (or its level name, a string). Strict: "true" is not true, 1 is not "1".
LabelValue = Union[StrictBool, StrictInt, Annotated[StrictStr, Field(max_length=10_000)]]


class LabelIn(Strict):
    id: StrictStr = Field(min_length=1, max_length=200, description="The decision's request id (x-request-id)")
    question: Union[Annotated[StrictStr, Field(min_length=1, max_length=200)], Annotated[StrictInt, Field(ge=0)]] = (
        Field(description="The question's name, or its 0-based index when it has none")
    )
    label: LabelValue = Field(description="One of the question's declared options")


class LabelsRequest(Strict):
    labels: list[LabelIn] = Field(min_length=1, max_length=MAX_LABELS)
