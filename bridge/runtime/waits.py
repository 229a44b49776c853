"""Waits beside the work queue: keys parked for a place, and tokens held off for a while.

`Places`: keys refused a place at something with a limit (a claim waiting for a place at its
IPAM server) park, and are woken one per free place, oldest first; the place is kept for the
woken key (`Places.may_take`), and one that ends its pass without taking it passes it on.
`HoldOff`: a token (a pool found with no free address) is held off for some seconds, or until
`HoldOff.lift` (an address freed).
Neither knows what the tokens stand for.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Hashable
from typing import Protocol

from bridge.runtime.workqueue import Result

__all__ = ["HoldOff", "Places", "Waker"]

Key = Hashable
Token = Hashable


class Waker(Protocol):
    """Where `Places` queues a key (`bridge.runtime.workqueue.WorkQueue.add`)."""

    def add(self, key: Key, after: float = 0.0, *, first: bool = False) -> None:
        """Queue ``key`` now (a parked key is unparked; one being processed runs once more).

        ``first``: before the keys due now (`bridge.runtime.workqueue.WorkQueue.add`).
        """


class Places:
    """The keys waiting for a place under a token, woken one per free place, oldest first.

    A key refused a place waits through `wait` (it parks under the token); when places free
    (`freed`), as many waiting keys as there are places not yet promised are promised one and
    queued, and no other key takes a promised place (`may_take`). A woken key that ends its
    pass without taking its place (`passed`) passes it on. controller-runtime has no twin:
    its work queue has no notion of a limited place.

    Parameters
    ----------
    queue:
        The work queue of the keys.
    room:
        Returns the places free now under a token (may be negative); quick, any thread.

    Thread-safe. A key is kept from its refusal until it is woken or a pass of it ends
    without a refusal (its object gone, or its work done elsewhere).
    """

    def __init__(self, queue: Waker, room: Callable[[Token], int]) -> None:
        self._queue = queue
        self._room = room
        self._lock = threading.Lock()
        self._waiting: dict[Token, dict[Key, None]] = {}  # refused, oldest first
        self._woken: dict[Token, dict[Key, None]] = {}  # promised a place, pass not ended
        self._refused_now: set[Key] = set()  # refused in the pass running now

    def wait(self, token: Token, key: Key) -> Result:
        """Record that ``key`` was refused a place under ``token``; return its parking."""
        with self._lock:
            self._drop(self._woken, token, key)
            self._waiting.setdefault(token, {})[key] = None
            self._refused_now.add(key)
        self.freed(token)  # a place may have freed between the refusal and now
        return Result.wait(token)

    def freed(self, token: Token) -> None:
        """Promise the places of ``token`` not yet promised to the keys waiting longest.

        The promised keys are queued once the lock is let go: queueing may wake the event
        loop (a write to its self-pipe, which lets other threads run), and every worker
        ends its pass under this lock (`passed`). They are queued first, before the keys
        due now: a promised place is kept from every other key, so it stays idle until its
        key runs (a burst of new keys, each of which would only park, must not come first).
        """
        with self._lock:
            waiting = self._waiting.get(token)
            if not waiting:
                return
            woken = self._woken.setdefault(token, {})
            want = self._room(token) - len(woken)
            keys = list(itertools.islice(waiting, max(want, 0)))
            for key in keys:
                self._drop(self._waiting, token, key)
                woken[key] = None
            if not woken:
                del self._woken[token]
        for key in keys:
            self._queue.add(key, first=True)

    def may_take(self, token: Token, key: Key) -> bool:
        """Return True when ``key`` may take a place under ``token`` now.

        A key woken for a place may while one is free; any other only while a place is free
        beyond those promised, so no key jumps ahead of one woken before it.
        """
        with self._lock:
            woken = self._woken.get(token, {})
            room = self._room(token)
            return room > 0 if key in woken else room - len(woken) > 0

    def took(self, token: Token, key: Key) -> None:
        """Record that ``key`` took a place under ``token`` (no longer waiting or promised)."""
        with self._lock:
            self._drop(self._woken, token, key)
            self._drop(self._waiting, token, key)

    def passed(self, key: Key) -> None:
        """End ``key``'s pass: a key not refused in it waits no more; a promise goes on."""
        with self._lock:
            if key in self._refused_now:
                self._refused_now.discard(key)
            else:
                for token in [t for t, keys in self._waiting.items() if key in keys]:
                    self._drop(self._waiting, token, key)
            tokens = [t for t, keys in self._woken.items() if key in keys]
            for token in tokens:
                self._drop(self._woken, token, key)
        for token in tokens:
            self.freed(token)

    @staticmethod
    def _drop(by_token: dict[Token, dict[Key, None]], token: Token, key: Key) -> None:
        """Remove ``key`` from ``by_token[token]``, and the token when empty (lock held)."""
        keys = by_token.get(token)
        if keys is not None and key in keys:
            del keys[key]
            if not keys:
                del by_token[token]

    def sizes(self) -> dict[str, int]:
        """Return how many keys wait for a place, and how many were promised one."""
        with self._lock:
            return {
                "waiting": sum(len(k) for k in self._waiting.values()),
                "woken": sum(len(k) for k in self._woken.values()),
            }


class HoldOff:
    """Tokens held off for ``seconds`` after `hold`, or until `lift`; thread-safe.

    ``clock``: monotonic seconds (tests pass a fake). Memory: one entry per token held,
    dropped by `lift` or when looked at after it ran out.
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._since: dict[Token, float] = {}

    def hold(self, token: Token) -> None:
        """Hold ``token`` off from now for ``seconds``."""
        with self._lock:
            self._since[token] = self._clock()

    def held(self, token: Token) -> bool:
        """Return True while ``token`` is held off."""
        with self._lock:
            since = self._since.get(token)
            if since is not None and self._clock() - since >= self.seconds:
                del self._since[token]
                since = None
            return since is not None

    def lift(self, token: Token) -> None:
        """Stop holding ``token`` off (nothing when it is not held)."""
        with self._lock:
            self._since.pop(token, None)

    def __len__(self) -> int:
        """Return how many tokens are remembered as held off."""
        with self._lock:
            return len(self._since)
