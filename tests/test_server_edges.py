"""Bad input, auth, SageMaker routes, load, concurrency and logs against the real server."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import httpx
import pytest
import zstandard

from conftest import API_KEY, engine_config

AUTH = {"Authorization": f"Bearer {API_KEY}"}
TICKET = "I was charged twice for my subscription this month and I want a refund."
CHOICE = {"type": "choice", "instructions": "Which team?", "choices": [{"value": "billing"}, {"value": "support"}]}


def decision(**overrides):
    body = {"model": "m", "input": TICKET, "questions": [CHOICE]}
    body.update(overrides)
    return body


def assert_error(response: httpx.Response, status: int, *, param: str | None = None, contains: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if contains is not None:
        assert contains in error["message"], error


@pytest.fixture()
def healthy(server):
    yield
    assert httpx.get(f"{server.url}/health", timeout=120).json()["status"] == "ok"
    ok = httpx.post(f"{server.url}/v1/decisions", json=decision(), headers=AUTH, timeout=120)
    assert ok.status_code == 200


def post(server, path, body=None, *, content=None, headers=None):
    return httpx.post(
        f"{server.url}{path}", json=body, content=content, headers={**AUTH, **(headers or {})}, timeout=60
    )


@pytest.mark.usefixtures("healthy")
class TestBadInput:
    @pytest.mark.parametrize(
        "path, raw, field",
        [
            (
                "/v1/decisions",
                '{"model": "m", "input": "x", "questions": [{"type": "choice", "instructions": "Which?", '
                '"choices": [{"value": "\\ud800"}, {"value": "b"}]}]}',
                "questions.0.choices.0.value",
            ),
            (
                "/v1/systemone",
                '{"state": {"\\ud800": 1}, "questions": {"q": {"type": "noul", "instructions": "x"}}}',
                "state.",
            ),
            (
                "/v1/systemone",
                '{"state": "x", "questions": {"\\udc00id": {"type": "noul", "instructions": "x"}}}',
                "questions.",
            ),
            (
                "/v1/chat/completions",
                '{"model": "m", "messages": [{"role": "user", "content": "hi \\ud83d"}]}',
                "messages.0.content",
            ),
            (
                "/invocations",
                '{"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "\\udfff"}]}',
                "questions.0.instructions",
            ),
        ],
    )
    def test_lone_surrogates_are_a_400_naming_the_field(self, server, path, raw, field):
        response = post(server, path, content=raw.encode(), headers={"content-type": "application/json"})
        assert_error(response, 400, contains="surrogate")
        assert response.json()["error"]["param"].startswith(field)
        if path == "/v1/systemone":
            assert response.json()["detail"]["message"]  # TypeSafe's shape too

    @pytest.mark.parametrize(
        "raw",
        [
            b"[" * 100_000 + b"]" * 100_000,
            b'{"state": ' + b'{"a": ' * 5_000 + b"1" + b"}" * 5_000 + b', "questions": {}}',
        ],
    )
    def test_deep_nesting_is_a_400_on_every_route(self, server, raw):
        for path in ("/invocations", "/v1/decisions", "/v1/systemone"):
            assert_error(
                post(server, path, content=raw, headers={"content-type": "application/json"}),
                400,
                contains="nests deeper",
            )

    def test_a_long_request_id_is_cut(self, server):
        response = post(server, "/v1/decisions", decision(), headers={"X-Request-Id": "r" * 60_000})
        assert response.status_code == 200 and response.headers["x-request-id"] == "r" * 128

    def test_malformed_json(self, server):
        assert_error(
            post(
                server,
                "/v1/decisions",
                content=b'{"model": "m", "input": ',
                headers={"content-type": "application/json"},
            ),
            400,
            contains="JSON",
        )

    def test_wrong_types(self, server):
        assert_error(post(server, "/v1/decisions", decision(questions="not a list")), 400, param="questions")

    def test_unknown_question_type(self, server):
        assert_error(post(server, "/v1/decisions", decision(questions=[{"type": "vote", "instructions": "x"}])), 400)

    def test_unknown_field_is_named(self, server):
        assert_error(post(server, "/v1/decisions", decision(temperature=0.2)), 400, contains="'temperature'")

    @pytest.mark.parametrize("choices", [[], [{"value": "only"}]])
    def test_zero_or_one_option(self, server, choices):
        body = decision(questions=[{**CHOICE, "choices": choices}])
        assert_error(post(server, "/v1/decisions", body), 400, param="questions.0.choices")

    def test_duplicate_options(self, server):
        body = decision(questions=[{**CHOICE, "choices": [{"value": "a"}, {"value": "a"}]}])
        assert_error(post(server, "/v1/decisions", body), 400, param="questions[0]", contains="duplicate")

    def test_too_many_questions(self, server):
        assert_error(post(server, "/v1/decisions", decision(questions=[CHOICE] * 401)), 400, param="questions")

    def test_oversized_body(self, server):
        big = decision(input="x" * 300_000)  # the test server's limit is 256 KiB
        assert_error(post(server, "/v1/decisions", big), 413)
        refused = post(
            server, "/v1/systemone", {"state": "x" * 300_000, "questions": {"q": {"type": "noul", "instructions": "x"}}}
        )
        assert_error(refused, 413)
        assert refused.json()["detail"]["error_type"] == "request_too_large"  # TypeSafe's shape there too

    def test_state_longer_than_context(self, server):
        response = post(server, "/v1/decisions", decision(input="word " * 9000))  # over the default 8192-token context
        assert_error(response, 400, contains="context")
        assert response.json()["error"]["code"] == "context_length_exceeded"

    def test_empty_state(self, server):
        assert_error(post(server, "/v1/decisions", decision(input="   ")), 400, param="input")

    def test_unsupported_image_input(self, server):
        body = decision(
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]
        )
        assert_error(post(server, "/v1/decisions", body), 501, param="input[0].content[0]")
        chat = {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        }
        assert_error(post(server, "/v1/chat/completions", chat), 501)

    def test_corrupt_zstd_body(self, server):
        assert_error(
            post(
                server,
                "/v1/systemone",
                content=b"\x28\xb5\x2f\xfdgarbage",
                headers={"content-encoding": "zstd", "content-type": "application/json"},
            ),
            400,
            contains="zstd",
        )

    def test_zstd_bomb_is_bounded(self, server):
        bomb = zstandard.ZstdCompressor().compress(b" " * 2_000_000)
        assert len(bomb) < 10_000
        assert_error(post(server, "/v1/systemone", content=bomb, headers={"content-encoding": "zstd"}), 413)

    def test_box_question_is_unsupported(self, server):
        body = {"state": TICKET, "questions": {"b": {"type": "box", "instructions": "the dog"}}}
        assert_error(post(server, "/v1/systemone", body), 501, param="questions.b")

    def test_systemone_score_levels_bounded(self, server):
        body = {"state": TICKET, "questions": {"s": {"type": "score", "criteria": [str(i) for i in range(11)]}}}
        assert_error(post(server, "/v1/systemone", body), 400)

    def test_tool_output_without_call(self, server):
        body = decision(input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}])
        assert_error(post(server, "/v1/decisions", body), 400, param="input[0].call_id")

    def test_unknown_profile_is_refused_not_ignored(self, server):
        assert_error(
            post(server, "/v1/decisions", decision(llamadecide={"profile": "agnews"})), 400, param="llamadecide.profile"
        )

    def test_unknown_route(self, server):
        assert_error(httpx.get(f"{server.url}/v2/nothing", headers=AUTH, timeout=120), 404)

    def test_chat_lenient_on_unknown_fields(self, server):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "some_future_field": 1}
        assert post(server, "/v1/chat/completions", body).status_code == 200

    def test_chat_max_tokens_bound(self, server):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}
        assert_error(post(server, "/v1/chat/completions", body), 400, param="max_tokens")


@pytest.mark.usefixtures("healthy")
class TestAuth:
    def test_missing_and_wrong_key(self, server):
        assert_error(httpx.post(f"{server.url}/v1/decisions", json=decision(), timeout=120), 401)
        assert_error(
            httpx.post(
                f"{server.url}/v1/decisions", json=decision(), headers={"Authorization": "Bearer wrong"}, timeout=120
            ),
            401,
        )
        assert_error(
            httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Basic {API_KEY}"}, timeout=120), 401
        )
        assert_error(httpx.get(f"{server.url}/metrics", timeout=120), 401)

    def test_open_routes(self, server):
        assert httpx.get(f"{server.url}/ping", timeout=120).status_code == 200
        assert httpx.get(f"{server.url}/health", timeout=120).status_code == 200
        assert httpx.get(f"{server.url}/", timeout=120).status_code == 200

    def test_invocations_needs_the_key_when_one_is_set(self, server):
        # (SageMaker's entrypoint sets no key, so there it needs none: test_sagemaker_container)
        assert_error(httpx.post(f"{server.url}/invocations", json=decision(), timeout=120), 401)
        body = {"state": TICKET, "questions": {"t": {"type": "noul", "instructions": "refund?"}}}
        assert_error(httpx.post(f"{server.url}/invocations", json=body, timeout=120), 401)
        assert httpx.post(f"{server.url}/invocations", json=decision(), headers=AUTH, timeout=120).status_code == 200


class TestSageMaker:
    # as invoke_endpoint sends, plus the key this shared server is started with
    HEADERS = {"Content-Type": "application/json", "Accept": "application/json", **AUTH}

    def invoke(self, server, body, attributes=None):
        headers = dict(self.HEADERS)
        if attributes:
            headers["X-Amzn-SageMaker-Custom-Attributes"] = attributes
        return httpx.post(f"{server.url}/invocations", content=json.dumps(body).encode(), headers=headers, timeout=60)

    def test_dispatch_on_body_shape(self, server):
        chat = self.invoke(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert chat.json()["object"] == "chat.completion"
        decided = self.invoke(server, {"model": "m", "input": TICKET, "questions": [CHOICE]})
        assert decided.json()["answers"][0]["type"] == "choice"
        one = self.invoke(server, {"state": TICKET, "questions": {"t": {"type": "noul", "instructions": "refund?"}}})
        assert one.json()["answers"]["t"]["type"] == "noul"
        text = self.invoke(server, {"prompt": "Once upon a time", "max_tokens": 3})
        assert text.json()["object"] == "text_completion"

    def test_custom_attributes_name_the_route(self, server):
        body = {"model": "m", "input": TICKET, "questions": [CHOICE]}
        assert self.invoke(server, body, "trace=abc, route=/v1/decisions").status_code == 200
        assert_error(self.invoke(server, body, "route=/v1/systemone"), 400)  # the body is not a systemone body
        assert_error(self.invoke(server, body, "route=/v1/nothing"), 400, contains="unknown route")

    def test_unknown_shape_is_explained(self, server):
        assert_error(self.invoke(server, {"hello": "world"}), 400, contains="cannot tell the route")
        assert_error(self.invoke(server, [1, 2]), 400)


def test_ping_before_and_after_load():
    """/ping answers 503 quickly while the model loads, 200 once it has."""
    from starlette.testclient import TestClient

    from llamadecide.engine import Engine, bundled_model_path
    from llamadecide.server import create_app
    from llamadecide.settings import Settings

    release = threading.Event()

    def slow_factory(settings):
        release.wait(30)
        return Engine(engine_config(bundled_model_path(), n_ctx=1024))

    with TestClient(create_app(Settings(), engine_factory=slow_factory)) as client:
        began = time.perf_counter()
        early = client.get("/ping")
        assert early.status_code == 503 and time.perf_counter() - began < 2
        assert_error(client.post("/v1/decisions", json=decision()), 503)
        release.set()
        for _ in range(300):
            if client.get("/ping").status_code == 200:
                break
            threading.Event().wait(0.1)
        assert client.get("/ping").status_code == 200
        assert client.post("/v1/decisions", json=decision()).status_code == 200


def test_failed_load_is_reported():
    from starlette.testclient import TestClient

    from llamadecide.errors import ModelLoadError
    from llamadecide.server import create_app
    from llamadecide.settings import Settings

    def broken(settings):
        raise ModelLoadError("model file not found: /opt/ml/model/missing.gguf")

    with TestClient(create_app(Settings(), engine_factory=broken)) as client:
        for _ in range(50):
            if client.get("/health").json()["status"] == "error":
                break
            threading.Event().wait(0.05)
        assert client.get("/ping").status_code == 503
        assert "missing.gguf" in client.get("/health").json()["error"]


def test_fifty_concurrent_mixed_requests(server):
    bodies = [
        ("/v1/decisions", decision()),
        ("/v1/systemone", {"state": TICKET, "questions": {"n": {"type": "noul", "instructions": "refund?"}}}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        ("/invocations", decision()),
    ]

    async def run():
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=120) as client:
            sent = (bodies[i % 4] for i in range(50))
            return await asyncio.gather(*(client.post(path, json=body) for path, body in sent))

    responses = asyncio.run(run())
    assert len(responses) == 50
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= 17  # the queue admits 16 waiting + 1 running at once
    for r in responses:
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "overloaded" and r.headers.get("retry-after")
    assert httpx.get(f"{server.url}/health", timeout=120).json()["status"] == "ok"


def _decode_calls(server) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=AUTH, timeout=30).text
    return float(re.search(r"^llamadecide_engine_decode_calls_total (\S+)$", text, re.M).group(1))


def test_disconnected_stream_frees_the_engine(server, engine):
    """A stream that would run 400 tokens (end-of-turn forbidden) stops within a few tokens of its
    client hanging up: the engine's decode calls (one a token) stop well short of 400, and the next
    request is served."""
    forbidden = {str(t): -100 for t in {*engine.tokenize("<|im_end|>"), *engine.tokenize("<|endoftext|>")}}
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 400,
        "logit_bias": forbidden,
        "stream": True,
    }
    before = _decode_calls(server)
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60) as response:
        for _ in response.iter_lines():
            break  # read one event, then hang up
    settled, previous = _decode_calls(server), -1.0
    while settled != previous:  # until the generation has stopped
        time.sleep(0.5)
        previous, settled = settled, _decode_calls(server)
    assert settled - before < 200  # to its end it would have taken 400 calls
    quick = httpx.post(f"{server.url}/v1/decisions", json=decision(), headers=AUTH, timeout=30)
    assert quick.status_code == 200


def test_probability_log(server):
    post(
        server,
        "/v1/decisions",
        decision(questions=[CHOICE, {"type": "predicate", "instructions": "Angry?", "name": "angry"}]),
    )
    lines = server.probability_log.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is whole JSON, even under concurrency
    last = records[-2:]
    assert [r["question"]["type"] for r in last] == ["choice", "predicate"]
    for r in last:
        assert len(r["model_sha256"]) == 64 and r["prompt_format"] == "llamadecide-1" and r["request_id"]
        assert abs(sum(r["probabilities"]) - 1) < 1e-9 and r["chosen"] in r["options"] and r["latency_ms"] > 0
        assert r["usage"]["input_tokens"] > 0 and 0 <= r["usage"]["cached_tokens"] <= r["usage"]["input_tokens"]
    assert API_KEY not in server.probability_log.read_text()


def test_metrics(server):
    post(server, "/v1/decisions", decision())
    text = httpx.get(f"{server.url}/metrics", headers=AUTH, timeout=120).text
    assert 'llamadecide_requests_total{route="/v1/decisions",status="200"}' in text
    assert "llamadecide_request_seconds_bucket" in text and "llamadecide_queue_depth" in text
    assert 'llamadecide_tokens_total{kind="scored"}' in text and "llamadecide_errors_total" in text
    engine = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("llamadecide_engine_")
    }
    assert engine["llamadecide_engine_decode_calls_total"] >= 1 and engine["llamadecide_engine_rows_total"] >= 8
    assert engine["llamadecide_engine_batch_decisions_count"] >= 1 and "llamadecide_engine_padding_rows_total" in engine
    assert "llamadecide_engine_projections_skipped_total" in engine
    post(server, "/v1/decisions", decision(input="Another input entirely, so the cache cannot serve it."))
    again = httpx.get(f"{server.url}/metrics", headers=AUTH, timeout=120).text
    assert f"llamadecide_engine_batch_decisions_count {engine['llamadecide_engine_batch_decisions_count'] + 1}" in again


def test_the_api_schema_is_served_and_swagger_ui_is_off_by_default(server):
    schema = httpx.get(f"{server.url}/openapi.json", timeout=30)
    assert schema.status_code == 200 and "/v1/decisions" in schema.json()["paths"]
    assert httpx.get(f"{server.url}/docs", timeout=30).status_code == 404  # its page would load scripts from a CDN
