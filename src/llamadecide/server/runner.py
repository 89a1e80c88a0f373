"""Running the HTTP server as a process: the serve commands' shared loop. A model that cannot load
ends it with exit status 1 and a one-line reason; a stop signal drains for a bounded time."""

from __future__ import annotations

import sys
import threading
from typing import Any

import uvicorn

from llamadecide.engine.gguf_file import gguf_problem
from llamadecide.errors import ModelLoadError
from llamadecide.server.app import create_app
from llamadecide.server.scheduler import EngineScheduler
from llamadecide.settings import Settings


class DrainingServer(uvicorn.Server):
    """On SIGTERM or SIGINT, in-flight and queued requests finish for up to `drain_timeout`
    seconds; then waiting ones get 503 and running generations stop, so the process exits in
    bounded time (SageMaker kills a container 30 s after its stop signal)."""

    def __init__(self, config: uvicorn.Config, scheduler: EngineScheduler, drain_timeout: float) -> None:
        super().__init__(config)
        self._scheduler = scheduler
        self._drain_timeout = drain_timeout
        self._timer: threading.Timer | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self._drain_timeout, self._scheduler.drain_expired)
            self._timer.daemon = True
            self._timer.start()
        super().handle_exit(sig, frame)


def run_server(settings: Settings, *, log_level: str = "info", **uvicorn_options: Any) -> int:
    """Serve until stopped; the exit status is 1, with the one-line reason on stderr, when the model
    cannot load (checked before listening where the file alone tells, else as soon as loading fails),
    so a container or a supervisor sees the failure at once."""
    try:
        problem = gguf_problem(settings.model_path())
    except (ModelLoadError, OSError) as exc:
        problem = str(exc)
    if problem is not None:
        print(f"error: the model cannot load: {problem}", file=sys.stderr)
        return 1
    server: DrainingServer | None = None

    def stop(_reason: str) -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_load_error=stop)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=int(settings.drain_timeout) + 5,
        **uvicorn_options,
    )
    server = DrainingServer(config, app.state.runtime.scheduler, settings.drain_timeout)
    server.run()
    if app.state.runtime.load_error:
        print(f"error: the model cannot load: {app.state.runtime.load_error}", file=sys.stderr)
        return 1
    return 0
