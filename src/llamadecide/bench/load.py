"""Load benchmark over HTTP: latency and throughput by concurrency, the decision endpoint against
"generate an answer and parse it", CPU against GPU, a threads sweep, and cost per 1,000 requests.

    llamadecide bench [--url URL | start a server] [--concurrency 1 4 16] [--requests 48] ...

Per-request records (latency, time to first token for chat, tokens, status, error) are captured,
never raised. Warm-up requests are excluded from every figure.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from llamadecide.calibration.backends import wire_question
from llamadecide.calibration.data import LabelledItem, Task


@dataclass
class Record:
    kind: str
    status: int
    latency_s: float
    ttft_s: float | None = None
    tokens: int | None = None
    error: str | None = None
    correct: bool | None = None
    valid: bool | None = None


def level_question(task: Task, predicate: str | None = None) -> dict:
    """The question every decision request of a level asks, as the wire carries it: the task's, or a
    yes/no predicate. Built once, as a client would (a 77-option question takes milliseconds to build,
    on the cores the server runs on)."""
    return {"type": "predicate", "instructions": predicate} if predicate else wire_question(task.question())


def decision_body(question: dict, item: LabelledItem, *, profile: str | None = None) -> dict:
    """A decision request for an item (under a served calibration profile, when named)."""
    body = {"model": "default", "input": item.text, "questions": [question]}
    if profile:
        body["llamadecide"] = {"profile": profile}
    return body


def chat_body(task: Task, item: LabelledItem) -> dict:
    options = ", ".join(str(o) for o in task.options)
    prompt = f"{item.text}\n\n{task.instructions}\nAnswer with exactly one of: {options}. Write only the answer."
    return {
        "model": "default",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def parse_choice(text: str, options: list[Any]) -> int | None:
    """The option a generated answer names: exact, then case-insensitive, then the first option
    the text starts with. None when it names none of them (an invented or rambling answer)."""
    cleaned = text.strip().strip(".\"'*` ").splitlines()[0].strip() if text.strip() else ""
    names = [str(o) for o in options]
    for i, name in enumerate(names):
        if cleaned == name:
            return i
    for i, name in enumerate(names):
        if cleaned.lower() == name.lower():
            return i
    for i, name in sorted(enumerate(names), key=lambda p: -len(p[1])):
        if re.match(re.escape(name.lower()) + r"\b", cleaned.lower()):
            return i
    return None


async def _one(client: httpx.AsyncClient, kind: str, body: dict, gold: int | None, task: Task) -> Record:
    began = time.perf_counter()
    try:
        if kind == "decision":
            response = await client.post("/v1/decisions", json=body)
            latency = time.perf_counter() - began
            if response.status_code != 200:
                return Record(kind, response.status_code, latency, error=response.text[:200])
            decided = response.json()
            answer = decided["answers"][0]
            probs = (
                [p["probability"] for p in answer["probabilities"]]
                if "probabilities" in answer
                else [answer["probability"], 1 - answer["probability"]]
            )
            return Record(
                kind,
                200,
                latency,
                tokens=decided["usage"]["input_tokens"],
                correct=(int(np.argmax(probs)) == gold) if gold is not None else None,
                valid=True,
            )
        text, ttft, tokens = "", None, None
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                error = (await response.aread()).decode()[:200]
                return Record(kind, response.status_code, time.perf_counter() - began, error=error)
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    piece = choice["delta"].get("content") or ""
                    if piece and ttft is None:
                        ttft = time.perf_counter() - began
                    text += piece
        picked = parse_choice(text, task.options)
        return Record(
            kind,
            200,
            time.perf_counter() - began,
            ttft,
            tokens,
            correct=(picked == gold)
            if gold is not None and picked is not None
            else (False if gold is not None else None),
            valid=picked is not None,
        )
    except Exception as exc:  # a benchmark records failures, it does not stop on them
        return Record(kind, 0, time.perf_counter() - began, error=f"{type(exc).__name__}: {exc}")


ENGINE_METRICS = {  # what a level reads of the server's engine counters (/metrics), before and after it
    "decode_calls": "llamadecide_engine_decode_calls_total",
    "rows": "llamadecide_engine_rows_total",
    "full_depth_rows": "llamadecide_engine_full_depth_rows_total",
    "runs": "llamadecide_engine_batch_decisions_count",
    "decisions": "llamadecide_engine_batch_decisions_sum",
}


async def engine_counters(client: httpx.AsyncClient) -> dict[str, float] | None:
    """The server's engine counters, or None when it does not expose them (another server)."""
    try:
        response = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    values = dict(line.rsplit(" ", 1) for line in response.text.splitlines() if line and not line.startswith("#"))
    if not all(name in values for name in ENGINE_METRICS.values()):
        return None
    return {key: float(values[name]) for key, name in ENGINE_METRICS.items()}


