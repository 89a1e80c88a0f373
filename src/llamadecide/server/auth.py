"""Bearer-key check in constant time. With a key set, every route that answers with data needs it,
/invocations included; /ping, /health and the static playground page, which hold no data, stay
open. SageMaker authenticates callers at its edge and forwards no Authorization header: its
container entrypoint sets `open_invocations`, so there /invocations needs no key even when
LLAMA_API_KEY protects the /v1 routes."""

from __future__ import annotations

import hmac

from fastapi import Request

from llamadecide.server.errors import APIError

OPEN_PATHS = {"/ping", "/health", "/", "/review"}  # static pages ask for the key themselves


def check_key(request: Request) -> None:
    expected = request.app.state.settings.api_key
    if not expected or request.url.path in OPEN_PATHS:
        return
    if request.url.path == "/invocations" and request.app.state.settings.open_invocations:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise APIError(
            401,
            "missing or wrong API key (send Authorization: Bearer <key>)",
            type="authentication_error",
            code="invalid_api_key",
        )
