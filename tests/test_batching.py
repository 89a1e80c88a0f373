"""Many inputs per decode call: every input's answers equal those it gets alone, in the engine, the
Decider, bulk files, SageMaker JSON Lines invocations and a server under concurrent load."""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np
import pytest

from conftest import API_KEY, DATA
from llamadecide.bulk import decide_file, done_lines, read_inputs
from llamadecide.decisions import Decider, DecisionInput, Head, Scoring, choice, maths, predicate
from llamadecide.engine import ScoringInput
from llamadecide.errors import ContextOverflowError

EXACT = 1e-6
TEAMS = ["billing", "technical support", "sales", "account security"]


def _texts(n: int) -> list[str]:
    lines = (DATA / "agnews" / "test.tsv").read_text(encoding="utf-8").splitlines()[1 : n + 1]
    return [line.split("\t")[0] for line in lines]


def test_the_engine_scores_many_inputs_in_shared_calls_each_as_alone(engine):
    """200 inputs (plain, after a pinned prefix, hidden states alone, tries with hidden states) in
    shared calls against each alone: equal to 1e-6 (in practice bit for bit), in fewer calls."""

    def chat(text):
        return engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": text}]))

    answers = [engine.tokenize(f" {a}", special=False) + engine.end_of_answer for a in ("yes", "no", "not sure yet")]
    engine.clear_cache()
    pinned = chat("You sort news items. " * 20)[:-5]
    assert engine.pin_prefix(pinned)
    jobs = []
    for i, text in enumerate(_texts(200)):
        prompt = pinned + chat(text)[1:] if i % 2 else chat(text)
        jobs.append(ScoringInput(prompt) if i % 5 == 0 else ScoringInput(prompt, answers, hidden=i % 3 == 0))
    before = dict(engine.counters)
    together = engine.score_many(jobs)
    calls = engine.counters["decode_calls"] - before["decode_calls"]
    worst = 0.0
    for job, shared in zip(jobs, together):
        if job.continuations:
            alone = engine.score_trie(job.prefix, job.continuations, hidden=job.hidden)
            worst = max(worst, max(float(np.abs(a - b).max()) for a, b in zip(alone.rows, shared.rows)))
            if job.hidden:
                worst = max(worst, float(np.abs(alone.hidden - shared.hidden).max()))
        else:
            worst = max(worst, float(np.abs(engine.hidden_state(job.prefix) - shared.hidden).max()))
    assert worst <= EXACT
    assert calls < len(jobs) / 2  # calls hold up to call_rows rows: a few inputs each
    assert sum(s.cached_tokens > 0 for s in together) >= len(jobs) // 2 - 1  # the pinned prefix, by reference


def test_an_input_scored_alone_leaves_its_prompt_for_the_next_to_reuse(engine):
    """A group of one takes the single-input path, which keeps its prompt in sequence 0: the next
    input evaluates only what follows their common prefix (a lone client's requests share their
    chat header and the text after a pinned question)."""
    header = "Please read the following customer message carefully and classify it. " * 4
    first = engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": header + "My card is lost."}]))
    second = engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": header + "Where is my refund?"}]))
    common = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    engine.clear_cache()
    alone = engine.score_many([ScoringInput(first)])[0].hidden
    rows = engine.counters["rows"]
    engine.score_many([ScoringInput(second)])
    assert engine.counters["rows"] - rows == len(second) - common
    engine.clear_cache()
    assert np.array_equal(engine.score_many([ScoringInput(first), ScoringInput(second)])[0].hidden, alone)


def test_decide_many_equals_decide_and_keeps_a_bad_request_to_itself(engine):
    width = int(engine.metadata["llama.embedding_length"])
    rng = np.random.default_rng(0)
    head = Head(rng.normal(scale=0.05, size=(4, width)), rng.normal(size=4), features=maths.HIDDEN_ONLY)
    topic = choice("Which team?", TEAMS)
    requests = [DecisionInput(text, [topic]) for text in _texts(12)]
    requests += [DecisionInput(text, [topic], Scoring(prompt_format="llamadecide-3", head=head)) for text in _texts(6)]
    requests += [
        DecisionInput("word " * 5000, [topic]),  # cannot fit the context
        DecisionInput("I want a refund.", [topic, predicate("The customer is angry.")]),
    ]
    decider = Decider(engine)
    together = decider.decide_many(requests)
    assert isinstance(together[-2], ContextOverflowError)
    for request, shared in zip(requests, together):
        if isinstance(shared, Exception):
            continue
        engine.clear_cache()
        alone = decider.decide(request.state, request.questions, scoring=request.scoring)
        for a, b in zip(alone.answers, shared.answers):
            assert np.abs(np.array(a.probabilities) - np.array(b.probabilities)).max() <= EXACT


