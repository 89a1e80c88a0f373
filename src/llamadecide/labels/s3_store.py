"""The label store in S3, shared by every instance behind one SageMaker endpoint: one object per
queued item and one per label, so instances never write the same object and nothing needs a lock.

    s3://bucket/prefix/items/<key>.json           an item in the review queue (escalated or audited)
    s3://bucket/prefix/labels/<key>/<ns>-<n>.json  each label given to it; the latest is current

A label is acknowledged once its object is written. Only queued items are kept: an automatic
decision that was not audited would cost a PUT (about what deciding it costs) and could neither
train nor certify, so a label posted for one is refused as unknown (404), where the SQLite store,
which keeps every decision's hash, takes it. Listing the queue and the labels costs LIST and GET
requests; figures for /metrics are cached for `cache_s` seconds."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any
from urllib.parse import urlparse

from llamadecide.aws import import_boto3
from llamadecide.errors import InvalidRequestError, LabelError, UnknownItemError
from llamadecide.labels.records import Label, LabelledRecord, ReviewItem


def item_key(id: str, question: str) -> str:
    return hashlib.sha256(f"{id}\u0000{question}".encode()).hexdigest()[:40]


class S3LabelStore:
    def __init__(self, url: str, *, client=None, cache_s: float = 30.0) -> None:
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise InvalidRequestError(f"not an S3 location: {url!r} (s3://bucket/prefix)", param="label_store")
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        self.description = url
        self.s3 = client or import_boto3().client("s3")
        self.cache_s = cache_s
        self._cached: dict[str, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def close(self) -> None:
        pass

    # -- writing -----------------------------------------------------------------------------------

    def record(self, items: Sequence[ReviewItem]) -> None:
        for item in items:
            if item.queued:
                key = self._key("items", item_key(item.id, item.question) + ".json")
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(asdict(item)).encode())

    def add_draws(self, draws: Sequence[tuple[str, str, str, float]]) -> None:
        for id, question, frame, chance in draws:
            key = self._key("draws", item_key(id, question), f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json")
            self.s3.put_object(
                Bucket=self.bucket, Key=key, Body=json.dumps({"frame": frame, "chance": chance}).encode()
            )

    def add_labels(self, labels: Sequence[Label]) -> int:
        checked = []
        for n, label in enumerate(labels):  # every label is checked before any is written
            item = self.get(label.id, label.question)
            if item is None:
                raise UnknownItemError(
                    f"no decision {label.id!r} with a question {label.question!r} in the review queue",
                    param=f"labels[{n}]",
                )
            value = item.option_for(label.label)
            if value is None:
                raise LabelError(
                    f"label {label.label!r} is not one of the question's options {list(item.options)}",
                    param=f"labels[{n}].label",
                )
            checked.append((label, item, value))
        for label, item, value in checked:
            created = label.created or time.time()
            name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
            body = {"label": value, "source": label.source, "created": created, "item": asdict(item)}
            key = self._key("labels", item_key(label.id, label.question), name)
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(body).encode())
        with self._lock:
            self._cached.clear()
        return len(checked)

    def forget_inputs(self, before: float) -> int:
        """Erase the input of queued items created before `before` (items and the copies in labels)."""
        erased = 0
        for key in self._list(self._key("items")):
            item = self._read_item(key)
            if item.input is not None and item.created < before:
                self.s3.put_object(
                    Bucket=self.bucket, Key=key, Body=json.dumps({**asdict(item), "input": None}).encode()
                )
                erased += 1
        for key in self._list(self._key("labels")):
            body = self._read(key)
            if body["item"].get("input") is not None and body["item"]["created"] < before:
                body["item"]["input"] = None
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(body).encode())
        return erased

    # -- reading -----------------------------------------------------------------------------------

    def get(self, id: str, question: str) -> ReviewItem | None:
        key = self._key("items", item_key(id, question) + ".json")
        try:
            return self._read_item(key)
        except self.s3.exceptions.NoSuchKey:
            return None

    def pending(self, *, limit: int = 50, task: str | None = None) -> list[ReviewItem]:
        labelled = self._labelled_keys()
        found = []
        for key in self._list(self._key("items")):
            if key.rsplit("/", 1)[-1].removesuffix(".json") in labelled:
                continue
            item = self._read_item(key)
            if item.input is not None and (task is None or item.task == task):
                found.append(item)
        return sorted(found, key=lambda item: item.created)[:limit]

    def labelled(
        self,
        *,
        task: str | None = None,
        options: Sequence[Any] | None = None,
        version: str | None = None,
        origin: str | None = None,
    ) -> list[LabelledRecord]:
        records = []
        redrawn: dict[str, list[str]] = {}
        for key in sorted(self._list(self._key("draws"))):
            redrawn.setdefault(key.rsplit("/", 2)[-2], []).append(key)
        for held, keys in self._labels_by_item().items():
            body = self._read(keys[-1])
            item = _item(body["item"])
            wanted = (("task", task), ("version", version), ("origin", origin))
            if any(value is not None and getattr(item, name) != value for name, value in wanted):
                continue
            if options is not None and list(item.options) != list(options):
                continue
            draws = ((item.frame, item.chance),) if item.certifies else ()
            draws += tuple((d["frame"], d["chance"]) for d in map(self._read, redrawn.get(held, ())))
            records.append(LabelledRecord(item, body["label"], body["created"], draws))
        return sorted(records, key=lambda r: r.labelled)

    def history(self, id: str, question: str) -> list[tuple[Any, str, float]]:
        keys = self._list(self._key("labels", item_key(id, question)))
        return [(body["label"], body["source"], body["created"]) for body in map(self._read, sorted(keys))]

    def counts(self) -> dict[str | None, dict[str, int]]:
        def compute() -> dict[str | None, dict[str, int]]:
            found: dict[str | None, dict[str, int]] = {}
            for item in self.pending(limit=10**9):
                found.setdefault(item.task, {"pending": 0, "labels": 0})["pending"] += 1
            for record in self.labelled():
                found.setdefault(record.item.task, {"pending": 0, "labels": 0})["labels"] += 1
            return found

        return self._cache("counts", compute)

    # -- inside --------------------------------------------------------------------------------------

    def _cache(self, name: str, compute):
        with self._lock:
            held = self._cached.get(name)
            if held and time.monotonic() - held[0] < self.cache_s:
                return held[1]
        value = compute()
        with self._lock:
            self._cached[name] = (time.monotonic(), value)
        return value

    def _list(self, prefix: str) -> list[str]:
        keys = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix + "/"):
            keys.extend(entry["Key"] for entry in page.get("Contents", ()))
        return keys

    def _labels_by_item(self) -> dict[str, list[str]]:
        by_item: dict[str, list[str]] = {}
        for key in sorted(self._list(self._key("labels"))):
            by_item.setdefault(key.rsplit("/", 2)[-2], []).append(key)
        return by_item

    def _labelled_keys(self) -> set[str]:
        return set(self._labels_by_item())

    def _read(self, key: str) -> dict:
        return json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def _read_item(self, key: str) -> ReviewItem:
        return _item(self._read(key))


def _item(data: dict) -> ReviewItem:
    return ReviewItem(
        **{
            **data,
            "options": tuple(data["options"]),
            "probabilities": tuple(data["probabilities"]),
            "option_names": None if data.get("option_names") is None else tuple(data["option_names"]),
        }
    )
