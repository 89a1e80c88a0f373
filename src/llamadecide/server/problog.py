"""The probability log: one JSON line per answer, appended under a lock (one write call per line,
O_APPEND), so concurrent requests never interleave. Holds no request headers, hence no API key."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

from llamadecide.decisions import Answer


class ProbabilityLog:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(
        self,
        *,
        request_id: str,
        route: str,
        model: str,
        model_sha256: str,
        answers: list[Answer],
        seconds: float,
        names: list[str | None],
        state: object,
        usage: dict | None = None,
    ) -> None:
        """One line per answer; `usage` (the request's input and cached tokens) is on each of them."""
        now = time.time()
        # A hash of the state, not the state: joins runs of two models on the same items (compare)
        # without writing the caller's text to disk.
        text = state if isinstance(state, str) else json.dumps(state, sort_keys=True, default=str)
        state_sha256 = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()
        lines = []
        for answer, name in zip(answers, names):
            record = {
                "time": now,
                "request_id": request_id,
                "state_sha256": state_sha256,
                "route": route,
                "model": model,
                "model_sha256": model_sha256,
                "prompt_format": answer.prompt_format,
                "question": {
                    "name": name,
                    "type": answer.question.type,
                    "instructions": answer.question.instructions,
                    "mode": answer.question.mode,
                },
                "options": [o.value for o in answer.options],
                "probabilities": answer.probabilities,
                "logprobs": [o.logprob for o in answer.options],
                "chosen": answer.choice,
                "confidence": answer.confidence,
                "label_mass": answer.label_mass,
                "latency_ms": round(seconds * 1000, 3),
                "usage": usage,
            }
            lines.append(json.dumps(record, ensure_ascii=False, default=str))
        data = ("\n".join(lines) + "\n").encode("utf-8", errors="backslashreplace")
        with self._lock:
            os.write(self._fd, data)

    def close(self) -> None:
        os.close(self._fd)
