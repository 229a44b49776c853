"""A keyed work queue: what turns watch events into level-triggered reconciles.

The watches only *add keys* here; workers take a key, read the object as it is now and decide
what it needs (`bridge.reconcilers`). As controller-runtime's workqueue
(https://pkg.go.dev/k8s.io/client-go/util/workqueue): one worker per key at a time (a key
added while it runs runs once more afterwards), deduplication at the earliest due time,
in-memory delays, and per-key exponential backoff of failed passes (5 ms doubling to 1000 s,
as ``DefaultTypedItemBasedRateLimiter``). Beyond it: a background lane for settled objects
seen again (run only when no other key is due, one at a time, so that these checks leave
the CPU to new work), and parking under wake tokens (`Result.wait`, `WorkQueue.wake`).
Memory is kept per key only while it is queued, parked, processed or failing.

A queue made with ``standby=True`` drops every key and wake until `WorkQueue.lead`: a replica
standing by for the leader Lease keeps no per-key state, however many objects its informers
see (controller-runtime starts its controllers, and so their event handlers, only once
elected); the new leader then queues what its stores hold
(`bridge.handlers.resync.replay`).

The queue runs on the operator's event loop, the reconciles in a pool of ``workers`` threads;
`add` and `wake` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from bridge.runtime.fence import LeadershipLostError

__all__ = ["Result", "WorkQueue"]

log = logging.getLogger(__name__)

Key = Hashable
Token = Hashable

#: Seconds a key added ``first`` (`WorkQueue.add`) is due before its add time: before every
#: key due, as the loop's clock (monotonic, since boot) is never that far (31 years) from 0.
FIRST_LEAD = 1e9


@dataclass(frozen=True)
class Result:
    """What a reconcile wants to happen next to its key (controller-runtime's ``Result``).

    As ``reconcile.Result`` (https://pkg.go.dev/sigs.k8s.io/controller-runtime/pkg/reconcile#Result),
    plus parking: a key may wait for wake tokens instead of a timer.

    Attributes
    ----------
    after:
        Seconds after which to reconcile the key again (None: not on a timer).
    wake_on:
        Wake tokens the key is parked under: `WorkQueue.wake` with any of them queues it.
    """

    after: float | None = None
    wake_on: tuple[Token, ...] = field(default=())

    @classmethod
    def done(cls) -> Result:
        """Nothing more to do until the object changes."""
        return cls()

    @classmethod
    def requeue_after(cls, seconds: float) -> Result:
        """Reconcile the key again after ``seconds``."""
        return cls(after=seconds)

    @classmethod
    def wait(cls, *tokens: Token, at_most: float | None = None) -> Result:
        """Wait until woken by one of ``tokens`` (or after ``at_most`` seconds, if given)."""
        return cls(after=at_most, wake_on=tokens)


class WorkQueue:
    """Keys to reconcile, each processed by one worker at a time.

    Parameters
    ----------
    reconcile:
        Called in a worker thread with a key; returns a `Result`. An exception is logged and
        the key is retried after its backoff (`backoff`).
    workers:
        How many keys are reconciled at the same time (threads).
    error_delay:
        Seconds before a key whose reconcile raised for the first time in a row is tried
        again; each further failure in a row doubles it.
    max_error_delay:
        The cap of that doubling, in seconds.
    standby:
        True: `add` and `wake` drop everything until `lead` is called (a standby replica);
        False: keys are kept from the start.
    """

    def __init__(
        self,
        reconcile: Callable[[Key], Result],
        *,
        workers: int,
        error_delay: float = 0.005,
        max_error_delay: float = 1000.0,
        standby: bool = False,
    ) -> None:
        self._reconcile = reconcile
        self._leading = not standby
        self._workers = workers
        # The background key running, if any: one at a time, as a thread that checks settled
        # objects one after the other already takes the GIL from the event loop half the time.
        self._background_running: set[Key] = set()
        self._error_delay = error_delay
        self._max_error_delay = max(max_error_delay, error_delay)
        self._failures: dict[Key, int] = {}  # keys whose last passes raised: how many in a row
        self._lock = threading.Lock()
        # Queued keys: when they are due (loop time), and whether in the background lane.
        self._due: dict[Key, tuple[float, bool]] = {}
        self._heap: list[tuple[float, int, Key]] = []  # the front lane
        self._background: list[tuple[float, int, Key]] = []  # the background lane
        self._seq = itertools.count()
        self._processing: set[Key] = set()
        self._again: dict[Key, float] = {}  # added while processing: due time afterwards
        # Added while processing with a condition (`add`'s ``unless``): asked afterwards.
        self._again_unless: dict[Key, list[tuple[float, Callable[[], bool]]]] = {}
        self._parked: dict[Token, dict[Key, None]] = {}  # insertion-ordered sets
        self._tokens_of: dict[Key, tuple[Token, ...]] = {}
        # A wake that happens while a key is being processed must not be lost when that key
        # then parks under the token: wakes are numbered, and a key remembers the number at
        # which its processing started.
        self._wakes = itertools.count(1)
        self._last_wake: dict[Token, int] = {}
        self._started_at: dict[Key, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._told = False  # a notice is on its way to the loop, which has not looked since
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._progress_at = 0.0  # loop time a reconcile last started or finished

    # -- adding keys (any thread) ------------------------------------------------------------

    def add(
        self,
        key: Key,
        after: float = 0.0,
        *,
        background: bool = False,
        unless: Callable[[], bool] | None = None,
        first: bool = False,
    ) -> None:
        """Queue ``key`` to be reconciled in ``after`` seconds (keeps an earlier due time).

        ``background``: the key runs only when no key of the front lane is due (a check of an
        object that most likely needs nothing); a key already queued in the front lane stays
        there. Safe from any thread; before `run` has started, keys are kept and run once it
        starts. A standby queue (``standby=True``) drops the key until `lead`.

        ``unless``: nothing is queued if it answers True, asked now or, when the key is
        being processed, once that pass has ended (for a watch event that may be the echo
        of the pass's own write, which the pass records only before it ends; see
        `bridge.runtime.expectations.Expectations.ours`). It must be quick and must not call
        this queue.

        ``first``: the key runs before every key of the front lane due now, in the order
        such keys were added (``after`` ignored; controller-runtime's priority queue,
        ``AddOpts.Priority``): a key that holds something the others wait for, such as a
        place promised at an IPAM server (`bridge.runtime.waits.Places`), does not wait
        behind keys that hold nothing.
        """
        if not self._leading:
            return
        if unless is not None:
            with self._lock:
                if key in self._processing:
                    self._again_unless.setdefault(key, []).append((after, unless))
                    return
            if unless():
                log.debug("%s not queued: the echo of our own write", key)
                return
        with self._lock:
            self._unpark(key)
            due = self._now() - FIRST_LEAD if first else self._now() + max(after, 0.0)
            self._schedule(key, due, background=background and not first)
        log.debug("%s queued, due in %.3f s%s", key, after, " (first)" if first else "")
        self._notify()

    def wake(self, token: Token, count: int | None = None) -> int:
        """Queue the keys parked under ``token`` now; return how many were woken.

        Parameters
        ----------
        count:
            Wake at most this many, longest parked first (None: all). With a count, a wake
            that finds no key parked is not remembered for keys being processed.

        A standby queue (``standby=True``) wakes and remembers nothing until `lead`.
        """
        if not self._leading:
            return 0
        with self._lock:
            parked = list(self._parked.get(token, ()))
            keys = parked if count is None else parked[:count]
            if count is None:
                self._last_wake[token] = next(self._wakes)
            for key in keys:
                self._unpark(key)
                self._schedule(key, self._now())
        if keys:
            if log.isEnabledFor(logging.DEBUG):
                for key in keys:
                    log.debug("%s woken by %s", key, token)
            self._notify()
        return len(keys)

    def lead(self) -> None:
        """Accept keys and wakes from now on (a standby queue; a no-op on any other).

        What the watches told before is not in the queue: the caller queues what its stores
        hold once this returned (`bridge.handlers.resync.replay`), so that an event told
        between the two is queued either way.
        """
        self._leading = True

    @property
    def leading(self) -> bool:
        """True once keys are accepted (always, but on a standby queue before `lead`)."""
        return self._leading

    def backoff(self, failures: int) -> float:
        """Return the delay in seconds after ``failures`` (>= 1) failed passes in a row."""
        return float(min(self._error_delay * 2 ** min(failures - 1, 64), self._max_error_delay))

    def sizes(self) -> dict[str, int]:
        """Return the sizes of the queue's in-memory structures (for the soak benchmark)."""
        with self._lock:
            return {
                "due": len(self._due),
                "heap": len(self._heap) + len(self._background),
                "processing": len(self._processing),
                "parked_tokens": len(self._parked),
                "parked_keys": len(self._tokens_of),
                "wake_history": len(self._last_wake),
                "failing": len(self._failures),
            }

    def parked(self, token: Token) -> frozenset[Key]:
        """Return the keys parked under ``token`` (for metrics and tests)."""
        with self._lock:
            return frozenset(self._parked.get(token, ()))

    def is_parked(self, key: Key) -> bool:
        """Return True while ``key`` is parked under a wake token (safe from any thread)."""
        with self._lock:
            return key in self._tokens_of

    def __len__(self) -> int:
        """Return how many keys are queued or being processed."""
        with self._lock:
            return len(self._due) + len(self._processing)

    def stalled(self) -> float:
        """Return the seconds due keys have waited with no reconcile started or finished.

        0.0 while the queue does not run (a standby replica) or no key is due now. A key
        parked on a wake token is not due. Safe from any thread.
        """
        with self._lock:
            if self._loop is None:
                return 0.0
            now = self._now()
            # A key added first waits since its add time, not since its lead.
            waiting = [due + FIRST_LEAD if due < 0 else due for due, _ in self._due.values()]
            waiting = [due for due in waiting if due <= now]
            if not waiting:
                return 0.0
            return max(0.0, now - max(self._progress_at, min(waiting)))

    def _now(self) -> float:
        loop = self._loop
        return loop.time() if loop is not None else 0.0

    def _schedule(self, key: Key, due: float, *, background: bool = False) -> None:
        if key in self._processing:
            self._again[key] = min(due, self._again.get(key, due))
            return
        current = self._due.get(key)
        if current is not None:
            if current[1] and not background:  # to the front lane, at the earlier time
                due = min(due, current[0])
            elif current[0] <= due:
                return
            background = background and current[1]
        self._due[key] = (due, background)
        heapq.heappush(self._background if background else self._heap, (due, next(self._seq), key))

    def _park(self, key: Key, tokens: tuple[Token, ...]) -> None:
        self._tokens_of[key] = tokens
        for token in tokens:
            self._parked.setdefault(token, {})[key] = None

    def _unpark(self, key: Key) -> None:
        for token in self._tokens_of.pop(key, ()):
            keys = self._parked.get(token)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._parked[token]

    def _notify(self) -> None:
        """Tell the loop that keys changed, once until it looks again (one self-pipe write)."""
        loop, changed = self._loop, self._changed
        if loop is None or changed is None or loop.is_closed():
            return
        with self._lock:
            if self._told:
                return
            self._told = True
        loop.call_soon_threadsafe(changed.set)  # asyncio.Event is not thread-safe

    # -- running -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Process keys until cancelled (the operator's clean-up cancels it).

        Keys due now are handed to idle workers, earliest first; the loop sleeps until the next
        due time or until a key is added.
        """
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._workers, thread_name_prefix="ipam-bridge-worker"
        )
        slots = asyncio.Semaphore(self._workers)
        try:
            while True:
                with self._lock:
                    self._told = False
                self._changed.clear()
                # A worker first, then a key: a key waiting for a worker stays due (`stalled`).
                await slots.acquire()
                key, wait = self._pop_due()
                if key is None:
                    slots.release()
                    # asyncio.timeout, not wait_for: wait_for of Python 3.11 drops a cancel
                    # that arrives with the wake-up (https://github.com/python/cpython/issues/86296).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await self._changed.wait()
                    continue
                log.debug("%s handed to a worker", key)
                task = asyncio.create_task(self._process(key, slots))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            # Waiting for the workers blocks: off the event loop.
            await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)

    def _failed(self, key: Key, exc: Exception) -> float:
        """Count a failed pass of ``key``, log it once; return the seconds until it runs again."""
        with self._lock:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
        delay = self.backoff(failures)
        what = f"{type(exc).__name__}: {exc}"
        if failures == 1:
            log.error(
                "reconcile of %s failed: %s; retrying in %.3g s", key, what, delay, exc_info=exc
            )
        else:
            log.warning(
                "reconcile of %s failed again (%d in a row): %s; retrying in %.3g s",
                key,
                failures,
                what,
                delay,
            )
            log.debug("reconcile of %s failed", key, exc_info=exc)
        return delay

    def _forget_old_wakes(self) -> None:
        """Drop wake numbers no key in process can miss any more (caller holds the lock).

        A wake matters only to a key whose processing started before it; once every key in
        process started after a token's last wake, that wake is history.
        """
        if not self._last_wake:
            return
        if not self._started_at:
            self._last_wake.clear()
            return
        if len(self._last_wake) <= 4 * len(self._started_at) + 64:
            return
        oldest = min(self._started_at.values())
        for token in [t for t, number in self._last_wake.items() if number <= oldest]:
            del self._last_wake[token]

    def _head(self, lane: list[tuple[float, int, Key]], background: bool) -> float | None:
        """Drop superseded entries from ``lane``; return its first due time (caller locks)."""
        while lane:
            due, _, key = lane[0]
            if self._due.get(key) == (due, background):
                return due
            heapq.heappop(lane)  # superseded by an earlier add, another lane, or done
        return None

    def _pop_due(self) -> tuple[Key | None, float | None]:
        """Return a key due now (marked processing), or None and the seconds to the next one.

        The front lane first; a background key only when no front key is due.
        """
        with self._lock:
            now = self._now()
            waits: list[float] = []
            for lane, background in ((self._heap, False), (self._background, True)):
                if background and self._background_running:
                    continue  # woken again when one of them ends (`_process` notifies)
                due = self._head(lane, background)
                if due is None:
                    continue
                if due > now:
                    waits.append(due - now)
                    continue
                _, _, key = heapq.heappop(lane)
                del self._due[key]
                if background:
                    self._background_running.add(key)
                self._unpark(key)
                self._processing.add(key)
                self._progress_at = now
                self._started_at[key] = next(self._wakes)
                return key, None
            return None, min(waits, default=None)

    def _pass(self, key: Key) -> Result:
        """Reconcile ``key`` in a worker thread; its start and decision are logged at DEBUG."""
        log.debug("pass of %s starts", key)
        decision = self._reconcile(key)
        log.debug("pass of %s decided %s", key, decision)
        return decision

    async def _process(self, key: Key, slots: asyncio.Semaphore) -> None:
        loop = asyncio.get_running_loop()
        decision: Result
        try:
            decision = await loop.run_in_executor(self._executor, self._pass, key)
        except LeadershipLostError as exc:  # the process is exiting: no traceback, no storm
            log.warning("%s not reconciled: %s", key, exc)
            decision = Result.requeue_after(1.0)
        except Exception as exc:
            decision = Result.requeue_after(self._failed(key, exc))
        else:
            with self._lock:
                self._failures.pop(key, None)
        finally:
            slots.release()
        with self._lock:
            self._progress_at = loop.time()
            self._processing.discard(key)
            self._background_running.discard(key)
            started = self._started_at.pop(key, 0)
            again = self._again.pop(key, None)
            for after, unless in self._again_unless.pop(key, ()):
                if not unless():  # not an echo of this pass's own write: run again
                    due = loop.time() + max(after, 0.0)
                    again = due if again is None else min(again, due)
            missed = any(self._last_wake.get(token, 0) > started for token in decision.wake_on)
            if again is not None or missed:
                self._schedule(key, loop.time() if again is None else again)
            else:
                if decision.wake_on:
                    self._park(key, decision.wake_on)
                if decision.after is not None:
                    self._schedule(key, loop.time() + decision.after)
            self._forget_old_wakes()
        log.debug("pass of %s over", key)
        self._notify()
