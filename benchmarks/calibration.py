"""Calibration measurement on AG News with the bundled model (a script that prints figures).

    python -m benchmarks.calibration [--calibration-size 1000] [--test-size 2000] [--out DIR]

Scores every item once (cached in DIR, so a re-run or an interrupted run resumes), fits on the
calibration part, and prints raw and calibrated ECE and NLL on the test part, then the threshold,
coverage and test precision for the default target (0.95) and for looser ones.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llamadecide.calibration.backends import LocalBackend
from llamadecide.calibration.config import RunConfig
from llamadecide.calibration.data import TASKS_DIR, file_fingerprint, load_task, read_labelled
from llamadecide.calibration.report import print_summary
from llamadecide.calibration.run import calibrate
from llamadecide.engine import Engine
from llamadecide.settings import Settings

DATA = Path(__file__).resolve().parents[1] / "data" / "agnews" / "test.tsv"
TASK = TASKS_DIR / "agnews.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--task", type=Path, default=TASK)
    parser.add_argument("--calibration-size", type=int, default=1000)
    parser.add_argument("--test-size", type=int, default=2000)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.95, 0.8, 0.6, 0.5])
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=Path("calibration-agnews"))
    args = parser.parse_args(argv)
    task = load_task(args.task)
    items = read_labelled(args.data, text_column="0", label_column="1")
    backend = LocalBackend(Engine(Settings(**({"model": args.model} if args.model else {})).engine_config()))
    console = Console()
    rows = []
    for target in args.targets:
        config = RunConfig(
            out_dir=args.out if target == args.targets[0] else args.out / f"target-{target}",
            calibration_size=args.calibration_size,
            test_size=args.test_size,
            target_precision=target,
            confidence_level=args.confidence,
            dataset_fingerprint=file_fingerprint(args.data, "0", "1"),
            show_progress=target == args.targets[0],
        )
        if target != args.targets[0]:
            config.out_dir.mkdir(parents=True, exist_ok=True)
            (config.out_dir / "cache.sqlite").unlink(missing_ok=True)
            (config.out_dir / "cache.sqlite").symlink_to((args.out / "cache.sqlite").resolve())
        summary = calibrate(backend, task, items, config)
        if target == args.targets[0]:
            print_summary(summary, console)
        th = summary["threshold"]
        rows.append((target, th["calibration"], th["test"]))
    table = Table(title=f"thresholds at {args.confidence:.0%} confidence (calibrated probabilities)")
    for column in (
        "target precision",
        "threshold",
        "calibration coverage",
        "CP lower bound",
        "test coverage",
        "test precision",
    ):
        table.add_column(column, justify="right")
    for target, cal, test in rows:
        if cal is None:
            table.add_row(f"{target:.2f}", "none", "0%", "-", "0%", "- (escalate all)")
        else:
            precision = "-" if test["precision"] is None else f"{test['precision']:.3f}"
            table.add_row(
                f"{target:.2f}",
                f"{cal['threshold']:.2f}",
                f"{cal['coverage']:.1%}",
                f"{cal['lower_bound']:.3f}",
                f"{test['coverage']:.1%}",
                precision,
            )
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
