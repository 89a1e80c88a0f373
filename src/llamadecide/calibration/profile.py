"""Calibration profiles: the fitted parameters and policy, bound to the model file and prompt
format they were fitted on. The server loads them from a directory and applies them by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict

from llamadecide.errors import InvalidRequestError, ModelLoadError, ProfileMismatchError


class CalibrationProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    created: str
    model_sha256: str
    prompt_format: str
    task: dict[str, Any]  # type, instructions, options, fingerprint
    mode: Literal["text", "labels"]
    calibrator: Literal["none", "temperature", "temperature+bias"]
    length_normalize: bool
    temperature: float
    bias: Optional[list[float]] = None
    threshold: Optional[float] = None  # act automatically when confidence >= threshold; None: always escalate
    target_precision: float
    confidence_level: float
    dataset_fingerprint: str
    metrics: dict[str, Any]

    def save(self, path: Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> "CalibrationProfile":
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def check_bound_to(self, model_sha256: str, prompt_format: str) -> None:
        if self.model_sha256 != model_sha256:
            raise ProfileMismatchError(
                f"profile {self.name!r} was fitted for model {self.model_sha256[:12]}…, this server runs "
                f"{model_sha256[:12]}…; recalibrate for this model", param="llamadecide.profile")
        if self.prompt_format != prompt_format:
            raise ProfileMismatchError(
                f"profile {self.name!r} was fitted with prompt format {self.prompt_format!r}, this server uses "
                f"{prompt_format!r}; recalibrate", param="llamadecide.profile")

    def check_options(self, kind: str, values: list[Any]) -> None:
        expected = [json.dumps(v) for v in self.task["options"]]
        if self.task["type"] != kind or [json.dumps(v) for v in values] != expected:
            raise ProfileMismatchError(
                f"profile {self.name!r} is for a {self.task['type']} question with options {self.task['options']}; "
                f"the question has {values}", param="llamadecide.profile")


class ProfileStore:
    """Every *.json profile in a directory, refused at start-up if bound to another model."""

    def __init__(self, directory: Path, model_sha256: str, prompt_format: str) -> None:
        self.profiles: dict[str, CalibrationProfile] = {}
        directory = Path(directory)
        if not directory.is_dir():
            raise ModelLoadError(f"profiles directory {directory} does not exist")
        for path in sorted(directory.glob("*.json")):
            profile = CalibrationProfile.load(path)
            profile.check_bound_to(model_sha256, prompt_format)
            self.profiles[profile.name] = profile

    def get(self, name: str) -> CalibrationProfile:
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(sorted(self.profiles)) or "none"
            raise InvalidRequestError(f"unknown calibration profile {name!r} (loaded: {known})",
                                      param="llamadecide.profile") from None
