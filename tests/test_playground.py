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
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"],
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
            rows = page.eval_on_selector_all(".bar", "rows => rows.map(r => [r.dataset.option, Number(r.dataset.probability), r.querySelector('.value').textContent, r.querySelector('.fill').style.width])")
            page.screenshot(path=str(tmp_path / "playground.png"))
        finally:
            browser.close()
    api = httpx.post(f"{server.url}/v1/decisions", headers={"Authorization": f"Bearer {API_KEY}"}, json={
        "model": "m", "input": state, "llamadecide": {"mode": "text"},
        "questions": [{"type": "choice", "instructions": "Which team should handle this ticket?", "choices": [{"value": o} for o in options]}],
    }, timeout=120).json()["answers"][0]
    expected = {p["value"]: p["probability"] for p in api["probabilities"]}
    assert sorted(r[0] for r in rows) == sorted(options)
    for option, probability, shown, width in rows:
        assert probability == pytest.approx(expected[option], abs=1e-9)
        assert shown == f"{expected[option]:.3f}"
        assert width == f"{expected[option] * 100:.1f}%"
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)  # largest bar first
