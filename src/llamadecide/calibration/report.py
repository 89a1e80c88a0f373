"""A self-contained HTML report (images embedded) and the terminal table of a calibration run."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROWS = [
    ("accuracy", "accuracy", "{:.3f}"),
    ("NLL", "nll", "{:.4f}"),
    ("Brier", "brier", "{:.4f}"),
    ("ECE (equal width)", "ece_width", "{:.4f}"),
    ("ECE (equal mass)", "ece_mass", "{:.4f}"),
    ("AURC", "aurc", "{:.4f}"),
]


def _ci(metrics: dict, key: str) -> str:
    ci = metrics.get(f"{key}_ci")
    return f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""


def _raw_heading(raw: dict, cal: dict) -> str:
    """Over the row budget, raw answers exist only on the items whose answers were scored (on the
    calibration part when the test part's were never needed)."""
    if raw["n"] == cal["n"] and raw.get("part", "test") == "test":
        return "raw"
    return f"raw ({raw['n']} {'calibration ' if raw.get('part') == 'calibration' else ''}items with answers)"


def _compared(selection: dict) -> str:
    """On what items the candidates were compared (those reading answers may have fallen behind on the
    few items with answers, the others then compared on every item)."""
    compared, behind, items = selection["compared"], selection.get("behind", 0), selection["items"]
    if not behind:
        return f"{compared} compared on the same folds of {', '.join(map(str, items))} items. "
    return (
        f"{compared} compared on the same folds of {min(items)} items with answers, where the {behind} reading "
        f"answers fell behind (by over {selection['behind_by']:g} standard errors); the other "
        f"{compared - behind} then on the same folds of {max(items)} items. "
    )


def print_summary(summary: dict, console: Console | None = None) -> None:
    console = console or Console()
    raw, cal = summary["test"]["raw"], summary["test"]["calibrated"]
    table = Table(
        title=f"{summary['task']['name']}: test part ({cal['n']} items), calibrated with {summary['chosen']['label']}"
    )
    table.add_column("metric")
    table.add_column(_raw_heading(raw, cal), justify="right")
    table.add_column("calibrated", justify="right")
    for label, key, fmt in ROWS:
        table.add_row(label, fmt.format(raw[key]) + _ci(raw, key), fmt.format(cal[key]) + _ci(cal, key))
    console.print(table)
    selection, chosen = summary.get("selection"), summary["chosen"]
    if selection:
        console.print(
            f"chosen: {chosen['label']}, the simplest of {selection['within_one_se']} candidates within one "
            f"standard error (of the item-by-item difference) of the lowest cross-validated NLL "
            f"({selection['lowest']['label']}, {selection['lowest']['cv_nll']:.4f}); "
            + _compared(selection)
            + f"Chosen, cross-validated → test: accuracy {chosen['cv_accuracy']:.3f} → {cal['accuracy']:.3f}, "
            f"NLL {chosen['cv_nll']:.4f} → {cal['nll']:.4f}"
        )
    plan = summary.get("scoring") or {}
    if plan.get("left_out") or plan.get("hidden_state_on_every_item"):
        planned = plan.get("answers_planned", {})
        answered = " | ".join(
            f"{label}: {n}" + (f" of {planned[label]} planned" if planned.get(label, n) != n else "")
            for label, n in plan["answers_scored"].items()
        )
        console.print(
            f"within the row budget ({plan['row_budget']:,}, about {plan['estimated_rows']:,} used): answers "
            f"scored for {answered} items; hidden states alone on every item in "
            f"{' | '.join(plan['hidden_state_on_every_item']) or 'none'}; left out: "
            f"{' | '.join(plan['left_out']) or 'none'} (--row-budget 0 scores everything)"
        )
    cost = summary.get("cost")
    if cost:
        console.print(
            f"cost: {cost['items']} items x {cost['variants']} variants scored in {cost['scoring_s']:.0f} s "
            f"({cost['scoring_s_per_item']:.2f} s per item"
            + (
                f"; {cost['comparing_while_scoring_s']:.0f} s of it comparing candidates between rounds of answers"
                if cost.get("comparing_while_scoring_s")
                else ""
            )
            + f"), {cost['total_s']:.0f} s in all ({cost['total_s_per_item']:.2f} s per item)"
        )
    th = summary["threshold"]
    if th["calibration"]:
        c, t = th["calibration"], th["test"]
        console.print(
            f"threshold confidence >= {c['threshold']:.2f} for precision >= {c['target_precision']:.0%} "
            f"with {c['confidence_level']:.0%} confidence: calibration coverage {c['coverage']:.1%} "
            f"(lower bound {c['lower_bound']:.3f}); test coverage {t['coverage']:.1%}, test precision "
            f"{t['precision'] if t['precision'] is None else format(t['precision'], '.3f')}"
        )
    else:
        console.print(
            f"no threshold reaches precision {th['target']:.0%} with {th['confidence_level']:.0%} confidence: "
            f"escalate everything"
        )
        for line in reachable_lines(th):
            console.print("  " + line)
    for line in certification_lines(summary):
        console.print(line)
    cp = summary["conformal"]
    console.print(
        f"conformal sets (alpha {cp['alpha']}): test coverage {cp['coverage']:.3f}, mean size "
        f"{cp['mean_set_size']:.2f}, "
        f"singletons {cp['singleton_rate']:.1%}"
    )


def certification_lines(summary: dict) -> list[str]:
    """Which labels certify the threshold and which only train; a refit's parent and how it compares."""
    lines = []
    counts = summary.get("certification")
    if counts and (counts["train_only"] or len(counts["frames"]) > 1 or "file" not in "".join(counts["frames"])):
        frames = ", ".join(
            f"{name}: {f['items']} items, effective {f['effective_size']:.0f}" for name, f in counts["frames"].items()
        )
        lines.append(
            f"labels: {counts['certify']} certify (each weighted by the inverse of its chance of review; {frames}), "
            f"{counts['train_only']} only train (picked with no recorded chance)"
        )
    if counts and counts.get("cross_fitted"):
        lines.append(
            f"cross-fitted: {counts['cross_fitted']} calibrations served, each input answered by one fitted without "
            "its label; every label of known chance certifies with the probabilities served for it"
        )
    parent = summary.get("parent")
    if parent:
        if parent.get("matched"):
            lines.append(
                f"against its parent {parent['parent']} on the {parent['matched']} labelled items it served: "
                f"accuracy {parent['accuracy_a']:.3f} -> {parent['accuracy_b']:.3f}, agreement "
                f"{parent['agreement']:.3f}, flip rate {parent['flip_rate']:.3f}"
            )
        else:
            lines.append(f"parent {parent['parent']}: none of the labelled items was served by it")
    return lines


def reachable_lines(th: dict) -> list[str]:
    """What the labelled items do support when the target is out of reach (thresholds.reachable)."""
    found = th.get("reachable")
    if not found:
        return []
    lines = [
        f"at precision {row['precision']:.0%} ({th['confidence_level']:.0%} confidence): "
        + (
            f"{row['coverage']:.1%} of items handled automatically (confidence >= {row['threshold']:.2f})"
            if row["threshold"] is not None
            else "no threshold either"
        )
        for row in found["at_precision"]
        if row["precision"] != th["target"]
    ]
    need = found["labels_needed"]
    if need is None:
        lines.append(
            f"no confident slice of the answers is above {th['target']:.0%} precision now: more labels alone "
            "will not reach the target (try another method, prompt format or model)"
        )
    else:
        lines.append(
            f"the target needs about {need['labelled']} labelled calibration items in all ({need['more']} more) "
            f"at the precision the answers with confidence >= {need['threshold']:.2f} show now "
            f"({need['observed_precision']:.3f} on {need['coverage']:.1%} of items)"
        )
    return lines


def write_html(summary: dict, out_dir: Path) -> Path:
    def img(name: str) -> str:
        data = base64.b64encode((out_dir / name).read_bytes()).decode()
        return f'<img alt="{name}" src="data:image/png;base64,{data}">'

    raw, cal = summary["test"]["raw"], summary["test"]["calibrated"]
    rows = "".join(
        f"<tr><td>{label}</td><td>{fmt.format(raw[key])}{_ci(raw, key)}</td>"
        f"<td>{fmt.format(cal[key])}{_ci(cal, key)}</td></tr>"
        for label, key, fmt in ROWS
    )
    cands = "".join(
        f"<tr><td>{html.escape(c['mode'])}</td><td>{html.escape(c['label'])}</td><td>{c['cv_nll']:.4f}</td>"
        f"<td>{c['cv_items']}{' (fell behind)' if c.get('behind') else ''}</td></tr>"
        for c in summary["candidates"]
    )
    th = summary["threshold"]
    policy = (
        f"<p>Act automatically when confidence &ge; <b>{th['calibration']['threshold']:.2f}</b>: calibration "
        f"coverage {th['calibration']['coverage']:.1%}, test coverage {th['test']['coverage']:.1%}, "
        f"test precision "
        f"{th['test']['precision']:.3f} (target {th['target']:.0%} at {th['confidence_level']:.0%} "
        f"confidence).</p>"
        if th["calibration"] and th["test"]["precision"] is not None
        else "<p>No threshold meets the target: escalate everything.</p><ul>"
        + "".join(f"<li>{html.escape(line)}</li>" for line in reachable_lines(th))
        + "</ul>"
    )
    name = html.escape(summary["task"]["name"])
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Calibration: {name}</title>
<style>body{{font:15px system-ui,sans-serif;max-width:900px;margin:2rem auto;color:#1d2330}}
table{{border-collapse:collapse;margin:1rem 0}}
td,th{{border:1px solid #ccd;padding:.3rem .6rem;text-align:right}}td:first-child,th:first-child{{text-align:left}}
img{{max-width:48%}}</style></head><body>
<h1>Calibration: {html.escape(summary["task"]["name"])}</h1>
<p>{html.escape(summary["backend"])} · model {summary["model_sha256"][:16]}… ·
prompt format {summary["prompt_format"]} · {summary["split"]["calibration"]} calibration items,
{summary["split"]["test"]} test items (seed {summary["split"]["seed"]})</p>
<h2>Test part, before and after</h2>
<table><tr><th>metric</th><th>{html.escape(_raw_heading(raw, cal))}</th>
<th>calibrated ({html.escape(summary["chosen"]["label"])})</th></tr>
{rows}</table>
<h2>Policy</h2>{policy}
{"".join(f"<p>{html.escape(line)}</p>" for line in certification_lines(summary))}
<p>Conformal sets (alpha {summary["conformal"]["alpha"]}): coverage {summary["conformal"]["coverage"]:.3f}, mean size
{summary["conformal"]["mean_set_size"]:.2f}, singletons {summary["conformal"]["singleton_rate"]:.1%}.</p>
{img("reliability.png")} {img("risk_coverage.png")}
<h2>Candidates (5-fold cross-validated NLL on the calibration part)</h2>
<table><tr><th>mode</th><th>calibrator</th><th>CV NLL</th><th>held-out items</th></tr>{cands}</table>
</body></html>"""
    path = out_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
