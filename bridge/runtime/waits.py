"""Waits beside the work queue: keys parked for a place, and tokens held off for a while.

`Places`: keys parked for a place at something with a limit (a claim waiting for a place at
its IPAM server) are woken one per free place, longest parked first; the place is kept for the
woken key (`Places.may_take`), and one that ends its pass without taking it passes it on.
`HoldOff`: a token (a pool found with no free address) is held off for some seconds, or until
`HoldOff.lift` (an address freed).
Both keep nothing per key beyond a pass; neither knows what the tokens stand for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Protocol

__all__ = ["HoldOff", "Places", "Waker"]

Key = Hashable
Token = Hashable


class Waker(Protocol):
    """What `Places` wakes keys through (`bridge.runtime.workqueue.WorkQueue.wake_first`)."""

    def wake_first(self, token: Token, count: int) -> list[Key]:
        """Queue the ``count`` keys parked longest under ``token``; return them."""

    def wake(self, token: Token, count: int | None = None) -> int:
        """Queue every key parked under ``token``, and those that park after their pass."""


class Places:
    """Wakes keys parked under a token one per free place (controller-runtime has no twin).

    Parameters
    ----------
    queue:
        The work queue the keys are parked in (`bridge.runtime.workqueue.Result.wait`).
        Read at each wake (the operator's queue may be set after construction).
    room:
        Returns the places free now under a token (may be negative); quick, any thread.

    Thread-safe. What is kept per key lives from its wake to the end of its next pass.
    """

    def __init__(self, queue: Waker, room: Callable[[Token], int]) -> None:
        self._queue = queue
        self._room = room
        self._lock = threading.Lock()
        self._woken: dict[Token, set[Key]] = {}  # woken for a place, their pass not ended

    def freed(self, token: Token) -> None:
        """Wake as many keys parked under ``token`` as it has places not yet promised.

        When fewer are parked, a key refused in a pass still running parks after it: the
        queue's plain `Waker.wake` runs such a key again at once instead.
        """
        with self._lock:
            woken = self._woken.get(token, set())
            want = self._room(token) - len(woken)
            if want <= 0:
                return
            keys = self._queue.wake_first(token, want)
            if keys:
                self._woken[token] = woken | set(keys)
            if len(keys) < want:
                self._queue.wake(token)

    def may_take(self, token: Token, key: Key) -> bool:
        """Return True when ``key`` may take a place under ``token`` now.

        A key woken for a place may while one is free; any other only while a place is free
        beyond those promised to woken keys, so no key jumps ahead of one woken before it.
        """
        with self._lock:
            woken = self._woken.get(token, set())
            room = self._room(token)
            return room > 0 if key in woken else room - len(woken) > 0

    def took(self, token: Token, key: Key) -> None:
        """Record that ``key`` took its place under ``token`` (no longer promised to it)."""
        with self._lock:
            self._drop(token, key)

    def passed(self, key: Key) -> None:
        """End ``key``'s pass: a place it was woken for and left goes to the next key."""
        with self._lock:
            tokens = [t for t, keys in self._woken.items() if key in keys]
            for token in tokens:
                self._drop(token, key)
        for token in tokens:
            self.freed(token)

    def _drop(self, token: Token, key: Key) -> None:
        """Forget that a place under ``token`` is promised to ``key`` (lock held)."""
        keys = self._woken.get(token)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._woken[token]

    def __len__(self) -> int:
        """Return how many keys were woken for a place and have not ended their pass."""
        with self._lock:
            return sum(len(keys) for keys in self._woken.values())


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
