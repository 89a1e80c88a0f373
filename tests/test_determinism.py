"""An answer does not depend on what the server did before: the same request gives the same
probabilities on a fresh engine and after any other traffic (pins, long prompts, chats, decisions
of every size), and the KV cache never runs out of room."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import DATA, engine_config
from llamadecide.decisions import Decider, Demonstration, Head, Scoring, choice, maths, predicate, score
from llamadecide.engine import Engine, SamplingParams, bundled_model_path
from llamadecide.engine.decoder import MIN_CALL_ROWS, plan_calls

EXACT = 1e-6


@pytest.mark.parametrize("n", [1, 5, 7, 8, 9, 63, 64, 65, 127, 200, 511, 1000])
@pytest.mark.parametrize("limit", [63, 512])
def test_call_shapes_are_deterministic(n, limit):
    rng = np.random.default_rng(n)
    for outputs in ([False] * n, [True] * n, list(rng.random(n) < 0.1), [i == n - 1 for i in range(n)]):
        calls = plan_calls(outputs, deterministic=True, limit=limit)
        assert calls[0].start == 0 and calls[-1].end == n
        assert all(a.end == b.start for a, b in zip(calls, calls[1:]))
        for call in calls:
            rows = call.end - call.start
            assert rows + call.padding >= MIN_CALL_ROWS and rows <= limit
            wanted = sum(outputs[call.start : call.end]) + len(call.extra_outputs)
            assert all(not outputs[i] and call.start <= i < call.end for i in call.extra_outputs)
            if wanted:
                assert wanted + call.padding >= MIN_CALL_ROWS


def _intents() -> list[str]:
    path = DATA / "banking77" / "categories.json"
    return json.loads(path.read_text())[:30]


def _requests(engine: Engine) -> list[tuple[str, list, Scoring, float]]:
    """Decisions of every size: (state, questions, scoring, answer bound)."""
    rng = np.random.default_rng(0)
    width = int(engine.metadata["llama.embedding_length"])
    teams = ["billing", "technical support", "sales", "account security", "shipping", "returns"]
    ticket = "I was charged twice for my subscription this month and I want a refund for the second payment."
    long_state = " ".join(f"Line {i}: the parcel left the depot, was scanned twice and then lost." for i in range(40))
    shots = tuple(
        Demonstration(text, option)
        for text, option in [
            ("My card was charged twice.", 0),
            ("The app crashes on start.", 1),
            ("Do you sell gift cards?", 2),
            ("Someone logged into my account.", 3),
            ("Where is my parcel? " * 30, 4),
            ("I want to send it back.", 5),
        ]
    )
    intents = choice("Which banking intent is this?", _intents())
    return [
        (ticket, [choice("Which team?", teams[:2])], Scoring(), 0.0),
        (ticket, [choice("Which team?", teams)], Scoring(), 0.0),
        (long_state, [choice("Which team?", teams[:4]), predicate("The parcel is lost.")], Scoring(), 0.0),
        (ticket, [score("How urgent?", ["low", "medium", "high"])], Scoring(), 0.0),
        (ticket, [choice("Which team?", teams[:4], mode="labels")], Scoring(rotations=2), 0.0),
        (ticket, [choice("Which team?", teams)], Scoring(prompt_format="llamadecide-2"), 0.0),
        (long_state, [choice("Which team?", teams)], Scoring(prompt_format="llamadecide-3", demonstrations=shots), 0.0),
        (
            "Where is my parcel?",
            [choice("Which team?", teams)],
            Scoring(prompt_format="llamadecide-2", demonstrations=shots),
            0.0,
        ),
        (
            ticket,
            [choice("Which team?", teams)],
            Scoring(
                prompt_format="llamadecide-3",
                head=Head(rng.normal(scale=0.05, size=(6, width)), rng.normal(size=6), features=maths.HIDDEN_ONLY),
            ),
            0.0,
        ),
        (
            ticket,
            [choice("Which team?", teams[:3])],
            Scoring(head=Head(rng.normal(scale=0.05, size=(3, 3 + width)), rng.normal(size=3))),
            0.0,
        ),
        ("My card has not arrived yet.", [intents], Scoring(), 0.0),
        ("My card has not arrived yet.", [intents], Scoring(prompt_format="llamadecide-3"), 0.2),
    ]


def test_answers_do_not_depend_on_server_history():
    """A seeded random sequence of pins, long prompts, chats and decisions on a small context (so
    pins give way and prompts are trimmed): nothing raises, and every answer equals the same request
    made on a fresh engine."""
    engine = Engine(engine_config(bundled_model_path(), n_ctx=1536, pinned_prefixes=3, call_cost_rows=16))
    try:
        requests = _requests(engine)
        deciders = {0.0: Decider(engine), 0.2: Decider(engine, max_bound=0.2)}
        fresh: dict[int, list[list[float]]] = {}

        def decide(index: int) -> list[list[float]]:
            state, questions, rule, max_bound = requests[index]
            decision = deciders[max_bound].decide(state, questions, scoring=rule)
            return [answer.probabilities for answer in decision.answers]

        for index in range(len(requests)):
            engine.clear_cache()
            fresh[index] = decide(index)
        rng = np.random.default_rng(1)
        checked = 0
        for step in range(60):
            kind = rng.choice(["decide", "decide", "decide", "chat", "pin", "long"])
            if kind == "decide":
                index = int(rng.integers(len(requests)))
                got = decide(index)
                for a, b in zip(got, fresh[index]):
                    assert np.abs(np.array(a) - np.array(b)).max() <= EXACT, (step, index)
                checked += 1
            elif kind == "chat":
                words = " ".join(
                    rng.choice(["tell", "me", "about", "the", "sea", "and", "sky"], size=int(rng.integers(3, 60)))
                )
                prompt = engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": words}]))
                list(engine.generate(prompt, SamplingParams(max_tokens=int(rng.integers(1, 12)), temperature=0.0)))
            elif kind == "pin":
                text = "Background: " + "the shop opens at nine. " * int(rng.integers(5, 120))
                assert engine.pin_prefix(
                    engine.tokenize_prompt(engine.render_chat([{"role": "system", "content": text}]))
                )
            else:
                words = "word " * int(rng.integers(300, 1400))
                prompt = engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": words}]))[
                    : engine.max_sequence - 4
                ]
                engine.score_continuations(
                    prompt, [engine.tokenize(" yes", special=False), engine.tokenize(" no", special=False)]
                )
        assert checked >= 20
    finally:
        engine.close()


def test_a_prompt_scores_the_same_alone_in_other_chunks_and_beside_a_pin(engine):
    """The same continuation scores from scratch, from a pinned prefix, and after the prompt's first
    half was cached by another request: bit-identical."""
    text = "The weather today is sunny with a light breeze from the west. " * 8
    prompt = engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": text}]))
    answers = [engine.tokenize(" yes", special=False), engine.tokenize(" no", special=False)]
    engine.clear_cache()
    alone = [list(v) for v in engine.score_continuations(prompt, answers)]
    engine.clear_cache()
    assert engine.pin_prefix(prompt[: len(prompt) // 3])
    assert [list(v) for v in engine.score_continuations(prompt, answers)] == alone
    engine.score_continuations(prompt[: len(prompt) // 2] + engine.tokenize(" Other."), answers)
    assert [list(v) for v in engine.score_continuations(prompt, answers)] == alone
    assert engine.last_reused_tokens == len(prompt) // 2
    engine.clear_cache()
