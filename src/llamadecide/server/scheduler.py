"""One engine, one worker thread, a bounded wait.

Requests beyond the bound are refused at once (503) instead of piling up. Every job carries a
cancellation event: a job whose client went away, or that is still waiting when a shutdown's drain
time runs out, never reaches the engine; a running generation checks the event at every token and
stops. A running decision (one llama_decode call) always finishes: it is short.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Awaitable, Callable, TypeVar

from llamadecide.server.errors import APIError

T = TypeVar("T")

DISCONNECT_POLL_S = 0.25


class Abandoned(Exception):
    """The job was cancelled before it reached the engine."""


class EngineScheduler:
    def __init__(self, max_waiting: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._max_waiting = max_waiting
        self._lock = threading.Lock()
        self._pending = 0  # waiting or running
        self._jobs: set[threading.Event] = set()  # cancellation events of admitted jobs
        self.draining = False  # set once a shutdown's drain time has run out

    @property
    def depth(self) -> int:
        return self._pending

    def _admit(self, cancelled: threading.Event) -> None:
        with self._lock:
            if self.draining:
                raise APIError(503, "the server is shutting down; retry on another instance", type="unavailable_error",
                               code="shutting_down")
            if self._pending >= self._max_waiting + 1:
                raise APIError(503, "the engine queue is full; retry shortly", type="unavailable_error", code="overloaded")
            self._pending += 1
            self._jobs.add(cancelled)

    def _release(self, cancelled: threading.Event) -> None:
        with self._lock:
            self._pending -= 1
            self._jobs.discard(cancelled)

    @staticmethod
    def _guarded(fn: Callable[..., T], args: tuple, cancelled: threading.Event) -> Callable[[], T]:
        def job() -> T:
            if cancelled.is_set():
                raise Abandoned()
            return fn(*args)
        return job

    async def run(self, fn: Callable[..., T], *args: object, cancelled: threading.Event | None = None,
                  disconnected: Callable[[], Awaitable[bool]] | None = None) -> T:
        """Run `fn(*args)` on the engine thread. With `disconnected`, the client is watched while the
        job waits or runs: once it is gone the job is cancelled (`cancelled` is what a cooperative
        `fn` checks) and the request ends without an answer."""
        cancelled = cancelled or threading.Event()
        self._admit(cancelled)
        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor, self._guarded(fn, args, cancelled))
            while True:
                done, _ = await asyncio.wait({future}, timeout=DISCONNECT_POLL_S if disconnected else None)
                if done:
                    break
                if disconnected is not None and await disconnected():
                    cancelled.set()
                    await asyncio.wait({future})  # not started: ends at once; running: stops or finishes
                    raise APIError(499, "the client closed the request", type="client_closed", code="client_closed")
            try:
                return future.result()
            except Abandoned:
                raise APIError(503, "the server is shutting down; retry on another instance", type="unavailable_error",
                               code="shutting_down") from None
        finally:
            self._release(cancelled)

    def submit_stream(self, fn: Callable[[], None], cancelled: threading.Event) -> "asyncio.Future[None]":
        """Admit a streaming job now (a full queue is a 503 before any response starts): `fn` runs on
        the engine thread and pushes its own events; setting `cancelled` stops it."""
        self._admit(cancelled)
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._guarded(fn, (), cancelled))
        future.add_done_callback(lambda _: self._release(cancelled))
        return future

    def drain_expired(self) -> None:
        """A shutdown's drain time ran out: refuse new work, cancel every admitted job (waiting ones
        answer 503, running generations stop at the next token)."""
        with self._lock:
            self.draining = True
            jobs = list(self._jobs)
        for cancelled in jobs:
            cancelled.set()

    def shutdown(self) -> None:
        self.drain_expired()
        self._executor.shutdown(wait=False, cancel_futures=True)
