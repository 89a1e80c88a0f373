"""A real `llamadecide serve` process (for benchmarks and end-to-end tests): started on a free
port, waited on via /ping, always stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.port = free_port()
        self.command = command
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.log_path = (log_dir or Path("/tmp")) / f"llamadecide-server-{self.port}.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 300.0) -> ServerProcess:
        self._log = open(self.log_path, "wb")
        command = self.command or [
            sys.executable,
            "-m",
            "llamadecide.cli.main",
            "serve",
            "--port",
            str(self.port),
            *self.args,
        ]
        self.process = subprocess.Popen(command, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}/ping", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not become ready:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if hasattr(self, "_log"):
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
