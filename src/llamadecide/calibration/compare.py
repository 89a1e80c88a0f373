"""Comparing two runs on the same items: two probability logs (server JSONL) or two calibration
runs (predictions.jsonl), e.g. two model versions or two quantizations."""

from __future__ import annotations

import html
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamadecide.calibration.metrics import ece
from llamadecide.errors import InvalidRequestError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    key: str
    options: list[str]
    probabilities: list[float]
    label: int | None


def read_records(path: Path) -> dict[str, Record]:
    """predictions.jsonl (from calibrate: id, label, probabilities), a calibration output directory,
    or a probability log (from the server: keyed by state hash and question)."""
    path = Path(path)
    if path.is_dir():
        path = path / "predictions.jsonl"
    records: dict[str, Record] = {}
    with path.open(encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as exc:
            if index == last:  # what a crash mid-write leaves: no whole record, and nothing after it
                log.warning("%s: skipping its torn last line %d (%s)", path, index + 1, exc.msg)
                continue
            raise InvalidRequestError(
                f"{path}, line {index + 1}: not a JSON record ({exc.msg}, column {exc.colno})"
            ) from None
        options = [json.dumps(o) if not isinstance(o, str) else o for o in r["options"]]
        if "id" in r:
            key, label = str(r["id"]), r.get("label")
        else:
            question = r.get("question", {})
            key = f"{r.get('state_sha256', r.get('request_id'))}|{question.get('name') or question.get('instructions')}"
            label = r.get("label")
        records[key] = Record(key, options, list(r["probabilities"]), label)
    if not records:
        raise InvalidRequestError(f"{path} holds no records")
    return records


def compare(a: dict[str, Record], b: dict[str, Record], *, max_flips: int = 50) -> dict:
    keys = [k for k in a if k in b and a[k].options == b[k].options]
    if not keys:
        raise InvalidRequestError("the two runs share no items with the same options")
    Pa = [np.asarray(a[k].probabilities) for k in keys]
    Pb = [np.asarray(b[k].probabilities) for k in keys]
    top_a = np.array([p.argmax() for p in Pa])
    top_b = np.array([p.argmax() for p in Pb])
    kl = np.array(
        [float(np.sum(p * (np.log(np.clip(p, 1e-12, 1)) - np.log(np.clip(q, 1e-12, 1))))) for p, q in zip(Pa, Pb)]
    )
    flips = [
        {
            "key": k,
            "a": a[k].options[i],
            "b": b[k].options[j],
            "p_a": float(pa.max()),
            "p_b": float(pb.max()),
            "label": a[k].options[a[k].label] if a[k].label is not None else None,
        }
        for k, i, j, pa, pb in zip(keys, top_a, top_b, Pa, Pb)
        if i != j
    ]
    result = {
        "matched": len(keys),
        "only_a": len(a) - len(keys),
        "only_b": len(b) - len(keys),
        "agreement": float((top_a == top_b).mean()),
        "flip_rate": float((top_a != top_b).mean()),
        "mean_kl_a_b": float(kl.mean()),
        "flips": flips[:max_flips],
        "flips_total": len(flips),
    }
    labelled = [i for i, k in enumerate(keys) if a[k].label is not None]
    if labelled:
        y = np.array([a[keys[i]].label for i in labelled])
        same_width = len({len(Pa[i]) for i in labelled}) == 1
        acc_a = float((top_a[labelled] == y).mean())
        acc_b = float((top_b[labelled] == y).mean())
        result.update(accuracy_a=acc_a, accuracy_b=acc_b, accuracy_change=acc_b - acc_a)
        if same_width:
            ece_a = ece(np.stack([Pa[i] for i in labelled]), y)
            ece_b = ece(np.stack([Pb[i] for i in labelled]), y)
            result.update(ece_a=ece_a, ece_b=ece_b, ece_change=ece_b - ece_a)
    return result


def write_html(result: dict, path: Path, name_a: str, name_b: str) -> None:
    rows = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{v:.4f}</td></tr>"
        if isinstance(v, float)
        else f"<tr><td>{html.escape(str(k))}</td><td>{v}</td></tr>"
        for k, v in result.items()
        if k != "flips"
    )
    flips = "".join(
        f"<tr><td>{html.escape(f['key'])}</td><td>{html.escape(str(f['label']))}</td><td>{html.escape(f['a'])} "
        f"({f['p_a']:.2f})</td>"
        f"<td>{html.escape(f['b'])} ({f['p_b']:.2f})</td></tr>"
        for f in result["flips"]
    )
    Path(path).write_text(
        f"""<!doctype html><html><head><meta charset="utf-8"><title>Compare</title>
<style>body{{font:15px system-ui;max-width:900px;margin:2rem auto}}
td,th{{border:1px solid #ccd;padding:.3rem .6rem}}table{{border-collapse:collapse}}</style>
</head><body><h1>{html.escape(name_a)} vs {html.escape(name_b)}</h1><table>{rows}</table>
<h2>Items whose top choice flipped</h2>
<table><tr><th>item</th><th>label</th><th>A</th><th>B</th></tr>{flips}</table></body></html>""",
        encoding="utf-8",
    )
