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
