"""Pieces both decision formats share: the llamadecide extension object."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Extension(Strict):
    """Optional, additive: clients that do not send it get plain answers."""

    mode: Optional[Literal["text", "labels"]] = Field(None, description="Score option text or short labels")
    length_normalize: bool = False
    prior_correction: bool = Field(
        False, description="Divide out the model's answer distribution on content-free inputs"
    )
    rotations: int = Field(1, ge=1, le=255, description="Ask with the option list rotated this many times and average")
    threshold: Optional[float] = Field(
        None, ge=0.0, le=1.0, description="Act automatically when confidence >= threshold"
    )
    profile: Optional[str] = Field(None, max_length=200, description="Calibration profile to apply")
