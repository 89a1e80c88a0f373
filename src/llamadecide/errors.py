"""Typed domain errors. The HTTP edge maps each class to a status in one table."""

from __future__ import annotations


class LlamaDecideError(Exception):
    """Base class. `param` names the offending input field when there is one."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequestError(LlamaDecideError):
    """The caller sent something that cannot be answered as sent (empty state, bad options...)."""


class ContextOverflowError(InvalidRequestError):
    """The prompt and the longest answer do not fit in the model's context window."""


class RequestTimeoutError(LlamaDecideError):
    """A request ran past its time limit; the engine moved on to the next one."""


class UnsupportedError(LlamaDecideError):
    """A valid request for a feature this model or build does not have (e.g. images)."""


class ModelLoadError(LlamaDecideError):
    """The model file is missing, unreadable or unsupported."""


class ProfileMismatchError(InvalidRequestError):
    """A calibration profile was fitted for another model file or prompt format."""


class UnknownItemError(InvalidRequestError):
    """A request names something this server does not hold (a decision id that was never served)."""


class LabelError(InvalidRequestError):
    """A label that is not one of its question's declared options."""
