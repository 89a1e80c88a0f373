"""HTTP routes: thin. Each parses its body, calls a serving class, formats the response."""

from __future__ import annotations

import logging
import time
from importlib import resources

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from llamadecide.decisions import Decision
from llamadecide.server.decision_serving import DecisionServing, Prepared
from llamadecide.server.protocol.chat import ChatCompletionRequest, CompletionRequest
from llamadecide.server.protocol.decisions import DecisionRequest
from llamadecide.server.protocol.labels import LabelsRequest
from llamadecide.server.protocol.systemone import SystemOneRequest

log = logging.getLogger(__name__)
router = APIRouter()
DECISIONS = "decisions"  # the scheduler key of decision requests: any two may share the engine's calls


def _runtime(request: Request):
    return request.app.state.runtime


def record_decision(request: Request, route: str, prepared: Prepared, decision: Decision) -> None:
    """Count a decision in the metrics and append it to the probability log."""
    runtime = _runtime(request)
    services = runtime.ready()
    runtime.metrics.tokens.labels("scored").inc(decision.prompt_tokens)
    profile = prepared.profile.name if prepared.profile is not None else ""
    for answer in decision.answers:
        runtime.metrics.answers.labels(answer.question.type).inc()
        action = DecisionServing.action(answer, prepared)[0] or "none"
        runtime.metrics.decisions.labels(profile, action).inc()
    if runtime.problog:
        try:
            runtime.problog.write(
                request_id=request.scope["state"]["request_id"],
                route=route,
                model=services.model_name,
                model_sha256=services.engine.model_sha256,
                answers=decision.answers,
                seconds=decision.seconds,
                names=prepared.names,
                state=prepared.state,
                usage={"input_tokens": decision.prompt_tokens, "cached_tokens": decision.extra.get("cached_tokens", 0)},
            )
        except Exception:  # the answer is computed: a log that cannot take it must not lose it for the client
            log.exception("the probability log could not record request %s", request.scope["state"]["request_id"])
            runtime.metrics.errors.labels("probability_log").inc()


async def keep_for_review(request: Request, prepared: Prepared, decision: Decision, *, line: int | None = None) -> None:
    """Record a served decision in the label store (escalations and the audit enter the review queue),
    before the answer leaves: a label may follow at once. Its id is the request id (`x-request-id`),
    with `:LINE` (0-based) for a line of a JSON Lines body. A store that cannot take it is logged and
    counted; the answer is computed, and the client gets it."""
    reviews = _runtime(request).reviews
    if reviews is None:
        return
    request_id = request.scope["state"]["request_id"] + ("" if line is None else f":{line}")
    try:
        await run_in_threadpool(reviews.keep, request_id, prepared, decision)
    except Exception:  # noqa: BLE001
        log.exception("the label store could not record request %s", request_id)
        _runtime(request).metrics.errors.labels("label_store").inc()


async def _run_decision(request: Request, services, prepared: Prepared) -> Decision:
    """The decision on the engine thread, sharing its calls with the other decisions waiting then."""
    scheduler = _runtime(request).scheduler
    return await scheduler.run_shared(
        DECISIONS, services.decisions.run_many, prepared, disconnected=request.is_disconnected
    )


async def handle_decisions(request: Request, body: DecisionRequest) -> dict:
    services = _runtime(request).ready()
    prepared = services.decisions.prepare_openai(body)
    decision = await _run_decision(request, services, prepared)
    record_decision(request, "/v1/decisions", prepared, decision)
    await keep_for_review(request, prepared, decision)
    return services.decisions.format_openai(prepared, decision)


async def handle_systemone(request: Request, body: SystemOneRequest) -> dict:
    services = _runtime(request).ready()
    prepared, ids, legends = services.decisions.prepare_systemone(body)
    decision = await _run_decision(request, services, prepared)
    record_decision(request, "/v1/systemone", prepared, decision)
    await keep_for_review(request, prepared, decision)
    return services.decisions.format_systemone(prepared, ids, legends, decision)


async def handle_labels(request: Request, body: LabelsRequest) -> JSONResponse:
    """Labels for served decisions: all of the body or none, durable before the 201."""
    reviews = _runtime(request).refuse_without_store()
    count = await run_in_threadpool(reviews.add_labels, body)
    return JSONResponse({"object": "labels", "count": count}, status_code=201)


