"""The HTTP face of `llamadecide label`: the review page over a labelling session's queue, the labels
in, and where the task stands (`GET /v1/labelling`, which the page shows). The same routes, wire
and errors as the server's (`/review`, `GET /v1/reviews`, `POST /v1/labels`)."""

from __future__ import annotations

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool

from llamadecide.labels.labelling import LabellingSession
from llamadecide.labels.queue import ReviewQueue
from llamadecide.server.errors import install_error_handlers
from llamadecide.server.middleware import BodyMiddleware
from llamadecide.server.protocol.labels import LabelsRequest
from llamadecide.server.review_serving import ReviewServing
from llamadecide.server.routes import static_page


def create_labelling_app(session: LabellingSession, *, max_body_bytes: int = 1_048_576) -> FastAPI:
    app = FastAPI(title="llamadecide label", docs_url=None, redoc_url=None)
    reviews = ReviewServing(session.store, ReviewQueue(session.store, 0.0))
    install_error_handlers(app)

    @app.get("/", response_class=HTMLResponse)
    @app.get("/review", response_class=HTMLResponse)
    async def review_page() -> HTMLResponse:
        return static_page("review.html")

    @app.get("/v1/reviews")
    async def pending(limit: int = Query(50, ge=1, le=500)) -> dict:
        await run_in_threadpool(session.fill_queue)
        return await run_in_threadpool(lambda: reviews.reviews(limit=limit))

    @app.post("/v1/labels", status_code=201)
    async def labels(request: Request, body: LabelsRequest) -> JSONResponse:
        count = await run_in_threadpool(reviews.add_labels, body, "review page")
        await run_in_threadpool(session.after_labels)
        return JSONResponse({"object": "labels", "count": count}, status_code=201)

    @app.get("/ping")
    async def ping() -> dict:
        return {"status": "ok"}

    @app.get("/v1/labelling")
    async def labelling() -> dict:
        return await run_in_threadpool(session.status)

    app.add_middleware(BodyMiddleware, max_body_bytes=max_body_bytes)
    return app
