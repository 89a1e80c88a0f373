"""The load benchmark's outputs: results.md, the console tables and the latency-throughput plot."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table


def fmt(v, spec=".3f") -> str:
    """A figure, or "-" where there is none."""
    return "-" if v is None else format(v, spec)


def markdown(results: dict) -> str:
    lines = [
        "| device | workload | concurrency | p50 s | p95 s | p99 s | req/s | vs lowest concurrency | errors | "
        "accuracy | "
        "invalid answers | rows/request | full-depth rows/request | decisions/engine run | floor s/request | "
        "floor efficiency |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    if results.get("accuracy"):
        lines.insert(0, f"Accuracy {results['accuracy']}.\n")
    for r in results["levels"]:
        lines.append(
            f"| {r['device']} | {r['kind']} | {r['concurrency']} | {fmt(r['p50_s'])} | {fmt(r['p95_s'])} | "
            f"{fmt(r['p99_s'])} | "
            f"{r['throughput_rps']:.2f} | {fmt(r.get('throughput_ratio'), '.2f')}x | {r['error_rate']:.1%} "
            f"| {fmt(r.get('accuracy'))} | "
            f"{fmt(r.get('invalid_answer_rate'), '.1%')} | {fmt(r.get('rows_per_request'), '.1f')} | "
            f"{fmt(r.get('full_depth_rows_per_request'), '.1f')} | "
            f"{fmt(r.get('decisions_per_engine_run'), '.2f')} | {fmt(r.get('floor_s_per_request'))} | "
            f"{fmt(r.get('floor_efficiency'), '.2f')} |"
        )
    if results.get("seconds_per_row"):
        lines += [
            "",
            "Floor: full-depth rows per request (each row weighted by the share of the model's blocks its call "
            "ran) x "
            + ", ".join(f"{s * 1000:.2f} ms a row on {d}" for d, s in results["seconds_per_row"].items())
            + " (a 512-row call, measured in this run); floor efficiency = floor / (1 / throughput).",
        ]
    if results["threads"]:
        lines += ["", "| threads | p50 s | req/s |", "| --- | --- | --- |"]
        lines += [f"| {t['threads']} | {fmt(t['p50_s'])} | {t['throughput_rps']:.2f} |" for t in results["threads"]]
    lines += [
        "",
        f"Cost per 1,000 decisions at the best CPU concurrency ({results['cost']['best_cpu_concurrency']}):",
        "",
        "| instance | vCPU | GPU | USD/h | req/s | USD per 1,000 | basis |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in results["cost"]["rows"]:
        lines.append(
            f"| {c['instance_type']} | {c['vcpu']} | {c['gpu'] or '-'} | {c['usd_per_hour']} | "
            f"{fmt(c['requests_per_second'], '.2f')} | "
            f"{fmt(c['usd_per_1000'], '.4f')} | {c['basis']} |"
        )
    lines += ["", f"Prices: {results['cost']['source']}", "", f"GPU: {results['gpu']}"]
    return "\n".join(lines) + "\n"


def print_tables(results: dict, console: Console) -> None:
    table = Table(title=f"load: {results['task']}, {results['requests_per_level']} requests per level")
    for col in (
        "device",
        "workload",
        "conc.",
        "p50 s",
        "p95 s",
        "p99 s",
        "req/s",
        "vs lowest",
        "errors",
        "accuracy",
        "invalid",
        "rows/req",
        "per run",
        "floor eff.",
    ):
        table.add_column(col, justify="right")
    for r in results["levels"]:
        table.add_row(
            r["device"],
            r["kind"],
            str(r["concurrency"]),
            fmt(r["p50_s"]),
            fmt(r["p95_s"]),
            fmt(r["p99_s"]),
            f"{r['throughput_rps']:.2f}",
            fmt(r.get("throughput_ratio"), ".2f") + "x",
            f"{r['error_rate']:.1%}",
            fmt(r.get("accuracy")),
            fmt(r.get("invalid_answer_rate"), ".1%"),
            fmt(r.get("rows_per_request"), ".0f"),
            fmt(r.get("decisions_per_engine_run"), ".1f"),
            fmt(r.get("floor_efficiency"), ".2f"),
        )
    console.print(table)
    cost = Table(title="cost per 1,000 decisions")
    for col in ("instance", "USD/h", "req/s", "USD / 1,000", "basis"):
        cost.add_column(col, justify="right")
    for c in results["cost"]["rows"]:
        cost.add_row(
            c["instance_type"],
            f"{c['usd_per_hour']}",
            fmt(c["requests_per_second"], ".2f"),
            fmt(c["usd_per_1000"], ".4f"),
            c["basis"],
        )
    console.print(cost)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=110)
    groups: dict = {}
    for r in results["levels"]:
        groups.setdefault((r["device"], r["kind"]), []).append(r)
    for (device, kind), rows in groups.items():
        rows.sort(key=lambda r: r["concurrency"])
        ax.plot(
            [r["throughput_rps"] for r in rows], [r["p50_s"] or 0 for r in rows], marker="o", label=f"{device} {kind}"
        )
        for r in rows:
            efficiency = f", floor {r['floor_efficiency']:.2f}" if r.get("floor_efficiency") is not None else ""
            ax.annotate(f"c={r['concurrency']}{efficiency}", (r["throughput_rps"], r["p50_s"] or 0), fontsize=7)
    ax.set_xlabel("throughput (requests/s)")
    ax.set_ylabel("median latency (s)")
    ax.set_title("Latency against throughput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
