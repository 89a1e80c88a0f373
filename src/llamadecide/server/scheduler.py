"""One engine, one worker thread, a bounded wait. Requests beyond the bound are refused at once
(503) instead of piling up; a request cancelled while waiting never reaches the engine."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from llamadecide.server.errors import APIError

T = TypeVar("T")


class EngineScheduler:
    def __init__(self, max_waiting: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._max_waiting = max_waiting
        self._lock = threading.Lock()
        self._pending = 0  # waiting or running

    @property
    def depth(self) -> int:
        return self._pending

    def _admit(self) -> None:
        with self._lock:
            if self._pending >= self._max_waiting + 1:
                raise APIError(503, "the engine queue is full; retry shortly", type="unavailable_error", code="overloaded")
            self._pending += 1

    def _release(self) -> None:
        with self._lock:
            self._pending -= 1

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        self._admit()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, fn, *args)
        finally:
            self._release()

    def submit_stream(self, fn: Callable[[], None]) -> "asyncio.Future[None]":
        """Admit a streaming job: `fn` runs on the engine thread and pushes its own events."""
        self._admit()
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        future.add_done_callback(lambda _: self._release())
        return future

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
