"""Reliability diagram and risk-coverage plot (PNG, matplotlib's Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from llamadecide.calibration.metrics import ece, reliability, risk_coverage  # noqa: E402


def _labels(y: np.ndarray | dict[str, np.ndarray], label: str) -> np.ndarray:
    """One set of gold labels for every curve, or each curve's own (curves measured on different items)."""
    return y[label] if isinstance(y, dict) else y


def reliability_diagram(
    curves: dict[str, np.ndarray], y: np.ndarray | dict[str, np.ndarray], path: Path, *, bins: int = 15, title: str = ""
) -> None:
    """Accuracy against confidence per equal-width bin, each point sized by the items in its bin, with
    the bins' counts in a histogram below (as scikit-learn's CalibrationDisplay shows them): a bin of
    one item is a point, not a full jump."""
    fig = reliability_figure(curves, y, bins=bins, title=title)
    fig.savefig(path)
    plt.close(fig)


def reliability_figure(
    curves: dict[str, np.ndarray], y: np.ndarray | dict[str, np.ndarray], *, bins: int = 15, title: str = ""
):
    fig, (ax, counts) = plt.subplots(
        2, 1, figsize=(5.5, 6.6), dpi=110, sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    ax.plot([0, 1], [0, 1], color="#999", linestyle="--", linewidth=1, label="perfect calibration")
    width = 1.0 / bins
    series = list(zip(curves.items(), ("#d9534f", "#2f5bea", "#1a8f4c")))
    for n, ((label, P), color) in enumerate(series):
        gold = _labels(y, label)
        table = reliability(P.max(1), P.argmax(1) == gold, bins, "width")
        sizes = np.array([b.count for b in table], dtype=float)
        ax.plot([b.confidence for b in table], [b.accuracy for b in table], color=color, linewidth=1, alpha=0.6)
        ax.scatter(
            [b.confidence for b in table],
            [b.accuracy for b in table],
            s=12 + 240 * sizes / max(sizes.max(), 1),
            color=color,
            alpha=0.8,
            label=f"{label} (ECE {ece(P, gold, bins):.3f}, {len(gold)} items)",
        )
        offset = (n - (len(series) - 1) / 2) * width / len(series)
        counts.bar(
            [(b.lower + b.upper) / 2 + offset for b in table],
            sizes,
            width=width / len(series),
            color=color,
            alpha=0.8,
        )
    ax.set_ylabel("accuracy")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title or "Reliability on the test part")
    ax.legend(loc="upper left", fontsize=8)
    counts.set_xlabel("confidence (top probability)")
    counts.set_ylabel("items per bin")
    fig.tight_layout()
    return fig


def risk_coverage_plot(
    curves: dict[str, np.ndarray],
    y: np.ndarray | dict[str, np.ndarray],
    path: Path,
    *,
    threshold_coverage: float | None = None,
) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 4.2), dpi=110)
    for (label, P), color in zip(curves.items(), ("#d9534f", "#2f5bea", "#1a8f4c")):
        coverage, risk = risk_coverage(P.max(1), P.argmax(1) == _labels(y, label))
        ax.plot(coverage, risk, color=color, label=f"{label} (AURC {risk.mean():.3f})")
    if threshold_coverage is not None:
        ax.axvline(
            threshold_coverage, color="#555", linestyle=":", label=f"chosen threshold ({threshold_coverage:.0%} auto)"
        )
    ax.set_xlabel("coverage (share answered automatically)")
    ax.set_ylabel("risk (error rate among them)")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.set_title("Risk-coverage on the test part")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
