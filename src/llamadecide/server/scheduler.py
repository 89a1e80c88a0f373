"""One engine, one worker thread, a bounded wait.

Requests beyond the bound are refused at once (503) instead of piling up. Every job carries a
cancellation event: a job whose client went away, or that is still waiting when a shutdown's drain
time runs out, never reaches the engine; a running generation checks the event at every token and
stops, a running decision before each question's evaluation. A job that runs past its time limit
is cancelled the same way, and its request ends with 504.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from llamadecide.errors import RequestTimeoutError
from llamadecide.server.errors import APIError

T = TypeVar("T")

DISCONNECT_POLL_S = 0.25


class Abandoned(Exception):
    """The job was cancelled before it reached the engine."""


def shutting_down() -> APIError:
    """What a request gets when a shutdown's drain time ran out before it was answered."""
    return APIError(
        503, "the server is shutting down; retry on another instance", type="unavailable_error", code="shutting_down"
    )


def _client_closed(future: asyncio.Future) -> APIError:
    """The answer for a request whose client left; its job's own outcome (often `Abandoned`) is
    taken, so that no unretrieved exception is logged when the future is collected."""
    if not future.cancelled():
        future.exception()
    return APIError(499, "the client closed the request", type="client_closed", code="client_closed")


@dataclass
class Job:
    """What a running job checks (`cancelled`) and why it was cancelled."""

    cancelled: threading.Event = field(default_factory=threading.Event)
    timed_out: bool = False
    time_limit: float | None = None

    def expire(self) -> None:
        """Mark the job timed out and cancel it (what a running job sees at its next check)."""
        self.timed_out = True
        self.cancelled.set()

    def timeout_error(self) -> RequestTimeoutError:
        """The error a timed-out job's request answers with."""
        return RequestTimeoutError(
            f"the request ran past its time limit of {self.time_limit:g} s on the engine "
            "(request_timeout); the engine moved on"
        )


@dataclass
class _Shared:
    """Work waiting to share the engine's calls with other work of the same key."""

    key: Hashable
    fn: Callable[[list[Any], list[Job]], list[Any]]
    item: Any
    job: Job
    future: Future = field(default_factory=Future)


