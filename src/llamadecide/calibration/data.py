"""Labelled files (CSV, TSV, JSONL) and task files (YAML or JSON)."""

from __future__ import annotations

import csv
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from llamadecide.calibration.certification import Draw
from llamadecide.decisions import Question, choice, predicate, score
from llamadecide.errors import InvalidRequestError


@dataclass(frozen=True)
class LabelledItem:
    id: str
    text: str
    label: str
    # How it came to be labelled: an item of a labelled file is one of a census (chance 1); items from
    # the label store carry every draw with its recorded chance (none: picked by hand, trains but
    # never certifies).
    draws: tuple[Draw, ...] = (Draw(1.0, "file"),)


def _column(row: list[str] | dict, column: str, header: list[str] | None, path: Path) -> str:
    if isinstance(row, dict):
        if column not in row:
            raise InvalidRequestError(f"{path}: no field {column!r} (have {', '.join(row)})")
        return str(row[column])
    if header is not None:
        if column not in header:
            raise InvalidRequestError(f"{path}: no column {column!r} (have {', '.join(header)})")
        return row[header.index(column)]
    if not column.isdigit():
        raise InvalidRequestError(f"{path}: the file has no header; name columns by index (0, 1, ...)")
    return row[int(column)]


def read_labelled(path: Path, *, text_column: str, label_column: str, header: bool | None = None) -> list[LabelledItem]:
    """Rows of a CSV/TSV (columns by name, or by index for files without a header) or JSONL file.
    `header=None` assumes a header unless the columns are given as indices."""
    path = Path(path)
    suffix = path.suffix.lower()
    items: list[LabelledItem] = []
    if suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8") as handle:
            for n, line in enumerate(handle):
                if line.strip():
                    record = json.loads(line)
                    items.append(
                        LabelledItem(
                            str(record.get("id", n)),
                            _column(record, text_column, None, path),
                            _column(record, label_column, None, path),
                        )
                    )
        return items
    delimiter = "\t" if suffix in (".tsv", ".tab") else ","
    if header is None:
        header = not (text_column.isdigit() and label_column.isdigit())
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(
            handle, delimiter=delimiter, quoting=csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
        )
        names = next(reader) if header else None
        for n, row in enumerate(reader):
            if row:
                items.append(
                    LabelledItem(
                        str(n), _column(row, text_column, names, path), _column(row, label_column, names, path)
                    )
                )
    return items


def file_fingerprint(path: Path, *parts: object) -> str:
    digest = hashlib.sha256(Path(path).read_bytes())
    digest.update(json.dumps([str(p) for p in parts]).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Task:
    """What to ask of every item, and how data labels map onto the declared options."""

    name: str
    type: Literal["choice", "predicate", "score"]
    instructions: str
    options: list[Any]  # option values (True/False for a predicate, level labels for a score)
    descriptions: list[str | None]
    labels: dict[str, Any] = field(default_factory=dict)  # data label -> option value
    mode: Literal["text", "labels"] | None = None

    def question(self, mode: str | None = None) -> Question:
        chosen = mode or self.mode
        if self.type == "predicate":
            return predicate(
                self.instructions,
                name=self.name,
                true_description=self.descriptions[0],
                false_description=self.descriptions[1],
                mode=chosen or "text",
            )
        if self.type == "score":
            return score(
                self.instructions, list(zip(self.options, self.descriptions)), name=self.name, mode=chosen or "labels"
            )
        return choice(
            self.instructions, list(zip(self.options, self.descriptions)), name=self.name, mode=chosen or "text"
        )

    def gold_index(self, label: str) -> int:
        value = self.labels.get(label, label)
        if self.type == "predicate" and not isinstance(value, bool):
            value = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}.get(
                str(value).lower(), value
            )
        for i, option in enumerate(self.options):
            if option == value and type(option) is type(value):
                return i
        if self.type == "score":
            for i in range(len(self.options)):
                if str(i) == str(value):
                    return i
        raise InvalidRequestError(
            f"data label {label!r} maps to {value!r}, which is not an option of task "
            f"{self.name!r}; "
            "add it to the task's `labels` mapping"
        )

    def fingerprint(self) -> str:
        return hashlib.sha256(
            json.dumps(
                [self.type, self.instructions, [str(o) for o in self.options], self.descriptions], default=str
            ).encode()
        ).hexdigest()[:16]


class _TaskLoader(yaml.SafeLoader):
    """YAML as version 1.2 reads it: only true and false are booleans. (YAML 1.1, PyYAML's default,
    also reads yes, no, on and off as booleans, and intent sets have intents named "yes" and "no".)"""


_TaskLoader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_TaskLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _as_text(value: Any) -> Any:
    """A choice or score option (or the option a label maps to) as text: `true` stays the word."""
    return str(value).lower() if isinstance(value, bool) else value


TASKS_DIR = Path(__file__).resolve().parents[1] / "tasks"  # the task files shipped in the package


def packaged_tasks() -> list[str]:
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))


def task_path(name_or_path: str | Path) -> Path:
    """A task file's path, or the name of a task shipped in the package (`agnews`, `sst2`, ...)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = TASKS_DIR / f"{path.name.removesuffix('.yaml')}.yaml"
    if path.parent == Path(".") and packaged.is_file():
        return packaged
    raise InvalidRequestError(
        f"no task file {str(name_or_path)!r}: give a YAML or JSON file, or a packaged task "
        f"({', '.join(packaged_tasks())})",
        param="task",
    )


def load_task(path: str | Path) -> Task:
    """A task from a file, or by the name of a packaged task."""
    path = task_path(path)
    text = Path(path).read_text(encoding="utf-8")
    data = yaml.load(text, Loader=_TaskLoader) if Path(path).suffix.lower() in (".yaml", ".yml") else json.loads(text)
    if not isinstance(data, dict):
        raise InvalidRequestError(f"{path}: a task file holds a mapping")
    kind = data.get("type", "choice")
    if kind not in ("choice", "predicate", "score"):
        raise InvalidRequestError(f"{path}: unknown task type {kind!r}")
    if not data.get("instructions"):
        raise InvalidRequestError(f"{path}: the task needs `instructions`")
    if kind == "predicate":
        options = [True, False]
        descriptions = [data.get("true_description"), data.get("false_description")]
    else:
        raw = data.get("options") or []
        options, descriptions = [], []
        for entry in raw:
            if isinstance(entry, dict):
                options.append(_as_text(entry.get("value", entry.get("label"))))
                descriptions.append(entry.get("description"))
            else:
                options.append(_as_text(entry))
                descriptions.append(None)
        if len(options) < 2:
            raise InvalidRequestError(f"{path}: a {kind} task needs at least 2 options")
    labels = {str(k): v if kind == "predicate" else _as_text(v) for k, v in (data.get("labels") or {}).items()}
    return Task(
        name=data.get("name") or Path(path).stem,
        type=kind,
        instructions=data["instructions"],
        options=options,
        descriptions=descriptions,
        labels=labels,
        mode=data.get("mode"),
    )
