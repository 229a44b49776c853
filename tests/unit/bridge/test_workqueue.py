"""The work queue: one worker per key, deduplication, delays, parking and waking."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable

import pytest

from bridge.runtime.fence import LeadershipLostError
from bridge.runtime.workqueue import Result, WorkQueue

pytestmark = pytest.mark.asyncio


class Recorder:
    """A reconcile function that records calls and answers from a script."""

    def __init__(self, answer: Callable[[Hashable, int], Result] | None = None) -> None:
        self.calls: list[tuple[Hashable, float]] = []
        self.running: dict[Hashable, int] = {}
        self.overlaps = 0
        self.lock = threading.Lock()
        self.answer = answer or (lambda key, n: Result.done())
        self.hold = 0.0

    def __call__(self, key: Hashable) -> Result:
        with self.lock:
            self.running[key] = self.running.get(key, 0) + 1
            if self.running[key] > 1:
                self.overlaps += 1
            n = sum(1 for k, _ in self.calls if k == key)
            self.calls.append((key, time.monotonic()))
        try:
            if self.hold:
                time.sleep(self.hold)
            return self.answer(key, n)
        finally:
            with self.lock:
                self.running[key] -= 1

    def count(self, key: Hashable) -> int:
        with self.lock:
            return sum(1 for k, _ in self.calls if k == key)


async def run_for(
    queue: WorkQueue, seconds: float, during: Callable[[], None] | None = None
) -> None:
    task = asyncio.create_task(queue.run())
    await asyncio.sleep(0.01)
    if during is not None:
        during()
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_keys_added_before_run_are_processed_once_each() -> None:
    rec = Recorder()
    queue = WorkQueue(rec, workers=2)
    for _ in range(3):
        queue.add("a")
    queue.add("b")
    await run_for(queue, 0.2)
    assert rec.count("a") == 1
    assert rec.count("b") == 1


async def test_a_key_never_runs_twice_at_once_and_runs_again_after_an_add_while_busy() -> None:
    rec = Recorder()
    rec.hold = 0.15
    queue = WorkQueue(rec, workers=4)

    def add_while_busy() -> None:
        queue.add("k")

    task = asyncio.create_task(queue.run())
    queue.add("k")
    await asyncio.sleep(0.05)  # "k" is being processed now
    for _ in range(5):
        threading.Thread(target=add_while_busy).start()
    await asyncio.sleep(0.6)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert rec.overlaps == 0
    assert rec.count("k") == 2  # once, then once more for all the adds made meanwhile


async def test_retry_after_delay_is_honoured() -> None:
    rec = Recorder(lambda key, n: Result.requeue_after(0.2) if n == 0 else Result.done())
    queue = WorkQueue(rec, workers=1)
    queue.add("k")
    await run_for(queue, 0.5)
    assert rec.count("k") == 2
    first, second = (t for _, t in rec.calls)
    assert second - first == pytest.approx(0.2, abs=0.1)


async def test_an_earlier_add_supersedes_a_later_due_time() -> None:
    rec = Recorder(lambda key, n: Result.requeue_after(10.0) if n == 0 else Result.done())
    queue = WorkQueue(rec, workers=1)
    task = asyncio.create_task(queue.run())
    queue.add("k")
    await asyncio.sleep(0.2)
    assert rec.count("k") == 1  # due again in 10 s
    queue.add("k")
    await asyncio.sleep(0.2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert rec.count("k") == 2


async def test_parked_keys_wait_for_their_token_without_running() -> None:
    rec = Recorder(lambda key, n: Result.wait(("pool", "p")) if n == 0 else Result.done())
    queue = WorkQueue(rec, workers=2)
    task = asyncio.create_task(queue.run())
    for key in ("a", "b", "c"):
        queue.add(key)
    await asyncio.sleep(0.3)
    assert queue.parked(("pool", "p")) == {"a", "b", "c"}
    assert [rec.count(k) for k in "abc"] == [1, 1, 1]
    assert queue.wake(("pool", "other")) == 0
    await asyncio.sleep(0.1)
    assert [rec.count(k) for k in "abc"] == [1, 1, 1]
    assert queue.wake(("pool", "p")) == 3
    await asyncio.sleep(0.2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [rec.count(k) for k in "abc"] == [2, 2, 2]
    assert queue.parked(("pool", "p")) == frozenset()


async def test_a_wake_during_processing_is_not_lost() -> None:
    woke = threading.Event()

    def answer(key: Hashable, n: int) -> Result:
        if n == 0:
            woke.wait(1.0)  # the wake happens while this reconcile still runs
            return Result.wait("token")
        return Result.done()

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=1)
    task = asyncio.create_task(queue.run())
    queue.add("k")
    await asyncio.sleep(0.05)
    queue.wake("token")
    woke.set()
    await asyncio.sleep(0.2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert rec.count("k") == 2


async def test_a_parked_key_with_a_deadline_runs_after_it() -> None:
    rec = Recorder(lambda key, n: Result.wait("t", at_most=0.2) if n == 0 else Result.done())
    queue = WorkQueue(rec, workers=1)
    queue.add("k")
    await run_for(queue, 0.5)
    assert rec.count("k") == 2
    assert queue.parked("t") == frozenset()


async def test_a_failing_reconcile_is_retried_after_the_error_delay() -> None:
    def answer(key: Hashable, n: int) -> Result:
        if n == 0:
            raise RuntimeError("boom")
        return Result.done()

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=1, error_delay=0.1)
    queue.add("k")
    await run_for(queue, 0.4)
    assert rec.count("k") == 2


async def test_workers_bound_the_parallelism() -> None:
    rec = Recorder()
    rec.hold = 0.1
    queue = WorkQueue(rec, workers=2)
    peak = 0

    def total_running() -> int:
        with rec.lock:
            return sum(rec.running.values())

    task = asyncio.create_task(queue.run())
    for i in range(6):
        queue.add(i)
    for _ in range(30):
        peak = max(peak, total_running())
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert peak == 2
    assert all(rec.count(i) == 1 for i in range(6))


async def test_wake_with_a_count_wakes_the_longest_parked_first() -> None:
    rec = Recorder(lambda key, n: Result.wait("t") if n == 0 else Result.done())
    queue = WorkQueue(rec, workers=1)
    task = asyncio.create_task(queue.run())
    for key in ("first", "second", "third"):
        queue.add(key)
        await asyncio.sleep(0.05)  # parked in this order
    assert queue.parked("t") == {"first", "second", "third"}
    assert queue.wake("t", count=1) == 1
    await asyncio.sleep(0.1)
    assert rec.count("first") == 2 and rec.count("second") == 1 and rec.count("third") == 1
    assert queue.parked("t") == {"second", "third"}
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_persistent_error_backs_off_per_key_and_logs_one_line_per_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """5 ms doubling: a key failing for 0.5 s runs at most 8 times, not 100."""

    def answer(key: Hashable, n: int) -> Result:
        if key == "bad":
            raise RuntimeError("still broken")
        return Result.requeue_after(0.05)

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=2, error_delay=0.005, max_error_delay=1000.0)
    queue.add("bad")
    queue.add("good")
    with caplog.at_level(logging.DEBUG, logger="bridge.runtime.workqueue"):
        await run_for(queue, 0.5)
    # 0.005 + 0.01 + ... : at most 8 passes fit in 0.5 s; a fixed 5 ms delay would allow ~100.
    assert 3 <= rec.count("bad") <= 8
    with rec.lock:
        times = [at for k, at in rec.calls if k == "bad"]
    for failures, (before, after) in enumerate(itertools.pairwise(times), start=1):
        assert after - before >= queue.backoff(failures) * 0.9  # never earlier than its step
    assert rec.count("good") >= 2  # the other key keeps its own pace
    assert queue.failing() == 1
    lines = [r for r in caplog.records if "bad" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(lines) == rec.count("bad")  # one line per failed pass
    assert sum(1 for r in lines if r.exc_info) == 1  # the traceback once, at the first failure
    assert (
        lines[0].levelno == logging.ERROR and "RuntimeError: still broken" in lines[0].getMessage()
    )


async def test_a_cancel_in_the_turn_a_key_is_added_stops_the_queue() -> None:
    """The cancel of the clean-up is never lost to a wake-up in the same loop turn.

    ``asyncio.wait_for`` of Python 3.11 returns the awaited result when the cancellation
    and the result arrive together (https://github.com/python/cpython/issues/86296): the
    queue's idle wait must not swallow the cancel, or ``run`` never returns.
    """
    queue = WorkQueue(Recorder(), workers=1)
    task = asyncio.create_task(queue.run())
    for _ in range(3):  # turns of the loop (no time passes): run starts
        await asyncio.sleep(0)
    queue.add("later", after=60.0)  # the idle wait gets a timeout
    for _ in range(3):  # run is in its idle wait again
        await asyncio.sleep(0)
    queue.add("now")  # wakes the idle wait in this turn...
    task.cancel()  # ...and so does the cancel
    done, _ = await asyncio.wait({task}, timeout=10.0)
    assert task in done and task.cancelled()


async def test_a_success_resets_the_backoff() -> None:
    def answer(key: Hashable, n: int) -> Result:
        if n < 3:
            raise RuntimeError("transient")
        return Result.done()

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=1, error_delay=0.01, max_error_delay=0.02)
    queue.add("k")
    await run_for(queue, 0.3)
    assert rec.count("k") == 4
    assert queue.failing() == 0
    assert queue.backoff(1) == 0.01 and queue.backoff(2) == 0.02 and queue.backoff(30) == 0.02


async def test_wake_history_is_dropped_once_no_key_in_process_can_miss_it() -> None:
    rec = Recorder(lambda key, n: Result.done())
    queue = WorkQueue(rec, workers=1)
    task = asyncio.create_task(queue.run())
    for i in range(500):
        queue.wake(("token", i))
    queue.add("k")
    await asyncio.sleep(0.2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert rec.count("k") == 1
    assert queue.sizes()["wake_history"] == 0


async def test_a_lost_leadership_is_one_warning_without_traceback_and_a_later_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def answer(key: Hashable, n: int) -> Result:
        raise LeadershipLostError("the leader Lease is not renewed within 10 s")

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=1, error_delay=0.005)
    queue.add("k")
    with caplog.at_level("WARNING", logger="bridge.runtime.workqueue"):
        await run_for(queue, 1.5)
    assert rec.count("k") == 2  # at once, then once a second later: no backoff storm
    records = [r for r in caplog.records if r.name == "bridge.runtime.workqueue"]
    assert [r.levelname for r in records] == ["WARNING", "WARNING"]
    assert all(r.exc_info is None for r in records)
    assert "not renewed within 10 s" in records[0].getMessage()


async def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_stalled_counts_while_due_keys_wait_and_not_for_parked_or_idle_queues() -> None:
    release, hanging = threading.Event(), threading.Event()

    def reconcile(key: Hashable) -> Result:
        if key == "parked":
            return Result.wait("token")
        if key == "hung":
            hanging.set()
            release.wait(30)
        return Result.done()

    queue = WorkQueue(reconcile, workers=1)
    assert queue.stalled() == 0.0  # not running (a standby replica's queue)
    task = asyncio.create_task(queue.run())
    try:
        queue.add("parked")
        await _until(lambda: queue.parked("token") == frozenset({"parked"}))
        assert queue.stalled() == 0.0  # a parked key is not due
        queue.add("hung")
        await _until(hanging.is_set)  # being processed, nothing else due
        assert queue.stalled() == 0.0
        queue.add("waiting")  # due, but the only worker hangs
        started = time.monotonic()
        await _until(lambda: time.monotonic() - started > 0.3)
        assert queue.stalled() >= 0.25
        release.set()
        await _until(lambda: len(queue) == 0)
        assert queue.stalled() == 0.0
    finally:
        release.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_background_keys_run_after_every_due_key_of_the_front_lane() -> None:
    rec = Recorder()
    queue = WorkQueue(rec, workers=1)
    for i in range(5):
        queue.add(("settled", i), background=True)
    queue.add("new")
    queue.add(("settled", 4))  # added normally: moves to the front lane
    queue.add("new", background=True)  # stays in the front lane
    task = asyncio.create_task(queue.run())
    try:
        async with asyncio.timeout(10):
            while len(queue) or len(rec.calls) < 6:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    order = [key for key, _ in rec.calls]
    assert order == ["new", ("settled", 4), *[("settled", i) for i in range(4)]]
    assert queue.sizes()["heap"] == 0


async def test_background_keys_run_on_few_workers_while_front_keys_use_the_rest() -> None:
    rec = Recorder()
    rec.hold = 0.2
    queue = WorkQueue(rec, workers=4, background_workers=1)
    peak = {"background": 0, "all": 0}

    def running(keys: object = None) -> int:
        with rec.lock:
            return sum(n for k, n in rec.running.items() if keys is None or k in keys)

    settled = [("settled", i) for i in range(4)]
    for key in settled:
        queue.add(key, background=True)
    for i in range(3):
        queue.add(("new", i))
    task = asyncio.create_task(queue.run())
    try:
        async with asyncio.timeout(10):
            while len(queue) or len(rec.calls) < 7:
                peak["background"] = max(peak["background"], running(settled))
                peak["all"] = max(peak["all"], running())
                await asyncio.sleep(0.005)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert peak["background"] == 1
    order = [key for key, _ in rec.calls]
    assert max(order.index(("new", i)) for i in range(3)) < order.index(("settled", 1))
