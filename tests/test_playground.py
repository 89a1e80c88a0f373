"""The playground page in a real headless browser (Debian's chromium, driven by Playwright)."""

from __future__ import annotations

import shutil

import httpx
import pytest

from conftest import API_KEY

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/test.sh installs it)")


def test_playground_shows_bars_matching_the_api(server, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    state = "My card was stolen yesterday and someone used it."
    options = ["billing", "account security", "technical support"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            assert page.title() == "llamadecide playground"
            page.fill("#state", state)
            page.fill("#question", "Which team should handle this ticket?")
            page.fill("#options", "\n".join(options))
            page.fill("#key", API_KEY)
            page.click("#run")
            page.wait_for_selector(".bar", timeout=120_000)
            rows = page.eval_on_selector_all(
                ".bar",
                "rows => rows.map(r => [r.dataset.option, Number(r.dataset.probability), "
                "r.querySelector('.value').textContent, r.querySelector('.fill').style.width])",
            )
            page.screenshot(path=str(tmp_path / "playground.png"))
        finally:
            browser.close()
    api = httpx.post(
        f"{server.url}/v1/decisions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={
            "model": "m",
            "input": state,
            "llamadecide": {"mode": "text"},
            "questions": [
                {
                    "type": "choice",
                    "instructions": "Which team should handle this ticket?",
                    "choices": [{"value": o} for o in options],
                }
            ],
        },
        timeout=120,
    ).json()["answers"][0]
    expected = {p["value"]: p["probability"] for p in api["probabilities"]}
    assert sorted(r[0] for r in rows) == sorted(options)
    for option, probability, shown, width in rows:
        assert probability == pytest.approx(expected[option], abs=1e-9)
        assert shown == f"{expected[option]:.3f}"
        assert width == f"{expected[option] * 100:.1f}%"
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)  # largest bar first


def test_playground_asks_predicates_and_scores_and_shows_a_profiles_action(engine, tmp_path):
    """Predicate and score questions, and a loaded calibration profile: its question filled in and
    the action its threshold gives (act automatically or escalate), as the API answers."""
    sync_api = pytest.importorskip("playwright.sync_api")
    from llamadecide.bench.server_process import ServerProcess
    from llamadecide.calibration.profile import CalibrationProfile

    options = ["billing", "account security", "technical support"]
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    CalibrationProfile(
        name="teams",
        created="now",
        model_sha256=engine.model_sha256,
        prompt_format="llamadecide-1",
        task={"type": "choice", "instructions": "Which team should handle this ticket?", "options": options},
        mode="text",
        calibrator="none",
        length_normalize=False,
        temperature=1.0,
        threshold=0.1,
        target_precision=0.9,
        confidence_level=0.95,
        dataset_fingerprint="",
        metrics={},
    ).save(profiles / "teams.json")
    state = "My card was stolen yesterday and someone used it."
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with (
        ServerProcess("--api-key", API_KEY, "--profiles-dir", str(profiles), log_dir=tmp_path) as server,
        sync_api.sync_playwright() as p,
    ):
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.fill("#key", API_KEY)
            page.dispatch_event("#key", "change")  # loads the profiles the key may see
            page.fill("#state", state)

            def decide() -> list:
                page.evaluate("document.getElementById('result').replaceChildren()")
                page.click("#run")
                page.wait_for_selector(".bar", timeout=120_000)
                return page.eval_on_selector_all(
                    ".bar", "rows => rows.map(r => [r.dataset.option, Number(r.dataset.probability)])"
                )

            page.select_option("#type", "predicate")
            assert page.is_hidden("#options")
            page.fill("#question", "The customer reports a stolen card.")
            shown = dict(decide())
            api = httpx.post(
                f"{server.url}/v1/decisions",
                headers=auth,
                timeout=120,
                json={
                    "model": "m",
                    "input": state,
                    "questions": [{"type": "predicate", "instructions": "The customer reports a stolen card."}],
                },
            ).json()["answers"][0]
            assert shown["true"] == pytest.approx(api["probability"], abs=1e-9)
            assert shown["false"] == pytest.approx(1 - api["probability"], abs=1e-9)

            page.select_option("#type", "score")
            page.fill("#question", "How urgent is this ticket?")
            page.fill("#options", "low\nmedium\nhigh")
            assert sorted(name for name, _ in decide()) == ["high", "low", "medium"]  # level names, not numbers

            page.wait_for_function("document.querySelectorAll('#profile option').length > 1", timeout=30_000)
            page.select_option("#profile", "teams")
            assert page.input_value("#question") == "Which team should handle this ticket?"
            assert page.input_value("#options").splitlines() == options and page.is_disabled("#options")
            rows = dict(decide())
            page.wait_for_selector("#action[data-action]")
            shown_action = page.get_attribute("#action", "data-action")
            action_text = page.text_content("#action")
            page.screenshot(path=str(tmp_path / "playground-profile.png"))
        finally:
            browser.close()
        api = httpx.post(
            f"{server.url}/v1/decisions",
            headers=auth,
            timeout=120,
            json={
                "model": "m",
                "input": state,
                "llamadecide": {"profile": "teams"},
                "questions": [
                    {
                        "type": "choice",
                        "instructions": "Which team should handle this ticket?",
                        "choices": [{"value": o} for o in options],
                    }
                ],
            },
        ).json()["answers"][0]
    assert shown_action == api["action"] and "threshold 0.10" in action_text
    for item in api["probabilities"]:
        assert rows[item["value"]] == pytest.approx(item["probability"], abs=1e-9)
