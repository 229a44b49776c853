"""The work queue: one worker per key, deduplication, delays, parking and waking."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Hashable

import pytest

from bridge.workqueue import Decision, WorkQueue

pytestmark = pytest.mark.asyncio


class Recorder:
    """A reconcile function that records calls and answers from a script."""

    def __init__(self, answer: Callable[[Hashable, int], Decision] | None = None) -> None:
        self.calls: list[tuple[Hashable, float]] = []
        self.running: dict[Hashable, int] = {}
        self.overlaps = 0
        self.lock = threading.Lock()
        self.answer = answer or (lambda key, n: Decision.done())
        self.hold = 0.0

    def __call__(self, key: Hashable) -> Decision:
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
    rec = Recorder(lambda key, n: Decision.retry(0.2) if n == 0 else Decision.done())
    queue = WorkQueue(rec, workers=1)
    queue.add("k")
    await run_for(queue, 0.5)
    assert rec.count("k") == 2
    first, second = (t for _, t in rec.calls)
    assert second - first == pytest.approx(0.2, abs=0.1)


async def test_an_earlier_add_supersedes_a_later_due_time() -> None:
    rec = Recorder(lambda key, n: Decision.retry(10.0) if n == 0 else Decision.done())
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
    rec = Recorder(lambda key, n: Decision.wait(("pool", "p")) if n == 0 else Decision.done())
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

    def answer(key: Hashable, n: int) -> Decision:
        if n == 0:
            woke.wait(1.0)  # the wake happens while this reconcile still runs
            return Decision.wait("token")
        return Decision.done()

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
    rec = Recorder(lambda key, n: Decision.wait("t", at_most=0.2) if n == 0 else Decision.done())
    queue = WorkQueue(rec, workers=1)
    queue.add("k")
    await run_for(queue, 0.5)
    assert rec.count("k") == 2
    assert queue.parked("t") == frozenset()


async def test_a_failing_reconcile_is_retried_after_the_backoff_base() -> None:
    def answer(key: Hashable, n: int) -> Decision:
        if n == 0:
            raise RuntimeError("boom")
        return Decision.done()

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=1, backoff_base=0.1)
    queue.add("k")
    await run_for(queue, 0.4)
    assert rec.count("k") == 2


def gaps(rec: Recorder, key: Hashable) -> list[float]:
    with rec.lock:
        times = [t for k, t in rec.calls if k == key]
    return [b - a for a, b in itertools.pairwise(times)]


def logged_retries(caplog: pytest.LogCaptureFixture, key: str) -> list[tuple[int, float]]:
    """Return (retry number, delay in s) of each failure of ``key`` logged by the queue."""
    found = []
    for record in caplog.records:
        if record.name == "bridge.workqueue" and record.levelname in ("ERROR", "WARNING"):
            logged_key, _, _, number, delay = record.args  # type: ignore[misc]
            if logged_key == key:
                found.append((int(number), float(delay)))
    return found


async def test_a_key_that_keeps_failing_backs_off_exponentially_up_to_the_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def answer(key: Hashable, n: int) -> Decision:
        raise RuntimeError(f"boom {n}")

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=1, backoff_base=0.02, backoff_cap=0.16)
    caplog.set_level("WARNING", logger="bridge.workqueue")
    queue.add("k")
    task = asyncio.create_task(queue.run())
    for _ in range(1000):  # generous: the machine may be loaded
        if rec.count("k") >= 7:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    retries = logged_retries(caplog, "k")[:6]
    assert retries == [(1, 0.02), (2, 0.04), (3, 0.08), (4, 0.16), (5, 0.16), (6, 0.16)]
    # and the timers keep them: each run at least its backoff after the one before
    delays = gaps(rec, "k")[:6]
    assert all(d >= e * 0.9 for d, e in zip(delays, [r[1] for r in retries], strict=False))
    assert queue.sizes()["failing"] == 1


async def test_a_success_resets_the_backoff_of_its_key_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def answer(key: Hashable, n: int) -> Decision:
        if key == "bad" or n < 3:
            raise RuntimeError("boom")
        if n == 3:
            return Decision.retry(0.0)  # success: the next failure starts from the base
        raise RuntimeError("again")

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=2, backoff_base=0.01, backoff_cap=10.0)
    caplog.set_level("WARNING", logger="bridge.workqueue")
    queue.add("k")
    queue.add("bad")
    task = asyncio.create_task(queue.run())
    for _ in range(1000):
        if len(logged_retries(caplog, "k")) >= 5 and len(logged_retries(caplog, "bad")) >= 5:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    # three failures, the success, then from the base again
    assert logged_retries(caplog, "k")[:5] == [
        (1, 0.01),
        (2, 0.02),
        (3, 0.04),
        (1, 0.01),
        (2, 0.02),
    ]
    assert logged_retries(caplog, "bad")[:5] == [
        (1, 0.01),
        (2, 0.02),
        (3, 0.04),
        (4, 0.08),
        (5, 0.16),
    ]
    assert queue.sizes()["failing"] == 2


async def test_a_failing_key_logs_one_line_per_step_and_its_traceback_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def answer(key: Hashable, n: int) -> Decision:
        raise ValueError("the pool spec is odd")

    rec = Recorder(answer)
    queue = WorkQueue(rec, workers=1, backoff_base=0.01, backoff_cap=0.02)
    caplog.set_level("DEBUG", logger="bridge.workqueue")
    queue.add("k")
    task = asyncio.create_task(queue.run())
    for _ in range(1000):  # generous: the machine may be loaded
        if rec.count("k") >= 4:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    runs = rec.count("k")
    records = [r for r in caplog.records if r.name == "bridge.workqueue"]
    errors = [r for r in records if r.levelname == "ERROR"]
    warnings = [r for r in records if r.levelname == "WARNING"]
    debug = [r for r in records if r.levelname == "DEBUG"]
    assert runs >= 3
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "ValueError: the pool spec is odd" in errors[0].getMessage()
    assert len(warnings) in (runs - 1, runs - 2)  # the last run may still be logging
    assert all(r.exc_info is None for r in warnings)
    assert all("ValueError: the pool spec is odd" in r.getMessage() for r in warnings)
    assert all(r.exc_info is not None for r in debug) and len(debug) == len(warnings)


async def test_the_wake_history_is_kept_only_while_keys_are_processed() -> None:
    rec = Recorder()
    rec.hold = 0.3
    queue = WorkQueue(rec, workers=2)
    task = asyncio.create_task(queue.run())
    for i in range(5000):
        queue.wake(("cluster", "ns", f"c{i}"))
    assert queue.sizes()["wake_history"] == 0  # nothing processed: no key could miss them
    queue.add("k")
    for _ in range(200):
        if rec.count("k"):
            break
        await asyncio.sleep(0.01)
    for i in range(1000):
        queue.wake(("cluster", "ns", f"c{i}"))
    during = queue.sizes()["wake_history"]
    for _ in range(500):
        if not queue.sizes()["processing"]:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert during == 1000
    assert queue.sizes()["wake_history"] == 0


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
    rec = Recorder(lambda key, n: Decision.wait("t") if n == 0 else Decision.done())
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
