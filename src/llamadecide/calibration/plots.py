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
    fig, ax = plt.subplots(figsize=(5.5, 5.2), dpi=110)
    ax.plot([0, 1], [0, 1], color="#999", linestyle="--", linewidth=1, label="perfect calibration")
    for (label, P), color in zip(curves.items(), ("#d9534f", "#2f5bea", "#1a8f4c")):
        gold = _labels(y, label)
        table = reliability(P.max(1), P.argmax(1) == gold, bins, "width")
        ax.plot(
            [b.confidence for b in table],
            [b.accuracy for b in table],
            marker="o",
            color=color,
            label=f"{label} (ECE {ece(P, gold, bins):.3f}, {len(gold)} items)",
        )
    ax.set_xlabel("confidence (top probability)")
    ax.set_ylabel("accuracy")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title or "Reliability on the test part")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


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