def test_a_bulk_file_is_decided_once_per_line_in_order_and_resumes(engine, tmp_path):
    data = tmp_path / "tickets.jsonl"
    lines = [json.dumps({"id": f"t{i}", "text": text}) for i, text in enumerate(_texts(9))]
    lines.insert(4, "{not json")
    lines.insert(6, json.dumps({"id": "empty"}))
    data.write_text("\n".join(lines) + "\n")
    inputs = list(read_inputs(data))
    question = choice("Which team?", TEAMS)
    decider = Decider(engine)
    whole = tmp_path / "whole.jsonl"
    counts = decide_file(decider, inputs, question, Scoring(), whole, batch=4)
    assert counts == {"decided": 9, "errors": 2, "skipped": 0}
    records = [json.loads(line) for line in whole.read_text().splitlines()]
    assert [r["line"] for r in records] == list(range(1, 12))
    assert "error" in records[4] and "error" in records[6] and records[6]["id"] == "empty"
    assert records[0]["id"] == "t0" and records[0]["usage"]["input_tokens"] > 0
    # interrupted after five whole lines and half a sixth: the run resumes after the fifth
    resumed = tmp_path / "resumed.jsonl"
    text = whole.read_text()
    cut = [i for i, c in enumerate(text) if c == "\n"][4] + 1
    resumed.write_text(text[:cut] + text[cut : cut + 20])
    assert done_lines(resumed) == 5
    counts = decide_file(decider, inputs, question, Scoring(), resumed, batch=4)
    assert counts["skipped"] == 5 and counts["decided"] + counts["errors"] == 6
    again = [json.loads(line) for line in resumed.read_text().splitlines()]
    assert [r["line"] for r in again] == list(range(1, 12))
    for a, b in zip(records, again):
        if "answers" in a:
            assert [p["probability"] for p in a["answers"][0]["probabilities"]] == pytest.approx(
                [p["probability"] for p in b["answers"][0]["probabilities"]], abs=EXACT
            )


def test_the_bulk_command_writes_a_line_per_input(tmp_path):
    from typer.testing import CliRunner

    from llamadecide.cli.main import app

    data = tmp_path / "in.csv"
    data.write_text("id,text\n1,I was charged twice\n2,The app crashes\n")
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "decide",
            "--data",
            str(data),
            "--out",
            str(out),
            "--id-column",
            "id",
            "-q",
            "Which team?",
            "-o",
            "billing",
            "-o",
            "technical support",
        ],
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["1", "2"] and all(len(r["answers"][0]["probabilities"]) == 2 for r in records)


AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _body(text: str) -> dict:
    return {
        "model": "m",
        "input": text,
        "questions": [{"type": "choice", "instructions": "Which team?", "choices": [{"value": t} for t in TEAMS]}],
    }


def test_invocations_take_json_lines_and_answer_a_line_per_record(server):
    texts = _texts(3)
    records = [
        json.dumps(_body(texts[0])),
        "{broken",
        json.dumps(
            {"state": texts[1], "questions": {"team": {"type": "choice", "criteria": {t: None for t in TEAMS}}}}
        ),
        json.dumps(_body(texts[2])),
    ]
    response = httpx.post(
        f"{server.url}/invocations",
        content="\n".join(records) + "\n",
        timeout=300,
        headers={**AUTH, "Content-Type": "application/jsonlines"},
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/jsonlines")
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert len(lines) == 4
    assert lines[1]["error"]["type"] == "invalid_request_error" and lines[1]["status"] == 400
    assert "team" in lines[2]["answers"]
    for index, text in ((0, texts[0]), (3, texts[2])):
        alone = httpx.post(f"{server.url}/v1/decisions", json=_body(text), headers=AUTH, timeout=120).json()
        assert [p["probability"] for p in lines[index]["answers"][0]["probabilities"]] == pytest.approx(
            [p["probability"] for p in alone["answers"][0]["probabilities"]], abs=EXACT
        )


def _metrics(server) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", headers=AUTH, timeout=120).text
    return {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    }


def test_concurrent_requests_share_calls_and_answer_as_alone(server):
    """Eight clients at once: the server serves them in fewer shared engine runs than requests and in
    fewer llama_decode calls than the same requests one at a time (both from /metrics), and every
    answer equals the one the request gets alone to 1e-6."""
    texts = _texts(8)
    calls = "llamadecide_engine_decode_calls_total"
    runs, served = "llamadecide_engine_batch_decisions_count", "llamadecide_engine_batch_decisions_sum"
    before = _metrics(server)
    alone = [httpx.post(f"{server.url}/v1/decisions", json=_body(t), headers=AUTH, timeout=120).json() for t in texts]
    between = _metrics(server)
    assert between[runs] - before[runs] == len(texts) and between[served] - before[served] == len(texts)
    got: dict[int, dict] = {}
    start = threading.Barrier(len(texts))

    def send(i: int) -> None:
        start.wait()
        got[i] = httpx.post(f"{server.url}/v1/decisions", json=_body(texts[i]), headers=AUTH, timeout=300).json()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    after = _metrics(server)
    assert after[served] - between[served] == len(texts)
    assert after[runs] - between[runs] < len(texts)  # some requests shared an engine run
    assert after[calls] - between[calls] < between[calls] - before[calls]  # and so fewer llama_decode calls
    for i, expected in enumerate(alone):
        assert [p["probability"] for p in got[i]["answers"][0]["probabilities"]] == pytest.approx(
            [p["probability"] for p in expected["answers"][0]["probabilities"]], abs=EXACT
        )
