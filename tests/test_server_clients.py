"""The real clients against a real server process: the official openai SDK and typesafe-sdk."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types import Decision
from openai.types.chat import ChatCompletion
from typesafe_sdk import RetryPolicy

from conftest import API_KEY

NO_RETRY = RetryPolicy(max_retries=0)  # a slow answer on a busy machine must not be sent twice

TICKET = "I was charged twice for my subscription this month and I want a refund for the second payment."


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120.0)


def test_chat_completion(client):
    reply = client.chat.completions.create(
        model="anything", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0
    )
    assert isinstance(reply, ChatCompletion)
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content
    assert reply.usage.completion_tokens <= 8 and reply.usage.prompt_tokens > 5
    assert reply.model == "SmolLM2-135M-Instruct.Q4_1"


def test_chat_streaming_matches_plain(client):
    messages = [{"role": "user", "content": "Count to five."}]
    plain = client.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0)
    stream = client.chat.completions.create(
        model="m", messages=messages, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == plain.choices[0].message.content
    assert finish == plain.choices[0].finish_reason
    assert usage.completion_tokens == plain.usage.completion_tokens


def test_chat_logprobs_and_json_mode(client):
    reply = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Say yes."}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = reply.choices[0].logprobs.content
    assert content and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)
    data = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Give a JSON object with a name."}],
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if data.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(data.choices[0].message.content), dict)


def test_decisions_with_the_openai_sdk(client):
    decision = client.decisions.create(
        model="anything",
        input=TICKET,
        questions=[
            {"type": "predicate", "instructions": "The customer asks for money back.", "name": "refund"},
            {
                "type": "choice",
                "instructions": "Which team?",
                "choices": [{"value": "billing"}, {"value": "technical support"}],
            },
            {
                "type": "choice",
                "instructions": "Is this urgent?",
                "choices": [{"value": True}, {"value": False}],
                "name": "urgent",
            },
            {
                "type": "score",
                "instructions": "How upset is the customer?",
                "levels": [
                    {"label": "calm"},
                    {"label": "annoyed"},
                    {"label": "furious", "description": "threatens to leave"},
                ],
            },
        ],
    )
    assert isinstance(decision, Decision)
    refund, team, urgent, upset = decision.answers
    assert refund.type == "predicate" and refund.name == "refund" and 0 < refund.probability < 1
    assert team.type == "choice" and team.choice in ("billing", "technical support")
    assert sum(p.probability for p in team.probabilities) == pytest.approx(1.0)
    assert urgent.choice in (True, False) and all(isinstance(p.value, bool) for p in urgent.probabilities)
    assert (
        upset.type == "score"
        and 0 <= upset.score <= 2
        and [p.label for p in upset.probabilities] == ["calm", "annoyed", "furious"]
    )
    assert [p.value for p in upset.probabilities] == [0, 1, 2]
    assert decision.usage.input_tokens > 0 and decision.usage.output_tokens == 0


def test_typed_choice_values_that_read_alike_are_answered(client):
    """The Decisions format allows typed values: True and "true" are two options, shown to the
    model as JSON (true, "true") so it can tell them apart, and returned with their own types."""
    decision = client.decisions.create(
        model="anything",
        input=TICKET,
        questions=[
            {
                "type": "choice",
                "instructions": "Should this be escalated?",
                "choices": [{"value": True}, {"value": "true"}, {"value": False}, {"value": "false"}],
            }
        ],
    )
    values = [p.value for p in decision.answers[0].probabilities]
    assert values == [True, "true", False, "false"] and [type(v) for v in values] == [bool, str, bool, str]
    assert sum(p.probability for p in decision.answers[0].probabilities) == pytest.approx(1.0)


def test_decisions_extension_fields(server):
    body = {
        "model": "m",
        "input": TICKET,
        "llamadecide": {"threshold": 0.5},
        "questions": [
            {"type": "choice", "instructions": "Which team?", "choices": [{"value": "billing"}, {"value": "sales"}]}
        ],
    }
    answer = httpx.post(
        f"{server.url}/v1/decisions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    ).json()["answers"][0]
    assert answer["action"] == ("auto" if answer["confidence"] >= 0.5 else "escalate")
    assert answer["prompt_format"] == "llamadecide-1" and 0 < answer["label_mass"] <= 1
    assert answer["calibrated"] is False


def test_string_and_message_list_inputs_are_the_same_prompt(server):
    question = [{"type": "predicate", "instructions": "The customer wants a refund."}]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    as_text = httpx.post(
        f"{server.url}/v1/decisions",
        json={"model": "m", "input": TICKET, "questions": question},
        headers=headers,
        timeout=120,
    ).json()
    as_messages = httpx.post(
        f"{server.url}/v1/decisions",
        headers=headers,
        json={
            "model": "m",
            "questions": question,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": TICKET}]}],
        },
        timeout=120,
    ).json()
    assert as_text["answers"][0]["probability"] == pytest.approx(as_messages["answers"][0]["probability"], abs=1e-9)


def test_conversation_and_tool_items_are_rendered(server):
    body = {
        "model": "m",
        "questions": [{"type": "predicate", "instructions": "The refund was issued."}],
        "input": [
            {"role": "user", "content": "Refund my order 42"},
            {"type": "function_call", "call_id": "c1", "name": "refund", "arguments": '{"order": 42}'},
            {"type": "function_call_output", "call_id": "c1", "output": '{"status": "refunded"}'},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        ],
    }
    response = httpx.post(
        f"{server.url}/v1/decisions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    )
    assert response.status_code == 200, response.text


def test_system_one_with_typesafe_sdk(server, monkeypatch):
    from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

    monkeypatch.setenv("TYPESAFE_BASE_URL", server.url)
    monkeypatch.setenv("TYPESAFE_API_KEY", API_KEY)
    with TypeSafeClient(timeout=120.0, retry=NO_RETRY) as ts:
        result = ts.system_one(
            state=TICKET,
            questions={
                "refund": Noul(instructions="Does the customer ask for money back?"),
                "team": Choice(
                    instructions="Which team?", criteria={"billing": "Payments and invoices", "support": None}
                ),
                "urgency": Score(instructions="How urgent?", criteria=["can wait", "this week", "today"]),
            },
        )
    assert 0 < result.nouls["refund"].noul < 1
    team = result.choices["team"]
    assert team.choice in ("billing", "support") and sum(team.probabilities.values()) == pytest.approx(1.0)
    urgency = result.scores["urgency"]
    assert 0 <= urgency.score <= 2 and len(urgency.probabilities) == 3
    assert result.usage.input_tokens > 0 and result.usage.output_tokens == 0


def test_system_one_zstd_body_over_1kb(server, monkeypatch):
    from typesafe_sdk import Choice, TypeSafeClient

    monkeypatch.setenv("TYPESAFE_BASE_URL", server.url)
    monkeypatch.setenv("TYPESAFE_API_KEY", API_KEY)
    seen = []

    def record(request: httpx.Request) -> None:  # httpx2 event hook: what the SDK really sends
        seen.append(request.headers.get("content-encoding"))

    import httpx2

    recording = httpx2.Client(event_hooks={"request": [record]})
    with TypeSafeClient(compression="zstd", http_client=recording, timeout=120.0, retry=NO_RETRY) as ts:
        long_state = TICKET + " " + "The invoice number is INV-2026-0042. " * 60
        assert len(long_state) > 1024
        result = ts.system_one(
            state=long_state,
            questions={"team": Choice(instructions="Which team?", criteria={"billing": None, "support": None})},
        )
    assert seen == ["zstd"]
    assert result.choices["team"].choice in ("billing", "support")


def test_models_route_serves_both_sdks(client, server, monkeypatch):
    assert [m.id for m in client.models.list()] == ["SmolLM2-135M-Instruct.Q4_1"]
    from typesafe_sdk import TypeSafeClient

    monkeypatch.setenv("TYPESAFE_BASE_URL", server.url)
    monkeypatch.setenv("TYPESAFE_API_KEY", API_KEY)
    with TypeSafeClient(timeout=120.0, retry=NO_RETRY) as ts:
        listed = ts.models.list()
    assert [m.name for m in listed.models] == ["SmolLM2-135M-Instruct.Q4_1"]