async def handle_chat(request: Request, body: ChatCompletionRequest) -> Response:
    runtime = _runtime(request)
    chat = runtime.ready().chat
    prompt, params = chat.prepare_chat(body)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = chat.start_stream(prompt, params)  # admitted here: a full queue is a 503, not a 200
        return StreamingResponse(
            chat.chat_sse(events, params, include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    generated = await chat.complete(prompt, params, disconnected=request.is_disconnected)
    _count_generation(runtime, generated)
    return JSONResponse(chat.chat_response(generated, params))


async def handle_completion(request: Request, body: CompletionRequest) -> Response:
    runtime = _runtime(request)
    chat = runtime.ready().chat
    prompt, params = chat.prepare_completion(body)
    if body.stream:
        from llamadecide.errors import UnsupportedError

        raise UnsupportedError("streaming text completions are not supported; use /v1/chat/completions", param="stream")
    generated = await chat.complete(prompt, params, disconnected=request.is_disconnected)
    _count_generation(runtime, generated)
    return JSONResponse(chat.completion_response(generated, params))


def _count_generation(runtime, generated) -> None:
    if generated.result:
        runtime.metrics.tokens.labels("prompt").inc(generated.result.prompt_tokens)
        runtime.metrics.tokens.labels("completion").inc(generated.result.completion_tokens)


@router.post("/v1/decisions")
async def decisions(request: Request, body: DecisionRequest) -> dict:
    return await handle_decisions(request, body)


@router.post("/v1/systemone")
async def systemone(request: Request, body: SystemOneRequest) -> dict:
    return await handle_systemone(request, body)


@router.post("/v1/labels", status_code=201)
async def labels(request: Request, body: LabelsRequest) -> JSONResponse:
    return await handle_labels(request, body)


@router.get("/v1/reviews")
async def reviews(
    request: Request,
    limit: int = Query(50, ge=1, le=500, description="Most items returned"),
    profile: str | None = Query(None, max_length=200, description="Only this profile's items"),
) -> dict:
    """The review queue: items still without a label, oldest first."""
    serving = _runtime(request).refuse_without_store()
    return await run_in_threadpool(lambda: serving.reviews(limit=limit, profile=profile))


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
    return await handle_chat(request, body)


@router.post("/v1/completions")
async def completions(request: Request, body: CompletionRequest) -> Response:
    return await handle_completion(request, body)


@router.get("/v1/models")
async def models(request: Request) -> dict:
    services = _runtime(request).ready()
    engine = services.engine
    created = int(engine.model_path.stat().st_mtime)
    return {
        "object": "list",
        "data": [
            {
                "id": services.model_name,
                "object": "model",
                "created": created,
                "owned_by": "llamadecide",
                "meta": {
                    "file": engine.model_path.name,
                    "n_ctx": engine.n_ctx,
                    "n_gpu_layers": engine.n_gpu_layers,
                    "chat_template": engine.chat_template_origin,
                },
            }
        ],
        # The same list in TypeSafe's shape, so both SDKs read this route.
        "models": [
            {
                "name": services.model_name,
                "description": f"{engine.model_path.name} on llama.cpp",
                "release_date": time.strftime("%Y-%m-%d", time.gmtime(created)),
            }
        ],
    }


@router.get("/v1/profiles")
async def profiles(request: Request) -> dict:
    """The calibration profiles this server applies by name, and the files it left out (and why)."""
    runtime = _runtime(request)
    runtime.ready()
    store = runtime.profile_store
    data = [
        {
            "name": p.name,
            "version": p.version,
            "version_id": p.version_id,
            "parent": p.parent,
            "type": p.task["type"],
            "instructions": p.task["instructions"],
            "options": p.task["options"],
            "mode": p.mode,
            "method": p.method_label,
            "prompt_format": p.prompt_format,
            "threshold": p.threshold,
            "target_precision": p.target_precision,
            "confidence_level": p.confidence_level,
        }
        for p in (store.profiles.values() if store else ())
    ]
    return {
        "object": "list",
        "data": data,
        "refused": dict(store.refused) if store else {},
        "superseded": dict(store.superseded) if store else {},
    }


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    runtime = _runtime(request)
    if runtime.services is not None:
        body = {"status": "ok", "model": runtime.services.model_name, "queue_depth": runtime.scheduler.depth}
        figures = await run_in_threadpool(runtime.review_figures)
        if figures is not None:
            audits = [found.as_dict() for found in figures["audits"]]
            body["reviews_pending"] = sum(counts["pending"] for counts in figures["counts"].values())
            body["audit"] = audits
            body["warnings"] = [
                f"profile {a['profile']}: audited precision lower bound {a['lower_bound']:.3f} is below the target "
                f"{a['target']} ({a['labels']} audited labels)"
                for a in audits
                if a["state"] == "below_target"
            ]
        return JSONResponse(body)
    status = "error" if runtime.load_error else "loading"
    return JSONResponse({"status": status, "error": runtime.load_error}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(_runtime(request).metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/", response_class=HTMLResponse)
async def playground() -> HTMLResponse:
    return static_page("playground.html")


@router.get("/review", response_class=HTMLResponse)
async def review_page() -> HTMLResponse:
    """The review page: the next queued item, its options with keyboard shortcuts, the label posted."""
    return static_page("review.html")


def static_page(name: str) -> HTMLResponse:
    return HTMLResponse(resources.files("llamadecide.server").joinpath(f"static/{name}").read_text(encoding="utf-8"))
