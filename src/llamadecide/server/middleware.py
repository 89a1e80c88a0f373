"""Pure ASGI middleware: request ids, the body-size limit, and zstd request bodies.

The body is read here once, bounded both before and after decompression, and replayed to the
app, so no route ever sees more than `max_body_bytes` and a bomb cannot inflate past it.
"""

from __future__ import annotations

import json
import uuid

import zstandard

from llamadecide.server.errors import error_body

Scope = dict
Receive = object
Send = object


class BodyMiddleware:
    def __init__(self, app, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        request_id = headers.get("x-request-id") or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", []).append((b"x-request-id", request_id.encode()))
            await send(message)

        if scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send_with_id)
            return
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(send_with_id, 413, "request_too_large", f"the body is larger than {self.max_body_bytes} bytes")
            return
        chunks, size = [], 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._refuse(send_with_id, 413, "request_too_large", f"the body is larger than {self.max_body_bytes} bytes")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding == "zstd":
            try:
                body = self._inflate(body)
            except _TooLarge:
                await self._refuse(send_with_id, 413, "request_too_large",
                                   f"the decompressed body is larger than {self.max_body_bytes} bytes")
                return
            except zstandard.ZstdError as exc:
                await self._refuse(send_with_id, 400, "invalid_request_error", f"the zstd body cannot be decompressed: {exc}")
                return
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"content-encoding", b"content-length")]
            scope["headers"].append((b"content-length", str(len(body)).encode()))
        elif encoding not in ("identity", ""):
            await self._refuse(send_with_id, 415, "invalid_request_error", f"unsupported Content-Encoding {encoding!r}; use zstd")
            return

        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send_with_id)

    def _inflate(self, body: bytes) -> bytes:
        reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
        out = reader.read(self.max_body_bytes + 1)
        if len(out) > self.max_body_bytes:
            raise _TooLarge()
        if not out and body:
            raise zstandard.ZstdError("empty or truncated frame")
        return out

    @staticmethod
    async def _refuse(send, status: int, type_: str, message: str) -> None:
        payload = json.dumps(error_body(message, type_)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


class _TooLarge(Exception):
    pass
