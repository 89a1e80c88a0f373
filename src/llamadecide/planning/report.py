"""A plan's outputs beside plan.json: the Pareto plot, a self-contained HTML report (images embedded)
and the terminal tables."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llamadecide.bench.results import fmt


def pareto_plot(result: dict, path: Path) -> None:
    """Cost per 1,000 automatically handled decisions against the share handled automatically, one
    point per model x instance with a figure, the Pareto front joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = {(p["model"], p["instance"]) for p in result["pareto"]}
    fig, ax = plt.subplots(figsize=(7, 4.6), dpi=110)
    markers = "osD^vP*X"
    points = []
    for n, model in enumerate(m for m in result["models"] if not m.get("error")):
        xs, ys = [], []
        for instance in model["instances"]:
            if instance["usd_per_1000_auto"] is None:
                continue
            xs.append(model["auto_share"])
            ys.append(instance["usd_per_1000_auto"])
            points.append((model["auto_share"], instance["usd_per_1000_auto"], model["model"], instance["name"]))
        if xs:
            ax.scatter(xs, ys, marker=markers[n % len(markers)], label=model["model"], alpha=0.8)
    on_front = sorted((p for p in points if (p[2], p[3]) in front), key=lambda p: p[0])
    if on_front:
        ax.plot([p[0] for p in on_front], [p[1] for p in on_front], "k--", lw=1, label="Pareto front")
        labels: dict[tuple[float, float], list[str]] = {}  # instances at the same point share one label
        for share, cost, model, instance in on_front:
            labels.setdefault((share, cost), [model]).append(instance)
        for (share, cost), (model, *instances) in labels.items():
            ax.annotate(
                f"{model}\n{', '.join(instances)}", (share, cost), fontsize=6, xytext=(4, 4), textcoords="offset points"
            )
    if points:
        ax.set_yscale("log")
    ax.set_xlabel("share of test items handled automatically")
    ax.set_ylabel("USD per 1,000 automatically handled")
    ax.set_title(f"{result['task']}: cost against automation at precision {result['target_precision']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _image(path: Path) -> str:
    if not path.is_file():
        return "<p>(no figure)</p>"
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" style="max-width:100%">'


def write_html(result: dict, out: Path) -> None:
    esc = html.escape
    rec = result["recommendation"]
    choice = rec.get("choice")
    parts = [
        "<!doctype html><meta charset='utf-8'>",
        f"<title>plan: {esc(result['task'])}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}.front{font-weight:bold}</style>",
        f"<h1>Which model and instance for {esc(result['task'])}</h1>",
        f"<p>{result['items']} labelled items; calibration part {result['split']['calibration'] or 'a third'}, "
        f"test part {result['split']['test']}, seed {result['split']['seed']}. Target precision "
        f"{result['target_precision']} at {result['confidence_level']:.0%} confidence. Measured on this machine "
        f"({result['machine']['cpus']} CPUs). Prices: {esc(str(result['prices']))}</p>",
        "<h2>Recommendation</h2>",
        f"<p><b>{esc(choice['model'])} on {esc(choice['instance'])}</b>: {esc(rec['why'])}</p>"
        if choice
        else f"<p>None: {esc(rec['why'])}</p>",
        f"<p>Rule: {esc(rec['rule'])}.</p>",
    ]
    if choice and rec.get("runner_up"):
        parts.append(f"<p>{esc(runner_up_line(rec['runner_up']))}.</p>")
    if rec.get("break_even"):
        parts.append(f"<p><b>{esc(break_even_line(rec['break_even']))}</b>.</p>")
    elif rec.get("review_cost") is not None and rec.get("runner_up"):
        parts.append("<p>The two handle the same share automatically: no review cost changes their order.</p>")
    parts += [
        "<h2>Models</h2><table><tr><th>model</th><th>method</th><th>accuracy</th><th>ECE</th><th>threshold</th>"
        "<th>handled automatically</th><th>precision there (test)</th><th>p50 s (1 client)</th>"
        "<th>throughput req/s</th><th>calibrate s</th></tr>",
    ]
    for m in result["models"]:
        if m.get("error"):
            parts.append(f"<tr><td>{esc(m['model'])}</td><td colspan=9>failed: {esc(m['error'])}</td></tr>")
            continue
        parts.append(
            f"<tr><td>{esc(m['model'])}</td><td>{esc(m['method'])} ({esc(m['prompt_format'])})</td>"
            f"<td>{m['accuracy']:.3f}</td><td>{m['ece']:.4f}</td><td>{fmt(m['threshold'], '.2f')}</td>"
            f"<td>{m['auto_share']:.1%}</td><td>{fmt(m['precision_on_test'])}</td><td>{fmt(m['p50_s'])}</td>"
            f"<td>{m['throughput_rps']:.2f}</td><td>{m['calibrate_s']:.0f}</td></tr>"
        )
    parts.append("</table>")
    front = {(p["model"], p["instance"]) for p in result["pareto"]}
    parts.append(
        "<h2>Cost per model and instance</h2><p>Bold: on the Pareto front.</p><table><tr><th>model</th>"
        "<th>instance</th><th>req/s</th><th>USD per 1,000</th><th>USD per 1,000 handled automatically</th>"
        + (
            f"<th>USD per 1,000 in total (reviews at {result['review_cost']:g} USD)</th>"
            if result.get("review_cost") is not None
            else ""
        )
        + "<th>basis</th></tr>"
    )
    for m in result["models"]:
        for i in m.get("instances", []):
            cls = " class='front'" if (m["model"], i["name"]) in front else ""
            parts.append(
                f"<tr{cls}><td>{esc(m['model'])}</td><td>{esc(i['name'])}</td>"
                f"<td>{fmt(i['requests_per_second'], '.2f')}</td><td>{fmt(i['usd_per_1000'], '.4f')}</td>"
                f"<td>{fmt(i['usd_per_1000_auto'], '.4f')}</td>"
                + (
                    f"<td>{fmt(i.get('usd_per_1000_total'), '.2f')}</td>"
                    if result.get("review_cost") is not None
                    else ""
                )
                + f"<td>{esc(i['basis'])}</td></tr>"
            )
    parts.append("</table>")
    parts += ["<h2>Cost against automation</h2>", _image(out / "pareto.png"), "<h2>Reliability</h2><div>"]
    for m in result["models"]:
        if not m.get("error"):
            parts.append(
                "<figure style='display:inline-block;width:32%;margin:0'>"
                f"{_image(out / m['calibration_dir'] / 'reliability.png')}"
                f"<figcaption>{esc(m['model'])}</figcaption></figure>"
            )
    parts.append("</div>")
    (out / "report.html").write_text("\n".join(parts), encoding="utf-8")


def runner_up_line(second: dict) -> str:
    why = second.get("why") or f"{second['usd_per_1000_total']:.2f} USD per 1,000 decisions in total"
    return f"Runner-up: {second['model']} on {second['instance']}, {why}"


def break_even_line(even: dict) -> str:
    """The review cost at which the top two swap, and which wins on either side."""
    return (
        f"Break-even review cost {even['usd_per_review']:.4f} USD a review: above it {even['above']} costs less in "
        f"total (it sends fewer decisions to people), below it {even['below']} (its compute is cheaper)"
    )


def print_plan(result: dict, console: Console | None = None) -> None:
    console = console or Console()
    models = Table(title=f"plan: {result['task']}, target precision {result['target_precision']}")
    for column in ("model", "method", "accuracy", "ECE", "threshold", "auto", "p50 s", "req/s"):
        models.add_column(column, justify="right")
    for m in result["models"]:
        if m.get("error"):
            models.add_row(m["model"], f"[red]failed: {m['error']}[/red]", *[""] * 6)
            continue
        models.add_row(
            m["model"],
            m["method"],
            f"{m['accuracy']:.3f}",
            f"{m['ece']:.4f}",
            fmt(m["threshold"], ".2f"),
            f"{m['auto_share']:.1%}",
            fmt(m["p50_s"]),
            f"{m['throughput_rps']:.2f}",
        )
    console.print(models)
    totals = result.get("review_cost") is not None
    costs = Table(title="USD per 1,000 decisions: the two cheapest instances of each model")
    columns = ["model", "instance", "USD / 1,000", "USD / 1,000 auto"] + (["USD / 1,000 total"] if totals else [])
    for column in (*columns, "basis"):
        costs.add_column(column, justify="right")
    key = "usd_per_1000_total" if totals else "usd_per_1000_auto"
    for m in result["models"]:
        priced = [i for i in m.get("instances", []) if i.get(key) is not None]
        for i in sorted(priced, key=lambda i: i[key])[:2]:
            figures = [fmt(i["usd_per_1000"], ".4f"), fmt(i["usd_per_1000_auto"], ".4f")]
            figures += [fmt(i["usd_per_1000_total"], ".2f")] if totals else []
            costs.add_row(m["model"], i["name"], *figures, i["basis"])
    console.print(costs)
    rec = result["recommendation"]
    if rec.get("choice"):
        console.print(f"[bold]recommended[/bold]: {rec['why']}")
        if rec.get("runner_up"):
            console.print(runner_up_line(rec["runner_up"]))
        if rec.get("break_even"):
            console.print(break_even_line(rec["break_even"]))
    else:
        console.print(f"[yellow]no recommendation[/yellow]: {rec['why']}")
    console.print(f"rule: {rec['rule']}")
