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


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait until `condition` holds (polling every 10 ms); fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


class Running:
    """The queue's `run` as a task for the duration of an ``async with`` block."""

    def __init__(self, queue: WorkQueue) -> None:
        self.queue = queue
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> WorkQueue:
        self.task = asyncio.create_task(self.queue.run())
        return self.queue

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def idle(queue: WorkQueue, rec: Recorder) -> Callable[[], bool]:
    """A condition: nothing due or delayed in `queue` and no reconcile of `rec` running."""

    def check() -> bool:
        with rec.lock:
            busy = any(rec.running.values())
        return not busy and len(queue) == 0

    return check


async def test_keys_added_before_run_are_processed_once_each() -> None:
    rec = Recorder()
    queue = WorkQueue(rec, workers=2)
    for _ in range(3):
        queue.add("a")
    queue.add("b")
    async with Running(queue):
        await until(lambda: rec.count("a") == 1 and rec.count("b") == 1)
        await until(idle(queue, rec))
    assert rec.count("a") == 1
    assert rec.count("b") == 1


async def test_a_key_never_runs_twice_at_once_and_runs_again_after_an_add_while_busy() -> None:
    rec = Recorder()
    rec.hold = 0.3
    queue = WorkQueue(rec, workers=4)
    async with Running(queue):
        queue.add("k")
        await until(lambda: rec.count("k") == 1)  # "k" is being processed now
        adders = [threading.Thread(target=queue.add, args=("k",)) for _ in range(5)]
        for adder in adders:
            adder.start()
        for adder in adders:
            adder.join()
        await until(lambda: rec.count("k") == 2)
        await until(idle(queue, rec))
    assert rec.overlaps == 0
    assert rec.count("k") == 2  # once, then once more for all the adds made meanwhile


async def test_a_conditional_add_during_a_pass_is_asked_once_the_pass_has_ended() -> None:
    gate = threading.Event()
    written: set[str] = set()  # what each pass "wrote", recorded only as it ends

    def reconcile(key: Hashable, n: int) -> Result:
        assert gate.wait(10)
        written.add(f"{key}-{n}")
        return Result.done()

    rec = Recorder(reconcile)
    queue = WorkQueue(rec, workers=2)
    async with Running(queue):
        queue.add("echo")
        queue.add("news")
        await until(lambda: rec.count("echo") == 1 and rec.count("news") == 1)
        # While the passes run, each gets an event: for "echo" one its own pass wrote (known
        # only once the pass ends), for "news" someone else's.
        queue.add("echo", unless=lambda: "echo-0" in written)
        queue.add("news", unless=lambda: "someone-else" in written)
        assert rec.count("echo") == 1  # asked later, not now
        gate.set()
        await until(lambda: rec.count("news") == 2)
        await until(idle(queue, rec))
        assert rec.count("echo") == 1
        # Not during a pass: asked at once.
        queue.add("echo", unless=lambda: True)
        queue.add("news", unless=lambda: False)
        await until(lambda: rec.count("news") == 3)
        await until(idle(queue, rec))
    assert rec.count("echo") == 1


async def test_retry_after_delay_is_honoured() -> None:
    rec = Recorder(lambda key, n: Result.requeue_after(0.2) if n == 0 else Result.done())
    queue = WorkQueue(rec, workers=1)
    queue.add("k")
    async with Running(queue):
        await until(lambda: rec.count("k") == 2)
    first, second = (t for _, t in rec.calls)
    assert 0.2 * 0.9 <= second - first < 5.0  # never earlier than asked


async def test_an_earlier_add_supersedes_a_later_due_time() -> None:
    rec = Recorder(lambda key, n: Result.requeue_after(60.0) if n == 0 else Result.done())
    queue = WorkQueue(rec, workers=1)
    async with Running(queue):
        queue.add("k")
        await until(lambda: rec.count("k") == 1)  # due again in 60 s
        queue.add("k")
        await until(lambda: rec.count("k") == 2, timeout=30.0)


async def test_parked_keys_wait_for_their_token_without_running() -> None:
    rec = Recorder(lambda key, n: Result.wait(("pool", "p")) if n == 0 else Result.done())
    queue = WorkQueue(rec, workers=2)
    async with Running(queue):
        for key in ("a", "b", "c"):
            queue.add(key)
        await until(lambda: queue.parked(("pool", "p")) == {"a", "b", "c"})
        assert [rec.count(k) for k in "abc"] == [1, 1, 1]
        assert queue.wake(("pool", "other")) == 0
        await asyncio.sleep(0.1)  # a wrong wake-up would run them within this
        assert [rec.count(k) for k in "abc"] == [1, 1, 1]
        assert queue.wake(("pool", "p")) == 3
        await until(lambda: [rec.count(k) for k in "abc"] == [2, 2, 2])
    assert queue.parked(("pool", "p")) == frozenset()


