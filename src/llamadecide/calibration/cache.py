"""Answers already computed, so an interrupted calibration run resumes where it stopped. Keyed by
model identity (SHA-256), prompt format, scoring mode, task and item text."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
from pathlib import Path

import numpy as np

from llamadecide.calibration.backends import ItemScores

# Scores cached before the engine's deterministic numerics (flash attention, fixed call shapes) moved
# by llama.cpp's kernel noise: not reused.
NUMERICS = "deterministic-1"


class ScoreCache:
    def __init__(self, path: Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path))
        self.db.execute("CREATE TABLE IF NOT EXISTS scores (key TEXT PRIMARY KEY, value TEXT NOT NULL)")

    @staticmethod
    def key(identity: str, prompt_format: str, mode: str, task: str, text: str) -> str:
        return hashlib.sha256(json.dumps([NUMERICS, identity, prompt_format, mode, task, text]).encode()).hexdigest()

    def get(self, key: str) -> ItemScores | None:
        row = self.db.execute("SELECT value FROM scores WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        data = json.loads(row[0])
        hidden = data.get("hidden")
        return ItemScores(
            data["logprobs"],
            data["n_tokens"],
            None if hidden is None else np.frombuffer(base64.b64decode(hidden), dtype="<f4").astype(np.float64),
        )

    def put(self, key: str, scores: ItemScores) -> None:
        data = {"logprobs": scores.logprobs, "n_tokens": scores.n_tokens}
        if scores.hidden is not None:  # float32 is what llama.cpp computed; base64 keeps the file small
            data["hidden"] = base64.b64encode(np.asarray(scores.hidden, dtype="<f4").tobytes()).decode()
        self.db.execute("INSERT OR REPLACE INTO scores VALUES (?, ?)", (key, json.dumps(data)))

    def commit(self) -> None:
        self.db.commit()

    def close(self) -> None:
        self.db.commit()
        self.db.close()
