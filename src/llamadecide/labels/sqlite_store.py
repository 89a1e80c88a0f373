"""The embedded label store: one SQLite file in WAL mode. A label is committed (and, with
synchronous=FULL, on disk) before `add_labels` returns, so a 201 is never lost to kill -9."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from llamadecide.errors import LabelError, UnknownItemError
from llamadecide.labels.records import Label, LabelledRecord, ReviewItem

SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    id TEXT NOT NULL,
    question TEXT NOT NULL,
    kind TEXT NOT NULL,
    instructions TEXT NOT NULL,
    options TEXT NOT NULL,
    option_names TEXT,
    probabilities TEXT NOT NULL,
    confidence REAL NOT NULL,
    input_sha256 TEXT NOT NULL,
    origin TEXT NOT NULL,
    created REAL NOT NULL,
    queued INTEGER NOT NULL,
    chance REAL,
    frame TEXT NOT NULL,
    input TEXT,
    task TEXT,
    version TEXT,
    action TEXT,
    PRIMARY KEY (id, question)
);
CREATE INDEX IF NOT EXISTS items_queue ON items (queued, created);
CREATE INDEX IF NOT EXISTS items_task ON items (task, version, origin);
CREATE TABLE IF NOT EXISTS labels (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL,
    question TEXT NOT NULL,
    label TEXT NOT NULL,
    source TEXT NOT NULL,
    created REAL NOT NULL,
    current INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS labels_current ON labels (id, question, current);
CREATE TABLE IF NOT EXISTS draws (
    id TEXT NOT NULL,
    question TEXT NOT NULL,
    frame TEXT NOT NULL,
    chance REAL NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS draws_item ON draws (id, question);
"""
COLUMNS = (
    "id",
    "question",
    "kind",
    "instructions",
    "options",
    "option_names",
    "probabilities",
    "confidence",
    "input_sha256",
    "origin",
    "created",
    "queued",
    "chance",
    "frame",
    "input",
    "task",
    "version",
    "action",
)
CURRENT = "EXISTS (SELECT 1 FROM labels l WHERE l.id = items.id AND l.question = items.question AND l.current = 1)"


