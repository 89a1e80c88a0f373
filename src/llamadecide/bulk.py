"""Bulk decisions: every line of a CSV, TSV or JSON Lines file decided, many inputs per engine call,
one output line per input in input order. Resumable: the output file is always a prefix of the
full result (an interrupted run left whole lines, a torn last one is dropped), and a later run
continues after it, so nothing is decided twice and nothing is lost. A line that cannot be decided
(bad JSON, no text, an input too long for the context) gets an error line of its own."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamadecide.decisions import Answer, Decider, Decision, DecisionInput, Question, Scoring
from llamadecide.errors import InvalidRequestError, LlamaDecideError

BATCH_INPUTS = 16  # inputs handed to the engine at once


@dataclass(frozen=True)
class BulkInput:
    line: int  # 1-based position among the file's inputs
    id: str
    text: str | None  # None: the line could not be read (see error)
    error: str | None = None


def read_inputs(path: Path, *, text_column: str = "text", id_column: str | None = None) -> Iterator[BulkInput]:
    """Every input of a CSV/TSV (a header row; columns by name, or by index with none) or JSONL
    file, bad lines included (with their error)."""
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        with path.open(encoding="utf-8") as handle:
            line = 0
            for raw in handle:
                if not raw.strip():
                    continue
                line += 1
                try:
                    record = json.loads(raw)
                    if not isinstance(record, dict):
                        raise ValueError("not a JSON object")
                except ValueError as exc:
                    yield BulkInput(line, str(line), None, f"line {line} is not a JSON object: {exc}")
                    continue
                ident = str(record.get(id_column, line)) if id_column else str(record.get("id", line))
                text = record.get(text_column)
                if text is None:
                    yield BulkInput(line, ident, None, f"line {line} has no field {text_column!r}")
                else:
                    shown = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
                    yield BulkInput(line, ident, shown)
        return
    delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    header = not text_column.isdigit()
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(
            handle, delimiter=delimiter, quoting=csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
        )
        names = next(reader, []) if header else None
        if names is not None and text_column not in names:
            raise InvalidRequestError(
                f"{path}: no column {text_column!r} (have {', '.join(names)})", param="text_column"
            )
        text_index = names.index(text_column) if names is not None else int(text_column)
        id_index = None
        if id_column is not None:
            id_index = names.index(id_column) if names is not None and id_column in names else int(id_column)
        line = 0
        for row in reader:
            if not row:
                continue
            line += 1
            ident = row[id_index] if id_index is not None and id_index < len(row) else str(line)
            if text_index >= len(row):
                yield BulkInput(line, ident, None, f"line {line} has no column {text_column!r}")
            else:
                yield BulkInput(line, ident, row[text_index])


def answer_record(answer: Answer, threshold: float | None = None) -> dict[str, Any]:
    """An answer as plain JSON (what `decide --json` prints and a bulk output line holds)."""
    record: dict[str, Any] = {
        "type": answer.question.type,
        "choice": answer.choice,
        "confidence": answer.confidence,
        "label_mass": answer.label_mass,
        "prompt_format": answer.prompt_format,
        "mode": answer.question.mode,
        "probabilities": [
            {"value": o.value, "probability": o.probability, "logprob": o.logprob, "tokens": o.n_tokens}
            for o in answer.options
        ],
    }
    if answer.question.type == "score":
        record["score"] = answer.score
    if answer.question.type == "predicate":
        record["probability"] = answer.probability
    if answer.probability_bound:
        record["probability_bound"] = answer.probability_bound
    if threshold is not None:
        record["action"] = "auto" if answer.confidence >= threshold else "escalate"
    return record


def done_lines(out: Path) -> int:
    """How many inputs an earlier run wrote (whole lines, in input order); a torn last line is cut off."""
    if not out.exists():
        return 0
    data = out.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        with out.open("r+b") as handle:
            handle.truncate(len(whole))
    count = 0
    for count, raw in enumerate(whole.splitlines(), start=1):
        record = json.loads(raw)
        if record.get("line") != count:
            raise InvalidRequestError(
                f"{out} is not the output of this input (line {count} says {record.get('line')}); write to a new file"
            )
    return count


def decide_file(
    decider: Decider,
    inputs: Sequence[BulkInput],
    question: Question,
    scoring: Scoring,
    out: Path,
    *,
    threshold: float | None = None,
    batch: int = BATCH_INPUTS,
    progress: Callable[[int], None] = lambda n: None,
) -> dict[str, int]:
    """Decide every input not yet in `out` and append its line; returns counts (decided, errors, skipped)."""
    skipped = done_lines(out)
    todo = [item for item in inputs if item.line > skipped]
    counts = {"decided": 0, "errors": 0, "skipped": skipped}
    progress(0)
    with out.open("a", encoding="utf-8") as handle:
        for start in range(0, len(todo), batch):
            chunk = todo[start : start + batch]
            readable = [item for item in chunk if item.text is not None]
            results = iter(decider.decide_many([DecisionInput(item.text, [question], scoring) for item in readable]))
            lines = []
            for item in chunk:
                result: Decision | Exception | str = (
                    next(results) if item.text is not None else item.error or "unreadable"
                )
                record: dict[str, Any] = {"line": item.line, "id": item.id}
                if isinstance(result, Decision):
                    record["answers"] = [answer_record(a, threshold) for a in result.answers]
                    record["usage"] = {
                        "input_tokens": result.prompt_tokens,
                        "cached_tokens": result.extra.get("cached_tokens", 0),
                    }
                    counts["decided"] += 1
                else:
                    message = result.message if isinstance(result, LlamaDecideError) else str(result)
                    record["error"] = {
                        "message": message,
                        "type": type(result).__name__ if not isinstance(result, str) else "InvalidInput",
                    }
                    counts["errors"] += 1
                lines.append(json.dumps(record, ensure_ascii=False) + "\n")
            handle.write("".join(lines))  # a whole batch at once, in input order
            handle.flush()
            os.fsync(handle.fileno())
            progress(len(chunk))
    return counts
