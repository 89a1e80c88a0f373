"""SageMaker hosting: `GET /ping` and `POST /invocations`.

/invocations takes the bodies of the other routes and dispatches on their shape, or on
`route=/v1/...` in the X-Amzn-SageMaker-Custom-Attributes header. With a JSON Lines body
(`application/jsonlines`, what batch transform sends with `BatchStrategy=MultiRecord`) it takes one
decision request per line, decides them in shared engine calls, and answers one line per record,
in order; a line that cannot be decided is an error line of its own and never fails the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from llamadecide.errors import InvalidRequestError
from llamadecide.server import routes
from llamadecide.server.errors import error_record
from llamadecide.server.middleware import custom_attribute
from llamadecide.server.protocol.chat import ChatCompletionRequest, CompletionRequest
from llamadecide.server.protocol.decisions import DecisionRequest
from llamadecide.server.protocol.labels import LabelsRequest
from llamadecide.server.protocol.systemone import SystemOneRequest

router = APIRouter()

ROUTES: dict[str, tuple[type[BaseModel], Any]] = {
    "/v1/chat/completions": (ChatCompletionRequest, routes.handle_chat),
    "/v1/completions": (CompletionRequest, routes.handle_completion),
    "/v1/decisions": (DecisionRequest, routes.handle_decisions),
    "/v1/systemone": (SystemOneRequest, routes.handle_systemone),
    "/v1/labels": (LabelsRequest, routes.handle_labels),
}


def custom_route(header: str | None) -> str | None:
    """`route=/v1/decisions` among comma- or semicolon-separated key=value attributes."""
    return custom_attribute(header, "route")


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
    if isinstance(body.get("labels"), list):
        return "/v1/labels"
    raise InvalidRequestError(
        "cannot tell the route from the body: send `messages` (chat), `input` + a list of `questions` "
        "(decisions), `state` + an object of `questions` (systemone), `prompt` (completions) or `labels` (labels "
        "for served decisions), or name it "
        "with the X-Amzn-SageMaker-Custom-Attributes header route=/v1/...",
        param="body",
    )


@router.get("/ping")
async def ping(request: Request) -> Response:
    runtime = request.app.state.runtime
    if runtime.services is None:
        return JSONResponse({"status": "error" if runtime.load_error else "loading"}, status_code=503)
    return JSONResponse({"status": "ok"})


JSON_LINES = ("application/jsonlines", "application/x-jsonlines", "application/jsonl", "application/x-ndjson")
DECISION_ROUTES = ("/v1/decisions", "/v1/systemone")


@router.post("/invocations")
async def invocations(request: Request) -> Response:
    raw = await request.body()
    if request.headers.get("content-type", "").split(";")[0].strip().lower() in JSON_LINES:
        return await _invocations_lines(request, raw)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidRequestError("the body is not valid JSON", param="body") from None
    route = custom_route(request.headers.get("x-amzn-sagemaker-custom-attributes")) or route_for(body)
    if route not in ROUTES:
        raise InvalidRequestError(
            f"unknown route {route!r}; one of {', '.join(ROUTES)}", param="X-Amzn-SageMaker-Custom-Attributes"
        )
    model, handler = ROUTES[route]
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False), body=body) from None
    result = await handler(request, parsed)
    return result if isinstance(result, Response) else JSONResponse(result)


async def _invocations_lines(request: Request, raw: bytes) -> Response:
    runtime = request.app.state.runtime
    services = runtime.ready()
    header_route = custom_route(request.headers.get("x-amzn-sagemaker-custom-attributes"))
    lines = [line for line in raw.decode("utf-8", errors="replace").splitlines() if line.strip()]
    records: list[dict | None] = [None] * len(lines)
    waiting: list[tuple[int, str, Any, Callable[[Any], dict]]] = []  # line, route, prepared, formatter
    for index, line in enumerate(lines):
        try:
            try:
                body = json.loads(line)
            except json.JSONDecodeError:
                raise InvalidRequestError(f"line {index + 1} is not valid JSON", param="body") from None
            route = header_route or route_for(body)
            if route not in DECISION_ROUTES:
                raise InvalidRequestError(
                    f"a JSON Lines body holds decision requests ({', '.join(DECISION_ROUTES)}); "
                    f"line {index + 1} is for {route}",
                    param="body",
                )
            model, _ = ROUTES[route]
            try:
                parsed = model.model_validate(body)
            except ValidationError as exc:
                raise RequestValidationError(exc.errors(include_url=False), body=body) from None
            if route == "/v1/decisions":
                prepared = services.decisions.prepare_openai(parsed)
                waiting.append((index, route, prepared, lambda d, p=prepared: services.decisions.format_openai(p, d)))
            else:
                prepared, ids, legends = services.decisions.prepare_systemone(parsed)
                waiting.append(
                    (
                        index,
                        route,
                        prepared,
                        lambda d, p=prepared, i=ids, g=legends: services.decisions.format_systemone(p, i, g, d),
                    )
                )
        except Exception as exc:  # noqa: BLE001 - every bad line answers on its own line
            records[index] = error_record(exc)
    scheduler = runtime.scheduler
    size = max(1, scheduler.batch_size)
    for start in range(
        0, len(waiting), size
    ):  # a job per batch: other requests interleave, time limits apply per batch
        chunk = waiting[start : start + size]
        job = scheduler.new_job()
        results = await scheduler.run(
            services.decisions.run_many,
            [p for _, _, p, _ in chunk],
            [job] * len(chunk),
            job=job,
            disconnected=request.is_disconnected,
        )
        for (index, route, prepared, formatter), result in zip(chunk, results):
            if isinstance(result, Exception):
                records[index] = error_record(result)
            else:
                routes.record_decision(request, route, prepared, result)
                await routes.keep_for_review(request, prepared, result, line=index)
                records[index] = formatter(result)
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    return Response(text, media_type="application/jsonlines")
