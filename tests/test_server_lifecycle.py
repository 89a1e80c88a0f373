"""A real server under overload, abandonment and shutdown: admission before a stream starts,
abandoned work that never reaches (or stops holding) the engine, and a bounded drain on SIGTERM."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from llamadecide.bench.server_process import ServerProcess

TICKET = "I was charged twice for my subscription this month and I want a refund."
DECISION = {
    "model": "m",
    "input": TICKET,
    "questions": [
        {"type": "choice", "instructions": "Which team?", "choices": [{"value": "billing"}, {"value": "support"}]}
    ],
}


def long_generation(engine, max_tokens: int = 2000) -> dict:
    """A chat that cannot end early: every end-of-generation token is forbidden."""
    banned = {str(t): -100 for t in {engine.eos_id, *engine.end_of_answer} if t >= 0}
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "Count from one to ten thousand in words."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logit_bias": banned,
    }


def post_in_background(url: str, body: dict, timeout: float = 120):
    result: dict = {}

    def run():
        try:
            result["response"] = httpx.post(url, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def queue_depth(server) -> int:
    return httpx.get(f"{server.url}/health", timeout=10).json()["queue_depth"]


def test_a_full_queue_refuses_a_stream_before_it_starts(engine, tmp_path):
    with ServerProcess(env={"LLAMADECIDE_QUEUE_SIZE": "1"}, log_dir=tmp_path) as server:
        busy = [post_in_background(f"{server.url}/v1/chat/completions", long_generation(engine, 400)) for _ in range(2)]
        assert wait_until(lambda: queue_depth(server) == 2, 30)
        body = {**long_generation(engine, 5), "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as response:
            assert response.status_code == 503 and response.headers.get("retry-after")
            assert json.loads(response.read())["error"]["code"] == "overloaded"
        for thread, _ in busy:
            thread.join(120)


def test_abandoned_requests_never_reach_the_engine_and_an_abandoned_generation_stops(engine, tmp_path):
    log = tmp_path / "probabilities.jsonl"
    with ServerProcess("--probability-log", str(log), log_dir=tmp_path) as server:
        # a generation that would hold the engine for minutes; its client gives up after 2 s, and
        # the engine is free again within a few tokens
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server.url}/v1/chat/completions", json=long_generation(engine), timeout=2)
        assert wait_until(lambda: queue_depth(server) == 0, 15)
        # while another client's generation holds the engine, a decision waits; its client gives up
        thread, result = post_in_background(f"{server.url}/v1/chat/completions", long_generation(engine, 300))
        assert wait_until(lambda: queue_depth(server) == 1, 30)
        with pytest.raises(httpx.TimeoutException):
            httpx.post(
                f"{server.url}/v1/decisions", json=DECISION, headers={"X-Request-Id": "abandoned-1"}, timeout=0.5
            )
        thread.join(120)
        assert result["response"].status_code == 200
        assert wait_until(lambda: queue_depth(server) == 0, 15)
        assert (
            httpx.post(
                f"{server.url}/v1/decisions", json=DECISION, headers={"X-Request-Id": "served-1"}, timeout=60
            ).status_code
            == 200
        )
        logged = {json.loads(line)["request_id"] for line in log.read_text().splitlines()}
        assert "served-1" in logged and "abandoned-1" not in logged


def test_sigterm_drains_for_a_bounded_time_then_refuses_the_rest(engine, tmp_path):
    server = ServerProcess(env={"LLAMADECIDE_DRAIN_TIMEOUT": "2"}, log_dir=tmp_path).start()
    try:
        running = post_in_background(f"{server.url}/v1/chat/completions", long_generation(engine))
        assert wait_until(lambda: queue_depth(server) == 1, 30)
        waiting = [post_in_background(f"{server.url}/v1/decisions", DECISION) for _ in range(2)]
        assert wait_until(lambda: queue_depth(server) == 3, 30)
        began = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=20)
        assert time.monotonic() - began < 10  # 2 s of drain, then exit; the generation alone would take minutes
        for thread, result in [running, *waiting]:
            thread.join(10)
            response = result["response"]
            assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"
    finally:
        server.stop()


def test_work_is_bounded_before_the_engine_and_in_time_on_it(engine, tmp_path):
    env = {"LLAMADECIDE_MAX_REQUEST_ROWS": "4000", "LLAMADECIDE_REQUEST_TIMEOUT": "1"}
    with ServerProcess(env=env, log_dir=tmp_path) as server:
        many = {
            "model": "m",
            "input": TICKET,
            "questions": [{"type": "predicate", "instructions": f"Statement number {i} holds."} for i in range(120)],
        }
        refused = httpx.post(f"{server.url}/v1/decisions", json=many, timeout=60)
        error = refused.json()["error"]
        assert refused.status_code == 400 and "limit is 4000 (max_request_rows)" in error["message"]
        assert "needs about" in error["message"] and error["param"] == "questions"
        rotated = {**DECISION, "llamadecide": {"rotations": 9}}
        refused = httpx.post(f"{server.url}/v1/decisions", json=rotated, timeout=60)
        assert refused.status_code == 400 and "max_rotations" in refused.json()["error"]["message"]
        # a generation past the 1 s limit ends with 504 and frees the engine
        late = httpx.post(f"{server.url}/v1/chat/completions", json=long_generation(engine), timeout=60)
        assert late.status_code == 504 and late.json()["error"]["code"] == "request_timeout"
        assert queue_depth(server) == 0
        assert httpx.post(f"{server.url}/v1/decisions", json=DECISION, timeout=60).status_code == 200


def test_options_that_cannot_fit_are_refused_quickly_with_the_counts(tmp_path):
    with ServerProcess(log_dir=tmp_path, env={"LLAMADECIDE_N_CTX": "4096"}) as server:
        body = {
            "model": "m",
            "input": TICKET,
            "questions": [
                {
                    "type": "choice",
                    "instructions": "Which?",
                    "name": "huge",
                    "choices": [{"value": f"option {i} " + "long words " * 14} for i in range(255)],
                }
            ],
        }
        refused = httpx.post(f"{server.url}/v1/decisions", json=body, timeout=60)
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["code"] == "context_length_exceeded"
        assert "question 'huge'" in error["message"] and "the context holds 4096" in error["message"]
