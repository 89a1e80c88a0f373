"""The engine scheduler's continuous batching, on fakes: which waiting items share a run."""

from __future__ import annotations

import asyncio
import threading

from llamadecide.server.scheduler import EngineScheduler


class _Serving:
    def __init__(self) -> None:
        self.runs: list[list[int]] = []

    def run_many(self, items, jobs):
        self.runs.append(list(items))
        return [item * 2 for item in items]


def test_items_of_an_equal_key_share_one_run_though_each_passes_a_new_bound_method():
    """`serving.run_many` is a new object at every attribute access: the key, not the function
    object, says what shares. Items of another key run apart; a batch holds at most batch_size."""
    serving = _Serving()
    gate = threading.Event()

    async def main():
        scheduler = EngineScheduler(32, batch_size=4)
        busy = asyncio.ensure_future(scheduler.run(gate.wait))  # holds the engine thread while the rest queue
        await asyncio.sleep(0.05)
        waiting = [asyncio.ensure_future(scheduler.run_shared("decisions", serving.run_many, i)) for i in range(6)]
        waiting.append(asyncio.ensure_future(scheduler.run_shared(("other", 1), serving.run_many, 100)))
        await asyncio.sleep(0.05)
        gate.set()
        await busy
        results = await asyncio.gather(*waiting)
        scheduler.shutdown()
        return results

    assert asyncio.run(main()) == [0, 2, 4, 6, 8, 10, 200]
    assert sorted(len(run) for run in serving.runs) == [1, 2, 4]
    assert [100] in serving.runs and sorted(i for run in serving.runs if run != [100] for i in run) == list(range(6))


def _holding(scheduler: EngineScheduler, gate: threading.Event):
    """A job that holds the engine thread until `gate` opens (so the next ones queue)."""
    return asyncio.ensure_future(scheduler.run(gate.wait))


def test_a_full_queue_refuses_at_once_with_503_and_frees_its_place_after():
    from llamadecide.server.errors import APIError

    gate = threading.Event()

    async def main():
        scheduler = EngineScheduler(2)  # two may wait beside the one on the engine
        busy = _holding(scheduler, gate)
        await asyncio.sleep(0.05)
        waiting = [asyncio.ensure_future(scheduler.run(lambda n=n: n)) for n in range(2)]
        await asyncio.sleep(0.05)
        assert scheduler.depth == 3
        try:
            await scheduler.run(lambda: "over")
        except APIError as exc:
            refused = (exc.status, exc.code)
        gate.set()
        await busy
        done = await asyncio.gather(*waiting)
        after = await scheduler.run(lambda: "room again")
        scheduler.shutdown()
        return refused, done, after, scheduler.depth

    refused, done, after, depth = asyncio.run(main())
    assert refused == (503, "overloaded") and done == [0, 1] and after == "room again" and depth == 0


def test_a_client_gone_while_waiting_never_reaches_the_engine():
    from llamadecide.server.errors import APIError

    gate, ran, gone = threading.Event(), [], asyncio.Event()

    async def disconnected() -> bool:
        return gone.is_set()

    async def main():
        scheduler = EngineScheduler(8)
        busy = _holding(scheduler, gate)
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(scheduler.run(lambda: ran.append("reached"), disconnected=disconnected))
        shared = asyncio.ensure_future(
            scheduler.run_shared(
                "k", lambda items, jobs: ran.extend(items) or items, "shared", disconnected=disconnected
            )
        )
        await asyncio.sleep(0.05)
        gone.set()  # the clients hang up while the engine is busy; it frees up a little later
        asyncio.get_running_loop().call_later(0.5, gate.set)
        statuses = []
        for future in (waiting, shared):
            try:
                await future
            except APIError as exc:
                statuses.append(exc.status)
        await busy
        await asyncio.sleep(0.1)  # the engine thread has taken what was queued
        scheduler.shutdown()
        return statuses

    assert asyncio.run(main()) == [499, 499]
    assert ran == []


def test_a_job_past_its_time_limit_ends_with_504_and_the_engine_moves_on():
    from llamadecide.errors import RequestTimeoutError

    def slow(items, jobs):  # cooperative, as a decision is: it checks its job between steps
        for _ in range(200):
            if jobs[0].cancelled.is_set():
                return [RequestTimeoutError("stopped")] * len(items)
            threading.Event().wait(0.01)
        return items

    async def main():
        scheduler = EngineScheduler(8, time_limit=0.2, batch_size=1)
        try:
            await scheduler.run_shared("k", slow, "late")
        except RequestTimeoutError as exc:
            outcome = exc.message
        quick = await scheduler.run_shared("k", lambda items, jobs: items, "next")
        scheduler.shutdown()
        return outcome, quick

    outcome, quick = asyncio.run(main())
    assert "time limit of 0.2 s" in outcome and quick == "next"
