"""One error envelope, one status table. Every error leaves as
{"error": {"message", "type", "param", "code"}}; on the System One route the same body also carries
TypeSafe's {"detail": {"error_type", "message"}}, so clients of either format read it."""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from llamadecide.errors import (
    ContextOverflowError,
    InvalidRequestError,
    LabelError,
    LlamaDecideError,
    ModelLoadError,
    ProfileMismatchError,
    RequestTimeoutError,
    UnknownItemError,
    UnsupportedError,
)

log = logging.getLogger(__name__)


class APIError(Exception):
    """An error raised at the HTTP edge itself (auth, overload, body problems)."""

    def __init__(self, status: int, message: str, *, type: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


# Most specific first: the first matching class decides.
STATUS_TABLE: list[tuple[type[LlamaDecideError], int, str, str | None]] = [
    (ContextOverflowError, 400, "invalid_request_error", "context_length_exceeded"),
    (ProfileMismatchError, 422, "invalid_request_error", "profile_mismatch"),
    (UnknownItemError, 404, "not_found_error", "unknown_decision"),
    (LabelError, 422, "invalid_request_error", "undeclared_label"),
    (InvalidRequestError, 400, "invalid_request_error", None),
    (UnsupportedError, 501, "not_implemented_error", "unsupported"),
    (RequestTimeoutError, 504, "timeout_error", "request_timeout"),
    (ModelLoadError, 503, "unavailable_error", "model_not_ready"),
]
HTTP_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    503: "unavailable_error",
}


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    type: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type, param, code), status_code=status, headers=headers)


def domain_error_response(exc: LlamaDecideError) -> JSONResponse:
    for cls, status, type_, code in STATUS_TABLE:
        if isinstance(exc, cls):
            return error_response(status, exc.message, type_, exc.param, code)
    return error_response(500, exc.message, "server_error")


def error_record(exc: Exception) -> dict:
    """An error as one record of a JSON Lines answer: the envelope, with the status it would have had."""
    if isinstance(exc, LlamaDecideError):
        response = domain_error_response(exc)
        return {**json.loads(response.body), "status": response.status_code}
    if isinstance(exc, APIError):
        return {**error_body(exc.message, exc.type, exc.param, exc.code), "status": exc.status}
    if isinstance(exc, RequestValidationError):
        message, param = validation_message(exc)
        return {**error_body(message, "invalid_request_error", param), "status": 400}
    log.exception("a JSON Lines record failed", exc_info=exc)
    return {**error_body("internal error", "server_error"), "status": 500}


def body_path(loc: tuple, body: object) -> list[str]:
    """A pydantic error location as a path in the client's body: union-branch tags that
    pydantic inserts (e.g. `choice` in questions.0.choice.choices) are not keys of the body."""
    path: list[str] = []
    current = body
    items = [p for p in loc if p != "body"]
    for index, part in enumerate(items):
        last = index == len(items) - 1
        if isinstance(current, dict) and part in current:
            current = current[part]
            path.append(str(part))
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            current = current[part]
            path.append(str(part))
        elif last or not isinstance(current, (dict, list)):
            path.append(str(part))  # a missing or unknown field, named as the client would
            current = None
    return path


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The first validation problem, naming the field by its path in the body."""
    first = exc.errors()[0]
    path = body_path(tuple(first.get("loc", ())), getattr(exc, "body", None))
    param = ".".join(path) or None
    message = first.get("msg", "invalid request")
    if first.get("type") == "extra_forbidden":
        message = f"unknown field {path[-1]!r}" if path else "unknown field"
    elif first.get("type") == "missing":
        message = "field required"
    elif first.get("type") == "json_invalid":
        return "the body is not valid JSON", None
    return (f"{param}: {message}" if param else message), param


SYSTEMONE_PATH = "/v1/systemone"


def for_route(request: Request, response: JSONResponse) -> JSONResponse:
    """Add TypeSafe's `detail` beside the envelope on the System One route."""
    if request.url.path != SYSTEMONE_PATH:
        return response
    error = json.loads(response.body)["error"]
    body = {**json.loads(response.body), "detail": {"error_type": error["type"], "message": error["message"]}}
    headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
    return JSONResponse(body, status_code=response.status_code, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LlamaDecideError)
    async def _domain(request: Request, exc: LlamaDecideError) -> JSONResponse:
        return for_route(request, domain_error_response(exc))

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
        if exc.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        return for_route(request, error_response(exc.status, exc.message, exc.type, exc.param, exc.code, headers))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return for_route(request, error_response(400, message, "invalid_request_error", param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "no such route" if exc.status_code == 404 else str(exc.detail)
        return for_route(
            request, error_response(exc.status_code, message, HTTP_TYPES.get(exc.status_code, "invalid_request_error"))
        )

    @app.exception_handler(Exception)
    async def _fallback(request: Request, exc: Exception) -> JSONResponse:
        log.exception(
            "unhandled error on %s %s (request %s)",
            request.method,
            request.url.path,
            request.scope.get("state", {}).get("request_id"),
        )
        return for_route(request, error_response(500, "internal server error", "server_error"))
