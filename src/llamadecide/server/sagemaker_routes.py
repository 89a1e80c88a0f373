"""SageMaker real-time hosting: `GET /ping` and `POST /invocations`.

/invocations takes the bodies of the other routes and dispatches on their shape, or on
`route=/v1/...` in the X-Amzn-SageMaker-Custom-Attributes header. Neither route checks the API
key: SageMaker authenticates callers itself and forwards no Authorization header.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from llamadecide.errors import InvalidRequestError
from llamadecide.server import routes
from llamadecide.server.protocol.chat import ChatCompletionRequest, CompletionRequest
from llamadecide.server.protocol.decisions import DecisionRequest
from llamadecide.server.protocol.systemone import SystemOneRequest

router = APIRouter()

ROUTES: dict[str, tuple[type[BaseModel], Any]] = {
    "/v1/chat/completions": (ChatCompletionRequest, routes.handle_chat),
    "/v1/completions": (CompletionRequest, routes.handle_completion),
    "/v1/decisions": (DecisionRequest, routes.handle_decisions),
    "/v1/systemone": (SystemOneRequest, routes.handle_systemone),
}


def custom_route(header: str | None) -> str | None:
    """`route=/v1/decisions` among comma- or semicolon-separated key=value attributes."""
    for item in (header or "").replace(";", ",").split(","):
        key, _, value = item.strip().partition("=")
        if key.strip().lower() == "route" and value.strip():
            return value.strip()
    return None


def route_for(body: Any) -> str:
    if not isinstance(body, dict):
        raise InvalidRequestError("the invocation body must be a JSON object", param=None)
    if "messages" in body:
        return "/v1/chat/completions"
    questions = body.get("questions")
    if isinstance(questions, list) and "input" in body:
        return "/v1/decisions"
    if isinstance(questions, dict) and "state" in body:
        return "/v1/systemone"
    if "prompt" in body:
        return "/v1/completions"
    raise InvalidRequestError(
        "cannot tell the route from the body: send `messages` (chat), `input` + a list of `questions` "
        "(decisions), `state` + an object of `questions` (systemone) or `prompt` (completions), or name it "
        "with the X-Amzn-SageMaker-Custom-Attributes header route=/v1/...",
        param="body",
    )


@router.get("/ping")
async def ping(request: Request) -> Response:
    runtime = request.app.state.runtime
    if runtime.services is None:
        return JSONResponse({"status": "error" if runtime.load_error else "loading"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.post("/invocations")
async def invocations(request: Request) -> Response:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidRequestError("the body is not valid JSON", param="body") from None
    route = custom_route(request.headers.get("x-amzn-sagemaker-custom-attributes")) or route_for(body)
    if route not in ROUTES:
        raise InvalidRequestError(f"unknown route {route!r}; one of {', '.join(ROUTES)}", param="X-Amzn-SageMaker-Custom-Attributes")
    model, handler = ROUTES[route]
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False), body=body) from None
    result = await handler(request, parsed)
    return result if isinstance(result, Response) else JSONResponse(result)