async def test_a_wake_during_processing_is_not_lost() -> None:
    woke = threading.Event()

    def answer(key: Hashable, n: int) -> Result:
        if n == 0:
            woke.wait(10.0)  # the wake happens while this reconcile still runs
            return Result.wait("token")
        return Result.done()

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=1)
    async with Running(queue):
        queue.add("k")
        await until(lambda: rec.count("k") == 1)
        queue.wake("token")
        woke.set()
        await until(lambda: rec.count("k") == 2)
        await until(idle(queue, rec))
    assert rec.count("k") == 2
    assert queue.parked("token") == frozenset()


async def test_a_parked_key_with_a_deadline_runs_after_it() -> None:
    rec = Recorder(lambda key, n: Result.wait("t", at_most=0.2) if n == 0 else Result.done())
    queue = WorkQueue(rec, workers=1)
    queue.add("k")
    async with Running(queue):
        await until(lambda: rec.count("k") == 2)
    first, second = (t for _, t in rec.calls)
    assert second - first >= 0.2 * 0.9
    assert queue.parked("t") == frozenset()


async def test_a_failing_reconcile_is_retried_after_the_error_delay() -> None:
    def answer(key: Hashable, n: int) -> Result:
        if n == 0:
            raise RuntimeError("boom")
        return Result.done()

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=1, error_delay=0.1)
    queue.add("k")
    async with Running(queue):
        await until(lambda: rec.count("k") == 2)
    first, second = (t for _, t in rec.calls)
    assert second - first >= 0.1 * 0.9
    assert queue.sizes()["failing"] == 0


async def test_workers_bound_the_parallelism() -> None:
    rec = Recorder()
    rec.hold = 0.2
    queue = WorkQueue(rec, workers=2)
    peak = 0

    def total_running() -> int:
        with rec.lock:
            return sum(rec.running.values())

    async with Running(queue):
        for i in range(6):
            queue.add(i)
        while not all(rec.count(i) == 1 for i in range(6)) or not idle(queue, rec)():
            peak = max(peak, total_running())
            await asyncio.sleep(0.005)
    assert peak == 2
    assert all(rec.count(i) == 1 for i in range(6))


async def test_wake_with_a_count_wakes_the_longest_parked_first() -> None:
    rec = Recorder(lambda key, n: Result.wait("t") if n == 0 else Result.done())
    queue = WorkQueue(rec, workers=1)
    async with Running(queue):
        parked: set[str] = set()
        for key in ("first", "second", "third"):
            queue.add(key)
            parked.add(key)
            await until(lambda: queue.parked("t") == parked)  # parked in this order
        assert queue.wake("t", count=1) == 1
        await until(lambda: rec.count("first") == 2)
        assert rec.count("second") == 1 and rec.count("third") == 1
        assert queue.parked("t") == {"second", "third"}


