"""Where labels live: `open_store` picks the embedded SQLite file or, for `s3://bucket/prefix`,
objects in S3 that every instance behind one endpoint shares. Both keep the same things and answer
the same questions (`LabelStore`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from llamadecide.labels.records import Label, LabelledRecord, ReviewItem


class LabelStore(Protocol):
    description: str

    def record(self, items: Sequence[ReviewItem]) -> None:
        """Keep served decisions and items drawn for labelling (an item already held keeps its first record)."""

    def add_draws(self, draws: Sequence[tuple[str, str, str, float]]) -> None:
        """Items already held drawn again: (id, question, frame, chance) each."""

    def add_labels(self, labels: Sequence[Label]) -> int:
        """Every label or none (UnknownItemError, LabelError); durable before it returns."""

    def get(self, id: str, question: str) -> ReviewItem | None: ...

    def pending(self, *, limit: int = 50, task: str | None = None) -> list[ReviewItem]:
        """Queued items still without a label, oldest first."""

    def labelled(
        self,
        *,
        task: str | None = None,
        options: Sequence[Any] | None = None,
        version: str | None = None,
        origin: str | None = None,
    ) -> list[LabelledRecord]:
        """Items with their current label, oldest label first, filtered by what is given."""

    def history(self, id: str, question: str) -> list[tuple[Any, str, float]]: ...

    def counts(self) -> dict[str | None, dict[str, int]]:
        """Per task: items pending review and labels held."""

    def forget_inputs(self, before: float) -> int: ...

    def close(self) -> None: ...


def open_store(where: str | Path) -> LabelStore:
    """The store at a path (SQLite, created if absent) or an `s3://bucket/prefix` (S3 objects)."""
    text = str(where)
    if text.startswith("s3://"):
        from llamadecide.labels.s3_store import S3LabelStore

        return S3LabelStore(text)
    from llamadecide.labels.sqlite_store import SqliteLabelStore

    return SqliteLabelStore(Path(text))
