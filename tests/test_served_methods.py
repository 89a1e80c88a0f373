"""Prior correction, rotations and fitted heads over HTTP: requested per call, or fixed by a
served calibration profile; and the callers' mistakes as 4xx errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from conftest import API_KEY, DATA
from llamadecide.calibration.backends import LocalBackend
from llamadecide.calibration.data import load_task, read_labelled
from llamadecide.calibration.fitting import fit_head
from llamadecide.calibration.profile import CalibrationProfile, HeadParams
from llamadecide.decisions import Decider, Scoring, choice
from llamadecide.decisions.measuring import Measurer
from test_server_edges import TICKET, assert_error, decision

ROOT = Path(__file__).resolve().parents[1]
AGNEWS = DATA / "agnews" / "test.tsv"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TEAMS = {
    "type": "choice",
    "instructions": "Which team?",
    "choices": [{"value": "billing"}, {"value": "support"}, {"value": "sales"}],
}


def post(server, body):
    return httpx.post(f"{server.url}/v1/decisions", json=body, headers=AUTH, timeout=120)


def probabilities(response) -> list[float]:
    assert response.status_code == 200, response.text
    return [p["probability"] for p in response.json()["answers"][0]["probabilities"]]


def test_prior_correction_and_rotations_per_request_match_the_library(server, engine):
    decider = Decider(engine)
    question = choice("Which team?", ["billing", "support", "sales"], mode="labels")
    for extension, rule in [
        ({"prior_correction": True}, Scoring(prior_correction=True)),
        ({"rotations": 3}, Scoring(rotations=3)),
        ({"rotations": 3, "prior_correction": True}, Scoring(rotations=3, prior_correction=True)),
    ]:
        served = probabilities(post(server, decision(questions=[TEAMS], llamadecide={"mode": "labels", **extension})))
        local = decider.decide(TICKET, [question], scoring=rule).answers[0].probabilities
        assert served == pytest.approx(local, abs=0.02), extension


def test_bad_method_options_are_4xx(server):
    assert_error(
        post(server, decision(questions=[TEAMS], llamadecide={"rotations": 4})),
        400,
        param="rotations",
        contains="at most 3 rotations",
    )
    assert_error(post(server, decision(llamadecide={"rotations": 0})), 400, param="llamadecide.rotations")
    levels = {"type": "score", "instructions": "How urgent?", "levels": [{"label": "low"}, {"label": "high"}]}
    assert_error(post(server, decision(questions=[levels], llamadecide={"rotations": 2})), 400, contains="ordered")
    assert httpx.get(f"{server.url}/health", timeout=30).json()["status"] == "ok"


def save_head_profile(tmp_path, engine, task, head, name: str, prompt_format: str, layer: int | None = None) -> Path:
    """A profile directory holding `name`.json: the fitted head for the task (reading block `layer`),
    bound to this model."""
    profile = CalibrationProfile(
        name=name,
        created="2026-12-05T00:00:00+00:00",
        model_sha256=engine.model_sha256,
        prompt_format=prompt_format,
        task={
            "type": "choice",
            "instructions": task.instructions,
            "options": task.options,
            "fingerprint": task.fingerprint(),
        },
        mode="text",
        calibrator="head",
        length_normalize=False,
        temperature=1.0,
        method="head",
        head=HeadParams.from_calibrator(head, layer),
        threshold=0.5,
        target_precision=0.9,
        confidence_level=0.95,
        dataset_fingerprint="test",
        metrics={},
    )
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    profile.save(profiles / f"{name}.json")
    return profiles


def profile_request(task, text: str, profile: str) -> dict:
    return {
        "model": "m",
        "input": text,
        "llamadecide": {"profile": profile},
        "questions": [
            {"type": "choice", "instructions": task.instructions, "choices": [{"value": v} for v in task.options]}
        ],
    }


def test_a_served_head_profile_with_a_lexical_expert_gives_the_fitted_heads_probabilities(engine, tmp_path):
    from llamadecide.bench.server_process import ServerProcess

    task = load_task("agnews")
    items = read_labelled(AGNEWS, text_column="0", label_column="1")[:24]
    backend = LocalBackend(engine)
    question = task.question()
    scores = [backend.score(item.text, question, hidden=True) for item in items]
    L = np.array([s.logprobs for s in scores])
    H = np.array([s.hidden for s in scores])
    y = np.array([task.gold_index(item.label) for item in items])
    head = fit_head(L, H, y, C=0.05, texts=[item.text for item in items])
    assert head.lexical is not None and min(head.mix) >= 0.0
    # 24 items leave the fitted fusion weights to chance; fixed ones make both experts count here.
    head = replace(head, mix=(0.5, 1.0))
    profiles = save_head_profile(tmp_path, engine, task, head, "agnews-head", "llamadecide-1")
    assert CalibrationProfile.load(profiles / "agnews-head.json").head.hidden_size == H.shape[1]
    text = "Shares of the chip maker jumped after it raised its revenue forecast."
    body = profile_request(task, text, "agnews-head")
    engine.clear_cache()  # as the fresh server: the same KV layout
    served_scores = backend.score(text, question, hidden=True)
    expected = head.apply(np.array([served_scores.logprobs]), None, np.array([served_scores.hidden]), [text])[0]
    with ServerProcess("--profiles-dir", str(profiles)) as server:
        response = httpx.post(f"{server.url}/v1/decisions", json=body, timeout=120)
        answer = response.json()["answers"][0]
        assert answer["method"] == "head + lexical" and answer["calibrated"] is True
        assert probabilities(response) == pytest.approx(list(expected), abs=0.02)
        refused = httpx.post(
            f"{server.url}/v1/decisions",
            timeout=60,
            json={**body, "llamadecide": {"profile": "agnews-head", "prior_correction": True}},
        )
        assert_error(refused, 400, param="llamadecide.prior_correction")


def test_a_served_head_on_a_blocks_hidden_state_alone_scores_no_answer(engine, tmp_path):
    """A profile's head reads the block it was fitted on (calibrate's depth), served as fitted."""
    from llamadecide.bench.server_process import ServerProcess
    from llamadecide.calibration.config import head_layer
    from llamadecide.decisions.maths import HIDDEN_ONLY
    from llamadecide.engine.model_files import BLOCK_DEPTH

    task = load_task("agnews")
    items = read_labelled(AGNEWS, text_column="0", label_column="1")[:24]
    measurer = Measurer(engine)
    question = task.question()
    layer = head_layer(engine.n_layer, BLOCK_DEPTH)
    H = np.array(
        [measurer.hidden(item.text, question, Scoring(prompt_format="llamadecide-3"), layer=layer) for item in items]
    )
    y = np.array([task.gold_index(item.label) for item in items])
    head = fit_head(np.zeros((len(items), len(task.options))), H, y, C=0.05, features=HIDDEN_ONLY)
    profiles = save_head_profile(tmp_path, engine, task, head, "agnews-hidden", "llamadecide-3", layer)
    assert CalibrationProfile.load(profiles / "agnews-hidden.json").scoring().head.layer == layer is not None
    text = "Shares of the chip maker jumped after it raised its revenue forecast."
    engine.clear_cache()
    state = measurer.hidden(text, question, Scoring(prompt_format="llamadecide-3"), layer=layer)
    expected = head.apply(np.zeros((1, len(task.options))), None, np.array([state]))[0]
    body = profile_request(task, text, "agnews-hidden")
    with ServerProcess("--profiles-dir", str(profiles)) as server:
        response = httpx.post(f"{server.url}/v1/decisions", json=body, timeout=120)
        answer = response.json()["answers"][0]
        assert answer["method"] == "head (hidden state)" and answer["prompt_format"] == "llamadecide-3"
        assert answer["label_mass"] is None and answer["probability_bound"] == 0.0
        assert probabilities(response) == pytest.approx(list(expected), abs=0.02)
        # the second request takes the question prefix the first one pinned from the cache, and says so
        first = response.json()["usage"]["input_tokens_details"]["cached_tokens"]
        again = httpx.post(f"{server.url}/v1/decisions", json=body, timeout=120).json()
        assert again["usage"]["input_tokens_details"]["cached_tokens"] > first + 90


def test_a_profile_with_a_head_must_say_so():
    with pytest.raises(ValueError, match="head parameters exactly when"):
        CalibrationProfile(
            name="x",
            created="",
            model_sha256="0" * 64,
            prompt_format="llamadecide-1",
            task={"type": "predicate", "instructions": "x", "options": [True, False]},
            mode="text",
            calibrator="head",
            length_normalize=False,
            temperature=1.0,
            target_precision=0.9,
            confidence_level=0.95,
            dataset_fingerprint="",
            metrics={},
        )


def test_a_profile_whose_pinned_prefix_leaves_no_room_for_an_input_is_refused_at_load(engine):
    from llamadecide.calibration.profile import DemonstrationParams
    from llamadecide.server.app import fits_context

    def profile(shots: int) -> CalibrationProfile:
        return CalibrationProfile(
            name=f"{shots}-shot",
            created="",
            model_sha256=engine.model_sha256,
            prompt_format="llamadecide-3",
            task={"type": "predicate", "instructions": "The review is positive.", "options": [True, False]},
            mode="text",
            calibrator="none",
            length_normalize=False,
            temperature=1.0,
            target_precision=0.9,
            confidence_level=0.95,
            dataset_fingerprint="",
            metrics={},
            demonstrations=[
                DemonstrationParams(input="A long and winding review of a film. " * 20, option=i % 2)
                for i in range(shots)
            ],
        )

    assert fits_context(Measurer(engine), profile(2), engine) is None
    reason = fits_context(Measurer(engine), profile(40), engine)
    assert reason is not None and "raise n_ctx to at least" in reason and "pinned prefix" in reason