async def test_a_persistent_error_backs_off_per_key_and_logs_one_line_per_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """5 ms doubling: each failed pass of a key waits at least its step of the backoff."""

    def answer(key: Hashable, n: int) -> Result:
        if key == "bad":
            raise RuntimeError("still broken")
        return Result.requeue_after(0.05)

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=2, error_delay=0.005, max_error_delay=1000.0)
    queue.add("bad")
    queue.add("good")
    with caplog.at_level(logging.DEBUG, logger="bridge.runtime.workqueue"):
        async with Running(queue):
            await until(lambda: rec.count("bad") >= 6)
        # the sixth failed pass has logged its line once run has stopped
        await until(lambda: _warnings(caplog, "bad") >= rec.count("bad"))
    with rec.lock:
        times = [at for k, at in rec.calls if k == "bad"]
    for failures, (before, after) in enumerate(itertools.pairwise(times), start=1):
        assert after - before >= queue.backoff(failures) * 0.9  # never earlier than its step
    # 5 ms doubling: 6 passes take at least 0.005 + 0.01 + ... + 0.08 = 0.155 s
    assert times[-1] - times[0] >= 0.155 * 0.9
    assert rec.count("good") >= 2  # the other key keeps its own pace
    assert queue.sizes()["failing"] == 1
    lines = [r for r in caplog.records if "bad" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(lines) == rec.count("bad")  # one line per failed pass
    assert sum(1 for r in lines if r.exc_info) == 1  # the traceback once, at the first failure
    assert (
        lines[0].levelno == logging.ERROR and "RuntimeError: still broken" in lines[0].getMessage()
    )


def _warnings(caplog: pytest.LogCaptureFixture, word: str) -> int:
    return sum(1 for r in caplog.records if word in r.getMessage() and r.levelno >= logging.WARNING)


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
    async with Running(queue):
        await until(lambda: rec.count("k") == 4)
        await until(lambda: queue.sizes()["failing"] == 0)
        await until(idle(queue, rec))
    assert rec.count("k") == 4
    assert queue.backoff(1) == 0.01 and queue.backoff(2) == 0.02 and queue.backoff(30) == 0.02


async def test_wake_history_is_dropped_once_no_key_in_process_can_miss_it() -> None:
    rec = Recorder(lambda key, n: Result.done())
    queue = WorkQueue(rec, workers=1)
    async with Running(queue):
        for i in range(500):
            queue.wake(("token", i))
        queue.add("k")
        await until(lambda: rec.count("k") == 1 and queue.sizes()["wake_history"] == 0)
        await until(idle(queue, rec))
    assert rec.count("k") == 1


async def test_a_lost_leadership_is_one_warning_without_traceback_and_a_later_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def answer(key: Hashable, n: int) -> Result:
        raise LeadershipLostError("the leader Lease is not renewed within 10 s")

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=1, error_delay=0.005)
    queue.add("k")

    def records() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "bridge.runtime.workqueue"]

    with caplog.at_level("WARNING", logger="bridge.runtime.workqueue"):
        async with Running(queue):
            await until(lambda: rec.count("k") == 2)
            await until(lambda: len(records()) == 2)
    first, second = (t for _, t in rec.calls[:2])
    assert second - first >= 0.9  # once a second: no backoff storm at 5 ms
    assert [r.levelname for r in records()[:2]] == ["WARNING", "WARNING"]
    assert all(r.exc_info is None for r in records())
    assert "not renewed within 10 s" in records()[0].getMessage()


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
        await until(lambda: queue.parked("token") == frozenset({"parked"}))
        assert queue.stalled() == 0.0  # a parked key is not due
        queue.add("hung")
        await until(hanging.is_set)  # being processed, nothing else due
        assert queue.stalled() == 0.0
        queue.add("waiting")  # due, but the only worker hangs
        started = time.monotonic()
        await until(lambda: time.monotonic() - started > 0.3)
        assert queue.stalled() >= 0.25
        release.set()
        await until(lambda: len(queue) == 0)
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


async def test_background_keys_run_one_at_a_time_while_front_keys_use_the_rest() -> None:
    rec = Recorder()
    rec.hold = 0.2
    queue = WorkQueue(rec, workers=4)
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


async def test_a_key_added_first_runs_before_the_keys_due_before_it() -> None:
    # Places queues a key it promised a place to first: the place stays idle (kept from
    # every other key) until that key runs, so it must not wait behind a burst of keys.
    started, release = threading.Event(), threading.Event()
    order: list[Hashable] = []

    def reconcile(key: Hashable) -> Result:
        if key == "busy":
            started.set()
            release.wait(30)
        order.append(key)
        return Result.done()

    queue = WorkQueue(reconcile, workers=1)
    async with Running(queue):
        queue.add("busy")  # holds the only worker while the others are added
        await until(started.is_set)
        for key in ("a", "b", "c"):
            queue.add(key)
        queue.add("promised", first=True)
        queue.add("c", first=True)  # a key queued already moves to the front, after "promised"
        release.set()
        await until(lambda: len(order) == 5)
    assert order == ["busy", "promised", "c", "a", "b"]


async def test_a_key_added_first_counts_as_stalled_only_since_it_was_added() -> None:
    # Its due time is a lead before every key's, not the time it waits since: the liveness
    # check (`stalled`) must not see a queue stalled since its last progress.
    started, release = threading.Event(), threading.Event()

    def reconcile(key: Hashable) -> Result:
        if key == "busy":
            started.set()
            release.wait(30)
        return Result.done()

    queue = WorkQueue(reconcile, workers=1)
    async with Running(queue):
        queue.add("busy")  # the last progress: this pass started
        await until(started.is_set)
        await asyncio.sleep(0.05)
        before = time.monotonic()
        queue.add("promised", first=True)  # waits for the only worker
        assert queue.stalled() <= time.monotonic() - before
        release.set()
        await until(lambda: len(queue) == 0)
