"""The review page in a real headless browser (Debian's chromium, driven by Playwright): three
escalated decisions labelled with the keyboard alone; the server is killed with SIGKILL right after
the last 201, and the store holds all three labels."""

from __future__ import annotations

import os
import shutil
import signal

import httpx
import pytest

from conftest import API_KEY
from llamadecide.bench.server_process import ServerProcess
from llamadecide.labels.sqlite_store import SqliteLabelStore

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/test.sh installs it)")
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TEAMS = ["billing", "technical support", "sales"]
TICKETS = ["I was charged twice.", "The app crashes when I log in.", "Do you sell team plans?"]


def test_three_labels_by_keyboard_survive_kill_9(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    store = tmp_path / "labels.sqlite"
    server = ServerProcess("--api-key", API_KEY, "--label-store", str(store), log_dir=tmp_path)
    with server:
        ids = []
        for ticket in TICKETS:
            response = httpx.post(
                f"{server.url}/v1/decisions",
                headers={"Authorization": f"Bearer {API_KEY}"},
                json={
                    "model": "m",
                    "input": ticket,
                    "questions": [
                        {"type": "choice", "instructions": "Which team?", "choices": [{"value": t} for t in TEAMS]}
                    ],
                    "llamadecide": {"threshold": 1.0},  # every answer escalates
                },
                timeout=120,
            )
            ids.append(response.headers["x-request-id"])
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
            try:
                page = browser.new_page()
                page.goto(server.url + "/review")
                assert page.title() == "llamadecide review"
                page.fill("#key", API_KEY)
                page.press("#key", "Tab")  # the key is taken on change; the queue loads
                page.wait_for_selector("#options li", timeout=30_000)
                shown = []
                for n, key in enumerate(["1", "2", "3"]):
                    page.wait_for_function(f"document.getElementById('input').textContent === {TICKETS[n]!r}")
                    shown.append(page.text_content("#input"))
                    assert page.eval_on_selector_all("#options li .name", "e => e.map(x => x.textContent)") == TEAMS
                    assert page.text_content("#options li:nth-child(1) kbd") == "1"
                    page.keyboard.press(key)
                    page.wait_for_function(f"document.body.dataset.labelled === '{n + 1}'", timeout=30_000)
                os.kill(server.process.pid, signal.SIGKILL)  # right after the third 201
                page.screenshot(path=str(tmp_path / "review.png"))
            finally:
                browser.close()
        server.process.wait()
    assert shown == TICKETS  # oldest first
    held = SqliteLabelStore(store)
    try:
        labels = {r.item.id: r.label for r in held.labelled()}
    finally:
        held.close()
    assert labels == dict(zip(ids, TEAMS))
