"""The label store (SQLite, and the same contract in S3 on moto): items, the review queue, labels
with their history, every-or-none batches, the retention, and what survives kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from llamadecide.errors import LabelError, UnknownItemError
from llamadecide.labels.records import Label, ReviewItem
from llamadecide.labels.sqlite_store import SqliteLabelStore


def item(
    id: str, *, queued: bool = True, chance: float | None = 1.0, input: str | None = "text", **extra
) -> ReviewItem:
    fields = {
        "id": id,
        "question": "0",
        "kind": "choice",
        "instructions": "Which team?",
        "options": ("billing", "support"),
        "probabilities": (0.7, 0.3),
        "confidence": 0.4,
        "input_sha256": "0" * 64,
        "origin": "escalated" if queued else "served",
        "created": time.time(),
        "queued": queued,
        "chance": chance if queued else None,
        "frame": "served:t:v1",
        "input": input if queued else None,
        "task": "t",
        "version": "v1",
        "action": "escalate",
    }
    return ReviewItem(**{**fields, **extra})


@pytest.fixture(params=["sqlite", "s3"])
def store(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        held = SqliteLabelStore(tmp_path / "labels.sqlite")
    else:
        boto3 = pytest.importorskip("boto3")
        moto = pytest.importorskip("moto")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mock = moto.mock_aws()
        mock.start()
        request.addfinalizer(mock.stop)
        client = boto3.client("s3")
        client.create_bucket(Bucket="reviews")
        from llamadecide.labels.s3_store import S3LabelStore

        held = S3LabelStore("s3://reviews/endpoint-a", client=client, cache_s=0)
    yield held
    held.close()


def test_queued_items_wait_for_a_label_oldest_first_and_leave_once_labelled(store):
    store.record([item("b", created=2.0), item("a", created=1.0), item("auto", queued=False)])
    assert [i.id for i in store.pending()] == ["a", "b"]  # the unqueued automatic decision is not offered
    assert store.add_labels([Label("a", "0", "support")]) == 1
    assert [i.id for i in store.pending()] == ["b"]
    [record] = store.labelled()
    assert (record.item.id, record.label, record.correct) == ("a", "support", False)


def test_a_second_label_replaces_the_first_and_the_history_keeps_both(store):
    store.record([item("a")])
    store.add_labels([Label("a", "0", "support")])
    store.add_labels([Label("a", "0", "billing", source="review")])
    [record] = store.labelled()
    assert record.label == "billing" and record.correct
    assert [(label, source) for label, source, _ in store.history("a", "0")] == [
        ("support", "api"),
        ("billing", "review"),
    ]


def test_one_bad_label_refuses_the_whole_batch_and_writes_nothing(store):
    store.record([item("a"), item("b")])
    with pytest.raises(UnknownItemError):
        store.add_labels([Label("a", "0", "billing"), Label("nope", "0", "billing")])
    with pytest.raises(LabelError):
        store.add_labels([Label("a", "0", "billing"), Label("b", "0", "sales")])
    with pytest.raises(UnknownItemError):
        store.add_labels([Label("a", "1", "billing")])  # the decision has no question 1
    assert store.labelled() == [] and store.history("a", "0") == []


def test_labels_are_the_declared_values_strictly(store):
    store.record([item("p", options=(True, False), probabilities=(0.6, 0.4), kind="predicate")])
    store.record(
        [item("s", options=(0, 1, 2), option_names=("low", "mid", "high"), kind="score", probabilities=(0.2, 0.3, 0.5))]
    )
    for wrong in ("true", 1, "True"):
        with pytest.raises(LabelError):
            store.add_labels([Label("p", "0", wrong)])
    store.add_labels([Label("p", "0", False), Label("s", "0", "high")])  # a score's level by name
    labels = {r.item.id: r.label for r in store.labelled()}
    assert labels == {"p": False, "s": 2}


def test_the_retention_erases_old_inputs_and_their_items_leave_the_queue(store):
    store.record([item("old", created=100.0), item("new", created=time.time())])
    store.forget_inputs(before=1000.0)
    assert [i.id for i in store.pending()] == ["new"]
    assert store.get("old", "0").input is None and store.get("new", "0").input == "text"


def test_counts_per_profile(store):
    store.record([item("a"), item("b"), item("c", task="other")])
    store.add_labels([Label("a", "0", "billing")])
    counts = store.counts()
    assert counts["t"] == {"pending": 1, "labels": 1} and counts["other"] == {"pending": 1, "labels": 0}


def test_an_acknowledged_label_survives_kill_9(tmp_path):
    """A child process records an item, adds a label, prints once add_labels returned (the 201's
    moment), then is killed with SIGKILL before it could close anything: the label is there."""
    path = tmp_path / "labels.sqlite"
    child = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(os.path.dirname(__file__))!r})
        from test_label_store import item
        from llamadecide.labels.records import Label
        from llamadecide.labels.sqlite_store import SqliteLabelStore
        store = SqliteLabelStore({str(path)!r})
        store.record([item(f"d{{n}}") for n in range(50)])
        for n in range(50):
            store.add_labels([Label(f"d{{n}}", "0", "billing")])
            print(n, flush=True)
        time.sleep(60)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    acknowledged = -1
    for line in process.stdout:
        acknowledged = int(line)
        if acknowledged == 49:
            break
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    process.stdout.close()
    assert acknowledged == 49
    reopened = SqliteLabelStore(path)
    try:
        assert len(reopened.labelled()) == 50
    finally:
        reopened.close()


def test_every_draw_of_an_item_is_kept_with_its_chance(store):
    """A queued item carries the draw that queued it; a labelling round that draws it again adds a
    draw of that round's frame (an item picked with no chance carries none)."""
    store.record([item("a", chance=0.25, frame="pool:r1"), item("b", queued=False)])
    store.add_labels([Label("a", "0", "billing")])
    store.add_draws([("a", "0", "pool:r2", 0.5)])
    [record] = store.labelled()
    assert record.draws == (("pool:r1", 0.25), ("pool:r2", 0.5))
