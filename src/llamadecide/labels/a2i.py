"""Amazon Augmented AI (A2I): the AWS way to put people in the loop of a SageMaker endpoint. Each
decision entering the review queue also starts a human loop on the user's flow definition; the
loops' output lands in S3 and `llamadecide labels import s3://...` reads it into the label store.

The flow's worker task template (`a2i_template.html` beside this module, also in
docs/sagemaker.md) shows the item's input, instructions and option names from the loop's input and
answers with a `crowd-classifier` named `label`: the loop's output then holds
`humanAnswers[0].answerContent.label.label`, the option name the worker chose."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlparse

from llamadecide.aws import import_boto3
from llamadecide.errors import InvalidRequestError, LlamaDecideError
from llamadecide.labels.records import Label, ReviewItem
from llamadecide.labels.store import LabelStore

log = logging.getLogger(__name__)
ANSWER_FIELD = "label"  # the crowd-classifier's name in the worker task template


def loop_name(item: ReviewItem) -> str:
    """A human loop's name for an item: A2I wants 1 to 63 lowercase letters, digits and hyphens."""
    return "llamadecide-" + hashlib.sha256(f"{item.id}\u0000{item.question}".encode()).hexdigest()[:40]


def loop_input(item: ReviewItem) -> dict:
    """What a worker sees: the input, the question, the options by name; and what the import needs."""
    names = item.option_names or tuple(str(o).lower() if isinstance(o, bool) else str(o) for o in item.options)
    return {
        "id": item.id,
        "question": item.question,
        "instructions": item.instructions,
        "input": item.input,
        "option_names": list(names),
        "options": list(item.options),
    }


class HumanLoops:
    """Starts a human loop per queued item. A loop that cannot start is logged: the item stays in the
    review queue, where the review page and GET /v1/reviews still offer it."""

    def __init__(self, flow_definition_arn: str, *, client=None) -> None:
        self.flow = flow_definition_arn
        self.client = client or import_boto3().client("sagemaker-a2i-runtime")

    def start(self, items: Sequence[ReviewItem]) -> int:
        started = 0
        for item in items:
            try:
                self.client.start_human_loop(
                    HumanLoopName=loop_name(item),
                    FlowDefinitionArn=self.flow,
                    HumanLoopInput={"InputContent": json.dumps(loop_input(item))},
                )
                started += 1
            except Exception as exc:  # noqa: BLE001 - botocore's ClientError and its network errors alike
                log.error("A2I: could not start a human loop for %s/%s: %s", item.id, item.question, exc)
        return started


@dataclass
class Imported:
    labels: int = 0
    loops: int = 0
    skipped: dict[str, str] = field(default_factory=dict)  # output object -> why it was not taken


def import_loops(url: str, store: LabelStore, *, client=None) -> Imported:
    """Every completed loop's answer under an S3 location (the flow's output path), as labels with
    source `a2i`; an output whose item the store does not hold, or whose answer names no option, is
    skipped with the reason. Importing again replaces nothing a person has not changed: the label of
    an item is set again to the same value, its history keeps both."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise InvalidRequestError(f"not an S3 location: {url!r} (s3://bucket/prefix)", param="source")
    s3 = client or import_boto3().client("s3")
    found = Imported()
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=parsed.netloc, Prefix=parsed.path.lstrip("/"))
    for key in (entry["Key"] for page in pages for entry in page.get("Contents", ())):
        if not key.endswith("/output.json"):
            continue
        found.loops += 1
        try:
            label = _label(json.loads(s3.get_object(Bucket=parsed.netloc, Key=key)["Body"].read()))
            found.labels += store.add_labels([label])
        except (LlamaDecideError, KeyError, IndexError, TypeError, ValueError) as exc:
            found.skipped[key] = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
    return found


def _label(output: dict) -> Label:
    """The label a loop's output gives: the option whose name the worker chose."""
    given = output["inputContent"]
    if isinstance(given, str):
        given = json.loads(given)
    chosen = output["humanAnswers"][0]["answerContent"][ANSWER_FIELD]["label"]
    names = given["option_names"]
    if chosen not in names:
        raise ValueError(f"the worker's answer {chosen!r} is none of the options {names}")
    return Label(given["id"], str(given["question"]), given["options"][names.index(chosen)], "a2i")
