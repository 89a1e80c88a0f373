"""Amazon A2I: a queued decision starts a human loop (the A2I runtime call checked with botocore's
Stubber), and `llamadecide labels import` reads the loops' output from S3 (moto) into the store."""

from __future__ import annotations

import json
import time

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from typer.testing import CliRunner

from llamadecide.cli.main import app
from llamadecide.labels.a2i import HumanLoops, import_loops, loop_input, loop_name
from llamadecide.labels.records import ReviewItem
from llamadecide.labels.sqlite_store import SqliteLabelStore

FLOW = "arn:aws:sagemaker:us-east-1:123456789012:flow-definition/tickets"


def queued(id: str, **extra) -> ReviewItem:
    fields = {
        "id": id,
        "question": "team",
        "kind": "choice",
        "instructions": "Which team should handle this ticket?",
        "options": ("billing", "technical support"),
        "probabilities": (0.55, 0.45),
        "confidence": 0.1,
        "input_sha256": "0" * 64,
        "origin": "escalated",
        "created": time.time(),
        "queued": True,
        "chance": 1.0,
        "frame": "served:tickets:v1",
        "input": "I was charged twice.",
        "task": "tickets",
        "version": "v1",
        "action": "escalate",
    }
    return ReviewItem(**{**fields, **extra})


@pytest.fixture
def aws(monkeypatch):
    for name, value in (
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "x"),
        ("AWS_SECRET_ACCESS_KEY", "x"),
    ):
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield


def test_a_queued_decision_starts_a_human_loop_with_what_a_worker_needs(aws):
    client = boto3.client("sagemaker-a2i-runtime")
    item = queued("req-1")
    with Stubber(client) as stub:
        stub.add_response(
            "start_human_loop",
            {"HumanLoopArn": "arn:aws:sagemaker:us-east-1:123456789012:human-loop/x"},
            {
                "HumanLoopName": loop_name(item),
                "FlowDefinitionArn": FLOW,
                "HumanLoopInput": {"InputContent": json.dumps(loop_input(item))},
            },
        )
        assert HumanLoops(FLOW, client=client).start([item]) == 1
        stub.assert_no_pending_responses()
    sent = loop_input(item)
    assert sent["input"] == "I was charged twice." and sent["option_names"] == ["billing", "technical support"]
    assert len(loop_name(item)) <= 63 and loop_name(item) == loop_name(queued("req-1"))


def test_a_loop_that_cannot_start_leaves_the_item_in_the_queue(aws, caplog):
    client = boto3.client("sagemaker-a2i-runtime")
    with Stubber(client) as stub:
        stub.add_client_error("start_human_loop", "ValidationException", "flow definition is not active")
        assert HumanLoops(FLOW, client=client).start([queued("req-2")]) == 0
    assert "could not start a human loop" in caplog.text


def _output(item: ReviewItem, answer: str) -> bytes:
    return json.dumps(
        {
            "humanLoopName": loop_name(item),
            "inputContent": loop_input(item),
            "humanAnswers": [{"answerContent": {"label": {"label": answer}}, "workerId": "w1"}],
        }
    ).encode()


def test_labels_import_reads_the_loops_output_into_the_store(aws, tmp_path):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="a2i-out")
    store_path = tmp_path / "labels.sqlite"
    store = SqliteLabelStore(store_path)
    store.record([queued("req-1"), queued("req-2")])
    store.close()
    prefix = "tickets/2026/12/06/10/00/00"
    s3.put_object(
        Bucket="a2i-out",
        Key=f"{prefix}/{loop_name(queued('req-1'))}/output.json",
        Body=_output(queued("req-1"), "technical support"),
    )
    s3.put_object(
        Bucket="a2i-out",
        Key=f"{prefix}/{loop_name(queued('req-2'))}/output.json",
        Body=_output(queued("req-2"), "marketing"),
    )
    s3.put_object(Bucket="a2i-out", Key=f"{prefix}/stray/output.json", Body=_output(queued("never-served"), "billing"))
    result = CliRunner().invoke(app, ["labels", "import", "s3://a2i-out/tickets", "--store", str(store_path)])
    assert result.exit_code == 0, result.output
    assert "1 labels from 3 human loops" in result.output
    assert "none of the options" in result.output and "never-served" in result.output
    store = SqliteLabelStore(store_path)
    try:
        [record] = store.labelled()
        assert (record.item.id, record.label) == ("req-1", "technical support")
        assert store.history("req-1", "team")[0][1] == "a2i"
    finally:
        store.close()


def test_importing_twice_keeps_one_current_label(aws, tmp_path):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="a2i-out")
    store = SqliteLabelStore(tmp_path / "labels.sqlite")
    try:
        store.record([queued("req-1")])
        s3.put_object(Bucket="a2i-out", Key="x/loop/output.json", Body=_output(queued("req-1"), "billing"))
        for _ in range(2):
            assert import_loops("s3://a2i-out/x", store, client=s3).labels == 1
        assert [r.label for r in store.labelled()] == ["billing"]
    finally:
        store.close()
