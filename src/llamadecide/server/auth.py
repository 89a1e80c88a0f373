"""Bearer-key check in constant time. SageMaker signs requests itself and does not forward an
Authorization header, so /ping and /invocations stay open (see WIRE.md); so do /health and the
static playground page, which holds no data."""

from __future__ import annotations

import hmac

from fastapi import Request

from llamadecide.server.errors import APIError

OPEN_PATHS = {"/ping", "/health", "/invocations", "/"}


def check_key(request: Request) -> None:
    expected = request.app.state.settings.api_key
    if not expected or request.url.path in OPEN_PATHS:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise APIError(401, "missing or wrong API key (send Authorization: Bearer <key>)", type="authentication_error",
                       code="invalid_api_key")