class EngineScheduler:
    def __init__(self, max_waiting: int, *, time_limit: float | None = None, batch_size: int = 1) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._max_waiting = max_waiting
        self.time_limit = time_limit  # seconds a job may hold the engine (None: no limit)
        self._lock = threading.Lock()
        self._pending = 0  # waiting or running
        self._jobs: set[threading.Event] = set()  # cancellation events of admitted jobs
        self.draining = False  # set once a shutdown's drain time has run out
        self.batch_size = batch_size  # most waiting items of one key evaluated together (`run_shared`)
        self._shared: deque[_Shared] = deque()

    @property
    def depth(self) -> int:
        """Requests waiting for the engine or on it now."""
        return self._pending

    def _admit(self, cancelled: threading.Event) -> None:
        with self._lock:
            if self.draining:
                raise shutting_down()
            if self._pending >= self._max_waiting + 1:
                raise APIError(
                    503, "the engine queue is full; retry shortly", type="unavailable_error", code="overloaded"
                )
            self._pending += 1
            self._jobs.add(cancelled)

    def _release(self, cancelled: threading.Event) -> None:
        with self._lock:
            self._pending -= 1
            self._jobs.discard(cancelled)

    def _guarded(self, fn: Callable[..., T], args: tuple, job: Job) -> Callable[[], T]:
        def run() -> T:
            if job.cancelled.is_set():
                raise Abandoned()
            timer = None
            if job.time_limit is not None:
                timer = threading.Timer(job.time_limit, job.expire)
                timer.daemon = True
                timer.start()
            try:
                return fn(*args)
            finally:
                if timer is not None:
                    timer.cancel()

        return run

    def new_job(self) -> Job:
        """A job with this scheduler's time limit, for one request's work."""
        return Job(time_limit=self.time_limit)

    async def run(
        self,
        fn: Callable[..., T],
        *args: object,
        job: Job | None = None,
        disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> T:
        """Run `fn(*args)` on the engine thread. With `disconnected`, the client is watched while the
        job waits or runs: once it is gone the job is cancelled (`job.cancelled` is what a
        cooperative `fn` checks) and the request ends without an answer. A job past its time limit
        ends with RequestTimeoutError (504), whatever `fn` returned."""
        job = job or self.new_job()
        cancelled = job.cancelled
        self._admit(cancelled)
        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor, self._guarded(fn, args, job))
            while True:
                done, _ = await asyncio.wait({future}, timeout=DISCONNECT_POLL_S if disconnected else None)
                if done:
                    break
                if disconnected is not None and await disconnected():
                    cancelled.set()
                    await asyncio.wait({future})  # not started: ends at once; running: stops or finishes
                    raise _client_closed(future)
            try:
                result = future.result()
            except Abandoned:
                raise shutting_down() from None
            except RequestTimeoutError:  # a decision stopped between questions: by its time limit, or by a drain
                raise (job.timeout_error() if job.timed_out else shutting_down()) from None
            if job.timed_out:
                raise job.timeout_error()
            return result
        finally:
            self._release(cancelled)

    async def run_shared(
        self,
        key: Hashable,
        fn: Callable[[list[Any], list[Job]], list[Any]],
        item: Any,
        *,
        job: Job | None = None,
        disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> Any:
        """Run `item` on the engine thread together with the other items waiting under an equal `key`
        (continuous batching): when the engine takes the first of them, it takes up to `batch_size`
        waiting ones of that key and calls the first one's `fn(items, jobs)` once, which returns each
        item's result or exception. Items of one key must be able to share one call of one `fn`; the
        key is compared by value, never by identity. An idle engine never waits for a batch to fill.
        Cancellation, time limits and drain work per item as in `run`."""
        job = job or self.new_job()
        self._admit(job.cancelled)
        shared = _Shared(key, fn, item, job)
        try:
            with self._lock:
                self._shared.append(shared)
            self._executor.submit(self._drain_shared)
            future = asyncio.wrap_future(shared.future)
            while True:
                done, _ = await asyncio.wait({future}, timeout=DISCONNECT_POLL_S if disconnected else None)
                if done:
                    break
                if disconnected is not None and await disconnected():
                    job.cancelled.set()
                    await asyncio.wait({future})
                    raise _client_closed(future)
            try:
                result = future.result()
            except Abandoned:
                raise shutting_down() from None
            if isinstance(result, RequestTimeoutError) or job.timed_out:
                raise (job.timeout_error() if job.timed_out else shutting_down())
            if isinstance(result, BaseException):
                raise result
            return result
        finally:
            self._release(job.cancelled)

    def _drain_shared(self) -> None:
        """On the engine thread: take the waiting items of the first one's key and run them at once."""
        with self._lock:
            taken: list[_Shared] = []
            kept: deque[_Shared] = deque()
            while self._shared:
                entry = self._shared.popleft()
                if entry.job.cancelled.is_set():
                    entry.future.set_exception(Abandoned())
                elif len(taken) < self.batch_size and (not taken or entry.key == taken[0].key):
                    taken.append(entry)
                else:
                    kept.append(entry)
            self._shared = kept
        if not taken:
            return  # an earlier call took this item with its batch
        timers = []
        for entry in taken:
            if entry.job.time_limit is not None:
                timer = threading.Timer(entry.job.time_limit, entry.job.expire)
                timer.daemon = True
                timer.start()
                timers.append(timer)
        try:
            results = taken[0].fn([e.item for e in taken], [e.job for e in taken])
        except BaseException as exc:  # noqa: BLE001 - every waiting client gets the failure, none hangs
            for entry in taken:
                entry.future.set_exception(exc)
            return
        finally:
            for timer in timers:
                timer.cancel()
        for entry, result in zip(taken, results):
            entry.future.set_result(result)

    def submit_stream(self, fn: Callable[[], None], job: Job) -> asyncio.Future[None]:
        """Admit a streaming job now (a full queue is a 503 before any response starts): `fn` runs on
        the engine thread and pushes its own events; setting `job.cancelled` stops it."""
        self._admit(job.cancelled)
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._guarded(fn, (), job))
        future.add_done_callback(lambda _: self._release(job.cancelled))
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
        """Cancel every admitted job (as `drain_expired`) and stop the engine thread without waiting for it."""
        self.drain_expired()
        self._executor.shutdown(wait=False, cancel_futures=True)
