"""Pure ASGI middleware: request ids, the body-size limit, zstd request bodies, and JSON that no
route can use.

The body is read here once, bounded both before and after decompression, and replayed to the
app, so no route ever sees more than `max_body_bytes` and a bomb cannot inflate past it. A JSON
body nested deeper than `MAX_JSON_DEPTH` or holding a lone UTF-16 surrogate (`"\ud800"`: valid
JSON, but no text a model or a log can encode) is refused here with a 400 naming the field, before
any route or engine work.
"""

from __future__ import annotations

import json
import re
import uuid

import zstandard

from llamadecide.server.errors import SYSTEMONE_PATH, error_body

MAX_JSON_DEPTH = 64
MAX_REQUEST_ID = 128  # characters of a client's X-Request-Id kept (it is copied into every log line)
_SURROGATE = re.compile("[\ud800-\udfff]")

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
        attributes = headers.get("x-amzn-sagemaker-custom-attributes")
        request_id = (
            _clean_request_id(headers.get("x-request-id"))
            or _clean_request_id(custom_attribute(attributes, "request_id"))
            or uuid.uuid4().hex
        )
        scope.setdefault("state", {})["request_id"] = request_id
        path = scope.get("path", "")

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", []).append((b"x-request-id", request_id.encode()))
                if path == "/invocations":  # SageMaker hands this header back to the caller (CustomAttributes)
                    message["headers"].append(
                        (b"x-amzn-sagemaker-custom-attributes", f"request_id={request_id}".encode())
                    )
            await send(message)

        async def refuse(status: int, type_: str, message: str, param: str | None = None) -> None:
            await self._refuse(send_with_id, status, type_, message, param, path)

        if scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send_with_id)
            return
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
            await refuse(413, "request_too_large", f"the body is larger than {self.max_body_bytes} bytes")
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
                await refuse(413, "request_too_large", f"the body is larger than {self.max_body_bytes} bytes")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding == "zstd":
            try:
                body = self._inflate(body)
            except _TooLarge:
                await refuse(
                    413, "request_too_large", f"the decompressed body is larger than {self.max_body_bytes} bytes"
                )
                return
            except zstandard.ZstdError as exc:
                await refuse(400, "invalid_request_error", f"the zstd body cannot be decompressed: {exc}")
                return
            scope["headers"] = [
                (k, v) for k, v in scope["headers"] if k.lower() not in (b"content-encoding", b"content-length")
            ]
            scope["headers"].append((b"content-length", str(len(body)).encode()))
        elif encoding not in ("identity", ""):
            await refuse(415, "invalid_request_error", f"unsupported Content-Encoding {encoding!r}; use zstd")
            return
        problem = unusable_json(body)
        if problem is not None:
            await refuse(400, "invalid_request_error", *problem)
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
    async def _refuse(send, status: int, type_: str, message: str, param: str | None = None, path: str = "") -> None:
        body = error_body(message, type_, param)
        if path == SYSTEMONE_PATH:
            body["detail"] = {"error_type": type_, "message": message}  # TypeSafe's shape, as errors.for_route
        payload = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})


class _TooLarge(Exception):
    pass


def custom_attribute(header: str | None, name: str) -> str | None:
    """`name=value` among the comma- or semicolon-separated key=value pairs of SageMaker's
    X-Amzn-SageMaker-Custom-Attributes header."""
    for item in (header or "").replace(";", ",").split(","):
        key, _, value = item.strip().partition("=")
        if key.strip().lower() == name and value.strip():
            return value.strip()
    return None


def _clean_request_id(given: str | None) -> str | None:
    """A client's request id, kept to printable ASCII and MAX_REQUEST_ID characters."""
    if not given:
        return None
    kept = "".join(c for c in given if " " < c <= "~")[:MAX_REQUEST_ID]
    return kept or None


def unusable_json(body: bytes) -> tuple[str, str | None] | None:
    """(message, field) when a JSON body nests deeper than MAX_JSON_DEPTH or holds a lone surrogate
    in a key or string; None when it is fine or not JSON at all (the route says what is wrong then)."""
    if body.lstrip()[:1] not in (b"{", b"["):
        return None
    try:
        document = json.loads(body)
    except RecursionError:
        return f"the body nests deeper than {MAX_JSON_DEPTH} levels", None
    except (ValueError, UnicodeDecodeError):
        return None
    stack: list[tuple[object, str, int]] = [(document, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"the body nests deeper than {MAX_JSON_DEPTH} levels (at {where or 'the top'})", where or None
        if isinstance(value, dict):
            for key, item in value.items():
                path = f"{where}.{key}" if where else key
                if _SURROGATE.search(key):
                    where = _printable(path)
                    return f"{where}: a key holds a lone UTF-16 surrogate, which is not text", where
                stack.append((item, path, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{where}.{i}" if where else str(i), depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str) and _SURROGATE.search(value):
            return f"{_printable(where) or 'body'}: a lone UTF-16 surrogate is not text", _printable(where) or None
    return None


def _printable(path: str) -> str:
    return _SURROGATE.sub("\ufffd", path)