class SqliteLabelStore:
    """Items, the review queue and labels in one SQLite file; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a commit is on disk before it returns
        self._db.execute("PRAGMA busy_timeout=10000")  # another process (a refit) reading or writing
        self._db.executescript(SCHEMA)

    @property
    def description(self) -> str:
        return f"sqlite:{self.path}"

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writing -----------------------------------------------------------------------------------

    def record(self, items: Sequence[ReviewItem]) -> None:
        """Keep served decisions (and items drawn for labelling), a queued one with its draw; an item
        already held keeps its first record (a later draw of it is `add_draws`')."""
        insert = f"INSERT OR IGNORE INTO items ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
        with self._lock, self._transaction():
            for item in items:
                added = self._db.execute(insert, _row(item)).rowcount
                if added and item.certifies:
                    self._db.execute(
                        "INSERT INTO draws (id, question, frame, chance, created) VALUES (?, ?, ?, ?, ?)",
                        (item.id, item.question, item.frame, item.chance, item.created),
                    )

    def add_draws(self, draws: Sequence[tuple[str, str, str, float]]) -> None:
        """Items already held drawn again, each (id, question, frame, chance): a labelling round draws
        from the whole pool, labelled items included, and each round's frame counts its draws."""
        now = time.time()
        with self._lock, self._transaction():
            self._db.executemany(
                "INSERT INTO draws (id, question, frame, chance, created) VALUES (?, ?, ?, ?, ?)",
                [(*draw, now) for draw in draws],
            )

    def add_labels(self, labels: Sequence[Label]) -> int:
        """Every label or none: an unknown item or a label outside its options refuses the whole batch.
        A second label for an item replaces the first; the first stays in its history."""
        now = time.time()
        with self._lock, self._transaction():
            checked = []
            for n, label in enumerate(labels):
                item = self._item(label.id, label.question)
                if item is None:
                    raise UnknownItemError(
                        f"no served decision {label.id!r} with a question {label.question!r}", param=f"labels[{n}]"
                    )
                value = item.option_for(label.label)
                if value is None:
                    raise LabelError(
                        f"label {label.label!r} is not one of the question's options {list(item.options)}",
                        param=f"labels[{n}].label",
                    )
                checked.append((label, value))
            for label, value in checked:
                self._db.execute(
                    "UPDATE labels SET current = 0 WHERE id = ? AND question = ? AND current = 1",
                    (label.id, label.question),
                )
                self._db.execute(
                    "INSERT INTO labels (id, question, label, source, created, current) VALUES (?, ?, ?, ?, ?, 1)",
                    (label.id, label.question, json.dumps(value), label.source, label.created or now),
                )
        return len(checked)

    def forget_inputs(self, before: float) -> int:
        """The retention: inputs of items created before `before` are erased (their labels stay, but no
        longer train). Returns how many were erased."""
        with self._lock, self._transaction():
            cursor = self._db.execute(
                "UPDATE items SET input = NULL WHERE input IS NOT NULL AND created < ?", (before,)
            )
            return cursor.rowcount

    # -- reading -----------------------------------------------------------------------------------

    def get(self, id: str, question: str) -> ReviewItem | None:
        with self._lock:
            return self._item(id, question)

    def pending(self, *, limit: int = 50, task: str | None = None) -> list[ReviewItem]:
        """Queued items still without a label (and with their input), oldest first."""
        where, args = "queued = 1 AND input IS NOT NULL AND NOT " + CURRENT, []
        if task is not None:
            where, args = where + " AND task = ?", [task]
        with self._lock:
            rows = self._db.execute(
                f"SELECT {', '.join(COLUMNS)} FROM items WHERE {where} ORDER BY created, rowid LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_item(row) for row in rows]

    def labelled(
        self,
        *,
        task: str | None = None,
        options: Sequence[Any] | None = None,
        version: str | None = None,
        origin: str | None = None,
    ) -> list[LabelledRecord]:
        """Items with a current label, oldest label first; of one task (the profile served) or of
        questions with these options, of one profile version, of one origin."""
        where, args = "l.current = 1", []
        for column, value in (("task", task), ("version", version), ("origin", origin)):
            if value is not None:
                where, args = where + f" AND items.{column} = ?", [*args, value]
        if options is not None:
            where, args = where + " AND items.options = ?", [*args, json.dumps(list(options))]
        with self._lock:
            rows = self._db.execute(
                f"SELECT {', '.join('items.' + c for c in COLUMNS)}, l.label, l.created FROM items "
                f"JOIN labels l ON l.id = items.id AND l.question = items.question WHERE {where} ORDER BY l.seq",
                args,
            ).fetchall()
            draws: dict[tuple[str, str], list[tuple[str, float]]] = {}
            for id, question, frame, chance in self._db.execute(
                "SELECT d.id, d.question, d.frame, d.chance FROM draws d JOIN labels l "
                "ON l.id = d.id AND l.question = d.question AND l.current = 1 ORDER BY d.rowid"
            ):
                draws.setdefault((id, question), []).append((frame, chance))
        records = []
        for row in rows:
            item = _item(row[:-2])
            records.append(LabelledRecord(item, json.loads(row[-2]), row[-1], tuple(draws.get(item.key, ()))))
        return records

    def history(self, id: str, question: str) -> list[tuple[Any, str, float]]:
        """Every label an item was given, first to last: (label, source, when)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT label, source, created FROM labels WHERE id = ? AND question = ? ORDER BY seq", (id, question)
            ).fetchall()
        return [(json.loads(label), source, created) for label, source, created in rows]

    def counts(self) -> dict[str | None, dict[str, int]]:
        """Per task (profile name; None: served without one): items pending review and labels held."""
        with self._lock:
            pending = self._db.execute(
                f"SELECT task, COUNT(*) FROM items WHERE queued = 1 AND input IS NOT NULL AND NOT {CURRENT} "
                "GROUP BY task"
            ).fetchall()
            labelled = self._db.execute(f"SELECT task, COUNT(*) FROM items WHERE {CURRENT} GROUP BY task").fetchall()
        found: dict[str | None, dict[str, int]] = {}
        for task, n in pending:
            found.setdefault(task, {"pending": 0, "labels": 0})["pending"] = n
        for task, n in labelled:
            found.setdefault(task, {"pending": 0, "labels": 0})["labels"] = n
        return found

    # -- inside --------------------------------------------------------------------------------------

    def _item(self, id: str, question: str) -> ReviewItem | None:
        row = self._db.execute(
            f"SELECT {', '.join(COLUMNS)} FROM items WHERE id = ? AND question = ?", (id, question)
        ).fetchone()
        return None if row is None else _item(row)

    def _transaction(self):
        return _Transaction(self._db)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on an exception: nothing partial is written."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind, value, traceback) -> None:
        self.db.execute("ROLLBACK" if kind else "COMMIT")


def _row(item: ReviewItem) -> tuple:
    return (
        item.id,
        item.question,
        item.kind,
        item.instructions,
        json.dumps(list(item.options)),
        None if item.option_names is None else json.dumps(list(item.option_names)),
        json.dumps(list(item.probabilities)),
        item.confidence,
        item.input_sha256,
        item.origin,
        item.created,
        int(item.queued),
        item.chance,
        item.frame,
        item.input,
        item.task,
        item.version,
        item.action,
    )


def _item(row: Iterable[Any]) -> ReviewItem:
    values = dict(zip(COLUMNS, row))
    return ReviewItem(
        id=values["id"],
        question=values["question"],
        kind=values["kind"],
        instructions=values["instructions"],
        options=tuple(json.loads(values["options"])),
        option_names=None if values["option_names"] is None else tuple(json.loads(values["option_names"])),
        probabilities=tuple(json.loads(values["probabilities"])),
        confidence=values["confidence"],
        input_sha256=values["input_sha256"],
        origin=values["origin"],
        created=values["created"],
        queued=bool(values["queued"]),
        chance=values["chance"],
        frame=values["frame"],
        input=values["input"],
        task=values["task"],
        version=values["version"],
        action=values["action"],
    )
