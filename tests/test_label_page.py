"""`llamadecide label` in a real headless browser (Debian's chromium, driven by Playwright): ten items
labelled with the keyboard alone refit the model in the background and update the figures on the
page; a restart on the same store keeps every label and shows them."""

from __future__ import annotations

import json
import shutil
import sys

import httpx
import pytest

from conftest import DATA
from llamadecide.bench.server_process import ServerProcess
from llamadecide.calibration.data import load_task, read_labelled
from llamadecide.labels.sqlite_store import SqliteLabelStore
from test_review_page import BROWSER_ARGS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/test.sh installs it)")
KEYS = "123456789"


def _of_option(items, task, option, n: int = 10) -> list:
    """The first n items of an option (a pool every option is in, whatever the draw takes)."""
    return [item for item in items if task.options[task.gold_index(item.label)] == option][:n]


def _labelling(tmp_path, pool, store) -> ServerProcess:
    process = ServerProcess(log_dir=tmp_path)
    process.command = [
        sys.executable,
        "-m",
        "llamadecide.cli.main",
        "label",
        str(pool),
        "--task",
        "agnews",
        "--store",
        str(store),
        "--round-size",
        "5",
        "--refit-every",
        "5",
        "--prompt-format",
        "llamadecide-1",
        "--port",
        str(process.port),
    ]
    return process


def test_ten_labels_by_keyboard_refit_update_the_page_and_survive_a_restart(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    task = load_task("agnews")
    every = read_labelled(DATA / "agnews" / "test.tsv", text_column="0", label_column="1")[:400]
    items = [item for option in task.options for item in _of_option(every, task, option)]
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"id": f"n{i}", "text": it.text}) + "\n" for i, it in enumerate(items)))
    gold = {item.text: task.gold_index(item.label) for item in items}
    store = tmp_path / "labels.sqlite"
    with _labelling(tmp_path, pool, store) as labelling:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
            try:
                page = browser.new_page()
                page.goto(labelling.url + "/review")
                for n in range(10):
                    shown = "document.getElementById('input').textContent"
                    page.wait_for_function(
                        f"(document.body.dataset.labelled || '0') === '{n}' && {shown}", timeout=60_000
                    )
                    text = page.text_content("#input")
                    page.keyboard.press(KEYS[gold[text]])
                page.wait_for_function("document.body.dataset.labelled === '10'", timeout=60_000)
                page.wait_for_function(
                    "document.getElementById('panel').textContent.includes('refitted')", timeout=120_000
                )
                panel = page.text_content("#panel")
                page.screenshot(path=str(tmp_path / "label.png"))
            finally:
                browser.close()
        status = httpx.get(f"{labelling.url}/v1/labelling", timeout=30).json()
    assert "labels" in panel and "certified automatic share" in panel and "refitted" in panel
    assert status["labels"] == 10 and status["refits"] >= 1 and status["certifying"] == 10
    held = SqliteLabelStore(store)
    try:
        records = held.labelled()
    finally:
        held.close()
    assert len(records) == 10 and all(r.draws and 0 < r.draws[0][1] <= 1 for r in records)
    assert all(task.options.index(r.label) == gold[r.item.input] for r in records)  # what the keys said
    with _labelling(tmp_path, pool, store) as again:  # a restart on the same store
        assert httpx.get(f"{again.url}/v1/labelling", timeout=30).json()["labels"] == 10
        queued = httpx.get(f"{again.url}/v1/reviews", timeout=30).json()["data"]
        assert queued and not {q["id"] for q in queued} & {r.item.id for r in records}