async def run_level(
    url: str,
    api_key: str | None,
    kind: str,
    task: Task,
    items: list[LabelledItem],
    golds: list[int],
    concurrency: int,
    requests: int,
    warmup: int,
    *,
    profile: str | None = None,
    predicate: str | None = None,
) -> tuple[list[Record], float, dict[str, float] | None]:
    """One concurrency level: `requests` measured requests from `concurrency` clients after `warmup`
    unmeasured ones. Returns the records, the wall time, and what the engine did for the measured
    requests (counter deltas from /metrics; None when the server does not expose them)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as client:
        question = level_question(task, predicate)

        def make(task: Task, item: LabelledItem) -> dict:
            if kind == "decision":
                return decision_body(question, item, profile=profile)
            return chat_body(task, item)

        for i in range(warmup):
            await _one(client, kind, make(task, items[i % len(items)]), None, task)
        queue: asyncio.Queue = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)
        records: list[Record] = []

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                item = items[i % len(items)]
                gold = None if predicate else golds[i % len(items)]
                records.append(await _one(client, kind, make(task, item), gold, task))

        before = await engine_counters(client)
        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - began
        after = await engine_counters(client)
        work = {key: after[key] - before[key] for key in ENGINE_METRICS} if before and after else None
        return records, wall, work


def row_seconds(model_path: Path, texts: list[str], *, n_gpu_layers: int = 0, tokens: int = 512) -> float:
    """Seconds the engine takes per row in a large call (a `tokens`-row prompt from the workload's
    texts, from an empty cache; median of three): what a decision's rows cost at best, its floor."""
    from llamadecide.engine import Engine
    from llamadecide.settings import Settings

    settings = Settings(model=str(model_path), n_gpu_layers=n_gpu_layers, n_ctx=max(4096, tokens + 64))
    engine = Engine(settings.engine_config())
    try:
        prompt: list[int] = []
        for text in texts * (tokens // 8 + 1):
            prompt += engine.tokenize(text + "\n\n", special=False)
            if len(prompt) >= tokens:
                break
        prompt = prompt[:tokens]
        engine.prompt_seconds(prompt)  # warm-up
        return statistics.median(engine.prompt_seconds(prompt) for _ in range(3)) / len(prompt)
    finally:
        engine.close()


def floor_figures(summary: dict, work: dict[str, float] | None, seconds_per_row: float | None) -> dict:
    """A decision level against its compute floor: rows and calls per request, decisions per shared
    engine run, the floor (rows, each weighted by the share of the model's blocks its call ran, x
    seconds a full row takes in a large call) and its share of the served seconds per decision at
    that concurrency (1 / throughput)."""
    if not work or not summary.get("ok"):
        return {}
    ok = summary["ok"]
    out = {
        "rows_per_request": work["rows"] / ok,
        "full_depth_rows_per_request": work["full_depth_rows"] / ok,
        "decode_calls_per_request": work["decode_calls"] / ok,
        "decisions_per_engine_run": work["decisions"] / work["runs"] if work["runs"] else None,
    }
    if seconds_per_row:
        out["floor_s_per_request"] = out["full_depth_rows_per_request"] * seconds_per_row
        out["floor_efficiency"] = out["floor_s_per_request"] * summary["throughput_rps"]
    return out


def summarise(records: list[Record], wall_s: float) -> dict:
    ok = [r for r in records if r.status == 200]
    latencies = sorted(r.latency_s for r in ok)

    def pct(q: float) -> float | None:
        return float(np.quantile(latencies, q)) if latencies else None

    out = {
        "requests": len(records),
        "ok": len(ok),
        "error_rate": 1 - len(ok) / len(records) if records else 0.0,
        "p50_s": pct(0.5),
        "p95_s": pct(0.95),
        "p99_s": pct(0.99),
        "mean_s": statistics.fmean(latencies) if latencies else None,
        "throughput_rps": len(ok) / wall_s if wall_s > 0 else 0.0,
        "wall_s": wall_s,
    }
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    if ttfts:
        out["ttft_p50_s"] = float(np.median(ttfts))
    judged = [r for r in ok if r.correct is not None]
    if judged:
        out["accuracy"] = sum(bool(r.correct) for r in judged) / len(judged)
    valid = [r for r in ok if r.valid is not None]
    if valid:
        out["invalid_answer_rate"] = sum(not r.valid for r in valid) / len(valid)
    errors = [r.error for r in records if r.error]
    if errors:
        out["first_error"] = errors[0]
    return out


def asdict_records(records: list[Record]) -> list[dict]:
    return [asdict(r) for r in records]
