"""People in the loop on a real server: served decisions enter the label store, escalations and the
audit the review queue; labels come back through /v1/labels and /invocations; bad input is refused
in the error envelope with nothing written; the audited precision shows in /metrics and /health;
a new profile version in the profiles folder is served without a restart."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from conftest import API_KEY
from llamadecide.bench.server_process import ServerProcess
from llamadecide.calibration.profile import CalibrationProfile
from llamadecide.labels.sqlite_store import SqliteLabelStore

AUTH = {"Authorization": f"Bearer {API_KEY}"}
TEAMS = ["billing", "technical support", "sales"]


def profile(engine, version: int = 1, threshold: float | None = 0.0) -> CalibrationProfile:
    """A zero-shot profile for the test model whose threshold sends every answer the same way, with a
    loose target so that three audited labels can already tell."""
    return CalibrationProfile(
        name="teams",
        created=f"2026-12-0{version}T00:00:00+00:00",
        version=version,
        model_sha256=engine.model_sha256,
        prompt_format="llamadecide-1",
        task={"type": "choice", "instructions": "Which team should handle this ticket?", "options": TEAMS},
        mode="text",
        calibrator="none",
        length_normalize=False,
        temperature=1.0,
        threshold=threshold,
        target_precision=0.5,
        confidence_level=0.5,
        dataset_fingerprint="test",
        metrics={},
    )


@pytest.fixture(scope="module")
def served(engine, tmp_path_factory):
    """A server with a label store, every automatic decision audited (so the tests can tell), and a
    profiles folder polled twice a second."""
    folder = tmp_path_factory.mktemp("reviews")
    profiles = folder / "profiles"
    profiles.mkdir()
    profile(engine).save(profiles / "teams-v1.json")
    store = folder / "labels.sqlite"
    process = ServerProcess(
        "--api-key",
        API_KEY,
        "--label-store",
        str(store),
        "--audit-rate",
        "1.0",
        "--profiles-dir",
        str(profiles),
        "--profiles-poll",
        "0.5",
        env={"LLAMADECIDE_MAX_BODY_BYTES": "65536"},
        log_dir=folder,
    )
    process.store, process.profiles = store, profiles
    with process:
        yield process


def decide(server, text: str, **extension) -> httpx.Response:
    body = {
        "model": "m",
        "input": text,
        "questions": [
            {
                "type": "choice",
                "instructions": "Which team should handle this ticket?",
                "choices": [{"value": t} for t in TEAMS],
            }
        ],
        "llamadecide": extension,
    }
    response = httpx.post(f"{server.url}/v1/decisions", headers=AUTH, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response


def reviews(server, **params) -> list[dict]:
    response = httpx.get(f"{server.url}/v1/reviews", headers=AUTH, params={"limit": 500, **params}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def label(server, *labels: dict, path: str = "/v1/labels") -> httpx.Response:
    return httpx.post(f"{server.url}{path}", headers=AUTH, json={"labels": list(labels)}, timeout=30)


def test_an_escalation_enters_the_queue_and_its_label_comes_back(served):
    response = decide(served, "I was charged twice for one order.", threshold=1.0)
    request_id = response.headers["x-request-id"]
    assert response.json()["answers"][0]["action"] == "escalate"
    [waiting] = [r for r in reviews(served) if r["id"] == request_id]
    assert waiting["input"] == "I was charged twice for one order." and waiting["options"] == TEAMS
    assert waiting["question"] == "0" and len(waiting["probabilities"]) == 3
    assert not {"origin", "chance", "action"} & set(waiting)  # the reviewer is blind to why it is there
    created = label(served, {"id": request_id, "question": 0, "label": "billing"})
    assert created.status_code == 201 and created.json()["count"] == 1
    assert request_id not in {r["id"] for r in reviews(served)}
    assert label(served, {"id": request_id, "question": "0", "label": "sales"}).status_code == 201  # replaced
    store = SqliteLabelStore(served.store)
    try:
        [record] = [r for r in store.labelled() if r.item.id == request_id]
        assert (record.label, record.item.origin, record.item.chance) == ("sales", "escalated", 1.0)
        assert [h[0] for h in store.history(request_id, "0")] == ["billing", "sales"]
    finally:
        store.close()


def test_bad_labels_are_refused_in_the_envelope_with_nothing_written(served):
    request_id = decide(served, "Please reset my password.", threshold=1.0).headers["x-request-id"]
    good = {"id": request_id, "question": 0, "label": "technical support"}
    cases = [
        ({"labels": [good, {"id": "never-served", "question": 0, "label": "billing"}]}, 404, "unknown_decision"),
        ({"labels": [good, {"id": request_id, "question": 0, "label": "marketing"}]}, 422, "undeclared_label"),
        ({"labels": [good, {"id": request_id, "question": 0, "label": 1}]}, 422, "undeclared_label"),
        ({"labels": [good, {"id": request_id, "question": 0, "label": ["billing"]}]}, 400, None),
        ({"labels": [{**good, "note": "x"}]}, 400, None),
        ({"labels": []}, 400, None),
        ({"labels": [{"id": "x", "question": 0, "label": "sales"}] * 1001}, 400, None),  # over the list's bound
    ]
    for body, status, code in cases:
        response = httpx.post(f"{served.url}/v1/labels", headers=AUTH, json=body, timeout=30)
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]["message"] and response.json()["error"]["code"] == code
    assert httpx.post(f"{served.url}/v1/labels", json={"labels": [good]}, timeout=30).status_code == 401
    malformed = httpx.post(
        f"{served.url}/v1/labels", headers={**AUTH, "Content-Type": "application/json"}, content=b"{"
    )
    assert malformed.status_code == 400
    oversized = httpx.post(f"{served.url}/v1/labels", headers=AUTH, json={"labels": [good] * 900})
    assert oversized.status_code == 413
    assert request_id in {r["id"] for r in reviews(served)}  # nothing of those bodies was written
    assert httpx.get(f"{served.url}/health", timeout=30).json()["status"] == "ok"
    assert label(served, good).status_code == 201  # and the store still takes a good one


def test_labels_come_in_through_invocations_as_sagemaker_sends_them(served):
    request_id = decide(served, "Can I get a discount for ten seats?", threshold=1.0).headers["x-request-id"]
    response = label(served, {"id": request_id, "question": 0, "label": "sales"}, path="/invocations")
    assert response.status_code == 201 and response.json()["count"] == 1


def test_audited_precision_and_its_bound_show_per_profile_and_alert_when_below_target(served):
    """Every automatic decision is audited here (audit rate 1): three labelled wrong put the audited
    precision at 0, its bound below the loose target, /health warns and the alert gauge is 1."""
    for text in ("My card payment failed.", "The app crashes on start.", "I want to buy more licences."):
        answer = decide(served, text, profile="teams").json()["answers"][0]
        assert answer["action"] == "auto"
    audited = [r for r in reviews(served, profile="teams")]
    assert len(audited) >= 3
    for item in audited:
        wrong = next(t for t in TEAMS if t != TEAMS[max(range(3), key=item["probabilities"].__getitem__)])
        assert label(served, {"id": item["id"], "question": item["question"], "label": wrong}).status_code == 201
    metrics = httpx.get(f"{served.url}/metrics", headers=AUTH, timeout=30).text
    assert re.search(r'llamadecide_audit_precision\{profile="teams"\} 0\.0', metrics)
    assert re.search(r'llamadecide_audit_alert\{profile="teams"\} 1\.0', metrics)
    assert re.search(r'llamadecide_decisions_total\{action="auto",profile="teams"\} [1-9]', metrics)
    assert re.search(r'llamadecide_labels_total\{profile="teams"\} [3-9]', metrics)
    health = httpx.get(f"{served.url}/health", timeout=30).json()
    assert health["status"] == "ok" and any("teams" in w and "below the target" in w for w in health["warnings"])
    deadline = time.monotonic() + 20  # the upkeep task looks every profiles_poll seconds
    while "below the target" not in served.log() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert re.search(r"profile teams: audited precision 0\.000, lower bound 0\.000 below the target", served.log())


def test_a_new_profile_version_is_served_without_a_restart(served, engine):
    profile(engine, version=2, threshold=1.0).save(served.profiles / "teams-v2.json")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = httpx.get(f"{served.url}/v1/profiles", headers=AUTH, timeout=30).json()
        if [p.get("version") for p in listed["data"]] == [2]:
            break
        time.sleep(0.25)
    assert [p["version"] for p in listed["data"]] == [2]  # one version per name: the highest
    assert "teams-v1.json" in json.dumps(listed["superseded"])
    answer = decide(served, "Where is my invoice?", profile="teams").json()["answers"][0]
    assert answer["action"] == "escalate"  # version 2's threshold
    store = SqliteLabelStore(served.store)
    try:
        newest = max((i for i in store.pending(limit=500, task="teams")), key=lambda i: i.created)
        assert newest.version.startswith("teams@2-")
    finally:
        store.close()
