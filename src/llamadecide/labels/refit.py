"""From the label store to a calibration run: the labelled items of a task, each with how it came to
be labelled (its `Draw`: the chance recorded when it entered the queue, and its frame), and the
parent profile with what it served, for `calibrate --labels` and the stream simulation."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

from llamadecide.calibration.certification import Draw
from llamadecide.calibration.compare import Record
from llamadecide.calibration.data import LabelledItem, Task
from llamadecide.calibration.profile import CalibrationProfile
from llamadecide.calibration.run import Lineage
from llamadecide.errors import InvalidRequestError
from llamadecide.labels.records import LabelledRecord
from llamadecide.labels.store import LabelStore


@dataclass(frozen=True)
class StoreLabels:
    items: list[LabelledItem]
    records: list[LabelledRecord]  # the same, as the store holds them
    without_input: int  # labelled items whose input the retention erased: they can no longer train


def item_id(record: LabelledRecord) -> str:
    return f"{record.item.id}:{record.item.question}"


def answers_task(record: LabelledRecord, task: Task) -> bool:
    """Whether a stored item asks the task's question: the same options (a score's by level name)."""
    if task.type == "score":
        return list(record.item.option_names or ()) == [str(o) for o in task.options]
    return record.item.kind == task.type and list(record.item.options) == list(task.options)


def record_draws(record: LabelledRecord) -> tuple[Draw, ...]:
    """How a stored item came to be labelled: every draw of known chance that took it, with the
    confidence the model that queued it had (none: picked by hand, in the frame it was recorded in)."""
    drawn = tuple(Draw(chance, frame, record.item.confidence) for frame, chance in record.draws)
    return drawn or (Draw(None, record.item.frame),)


def store_labels(store: LabelStore, task: Task, *, profile: str | None = None) -> StoreLabels:
    """The labels of a task's items (those served with `profile`, when given; else every item asking
    the task's question). An item certifies with its recorded chance; one picked otherwise trains only."""
    records = [r for r in store.labelled(task=profile) if answers_task(r, task)]
    usable = [r for r in records if r.item.input is not None]
    items = [
        LabelledItem(
            item_id(r),
            r.item.input,
            _data_label(r.label),
            record_draws(r),
        )
        for r in usable
    ]
    return StoreLabels(items, usable, len(records) - len(usable))


def _data_label(label) -> str:
    """A stored label as a labelled file would spell it (`Task.gold_index` reads it back)."""
    return str(label).lower() if isinstance(label, bool) else str(label)


def lineage(parent: CalibrationProfile, labels: StoreLabels, task: Task) -> Lineage:
    """The parent, and what it served on the labelled items it served (their stored probabilities)."""
    options = [o if isinstance(o, str) else str(o) for o in task.options]
    served = {
        item_id(r): Record(item_id(r), options, list(r.item.probabilities), None)
        for r in labels.records
        if r.item.version == parent.version_id
    }
    return Lineage(parent, served)


@dataclass(frozen=True)
class RefitItems:
    items: list[LabelledItem]  # the file's (a census: chance 1), then the store's
    fingerprint: str  # what the profile's dataset_fingerprint records
    lineage: Lineage | None


def refit_items(
    task: Task,
    data: Path | None,
    text_column: str,
    label_column: str,
    store_at: str | None,
    label_profile: str | None,
    parent: Path | None,
) -> RefitItems:
    """A calibration run's items from a labelled file, a label store, or both, and the parent the
    run refits (with what it served on the store's items)."""
    from llamadecide.calibration.data import file_fingerprint, read_labelled
    from llamadecide.labels.store import open_store

    items: list[LabelledItem] = []
    parts: list[str] = []
    if data is not None:
        fingerprint = file_fingerprint(data, text_column, label_column)
        file_draw = (Draw(1.0, f"file:{fingerprint[:12]}"),)
        items = [
            dataclasses.replace(item, draws=file_draw)
            for item in read_labelled(data, text_column=text_column, label_column=label_column)
        ]
        parts.append(fingerprint)
    found = None
    if store_at is not None:
        store = open_store(store_at)
        try:
            found = store_labels(store, task, profile=label_profile)
        finally:
            store.close()
        if not found.items:
            raise InvalidRequestError(f"{store_at} holds no labels of task {task.name!r} with their input")
        items += found.items
        parts.append(hashlib.sha256("\n".join(f"{i.id}={i.label}" for i in found.items).encode()).hexdigest())
    parent_profile = load_profile(parent) if parent is not None else None
    if parent_profile is None:
        chosen = None
    elif found is not None:
        chosen = lineage(parent_profile, found, task)
    else:
        chosen = Lineage(parent_profile)
    fingerprint = parts[0] if len(parts) == 1 else hashlib.sha256("|".join(parts).encode()).hexdigest()
    return RefitItems(items, fingerprint, chosen)


def load_profile(path: Path) -> CalibrationProfile:
    """The one profile of a file or calibrate --out folder."""
    from llamadecide.calibration.profile import profile_files

    files = profile_files(path) if Path(path).is_dir() else [Path(path)]
    if len(files) != 1:
        raise InvalidRequestError(f"{path} holds {len(files)} profiles; name one file", param="parent")
    return CalibrationProfile.load(files[0])
