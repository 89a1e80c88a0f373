"""The labelled data sets of the repository (`data/`), with the packaged task,
columns and split sizes the benches use for each."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamadecide.calibration.data import TASKS_DIR

DATA = Path(__file__).resolve().parents[1] / "data"


@dataclass(frozen=True)
class Dataset:
    path: Path
    task: Path
    text_column: str
    label_column: str
    labelled: int
    test: int


DATASETS = {
    "agnews": Dataset(DATA / "agnews" / "test.tsv", TASKS_DIR / "agnews.yaml", "0", "1", 500, 300),
    "sst2": Dataset(DATA / "sst2" / "dev.tsv", TASKS_DIR / "sst2.yaml", "sentence", "label", 500, 300),
    "banking77": Dataset(DATA / "banking77" / "test.csv", TASKS_DIR / "banking77.yaml", "text", "category", 1000, 300),
    "banking77-phrases": Dataset(
        DATA / "banking77" / "test.csv", TASKS_DIR / "banking77-phrases.yaml", "text", "category", 1000, 300
    ),
}
