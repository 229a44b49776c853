"""Per-endpoint admission of claims: how many claims may talk to one IPAM endpoint at once.

A claim's IPAM work (an allocation, a release) is admitted per endpoint (``scheme://host:port``,
`backends.transport.endpoint_key`) before it starts. When the endpoint already has as many
claims in flight as its current limit, the claim is not run: it is parked in the work queue
(`endpoint_token`) and costs no API request and no worker. So a slow endpoint holds at most
its limit of workers, and claims of other endpoints keep being served by the others
(DESIGN.md section 5; issue 15, item 4).

The limit follows what the endpoint sustains, by AIMD (additive increase, multiplicative
decrease), as TCP's congestion window does: it starts at the most the transport lets one
endpoint run (`EndpointAdmission.max_limit`, ``IPAM_BRIDGE_ENDPOINT_MAX_CONCURRENT``); a call
that ends in `backends.errors.BackendUnavailableError` (timeout, connection error, 429/5xx,
breaker open, endpoint busy) halves it, at most once per "window" (only calls admitted after
the last decrease can decrease it again, so one burst of timeouts halves once); calls that
succeed raise it by one per ``limit`` successes (TCP's ``1/limit`` per acknowledgement), never
above the maximum nor below 1. Other errors (refused login, exhausted subnet...) leave it as
it is.

Wakes are handed over, not broadcast: when a claim in flight finishes and there is room, the
longest-waiting claim gets a *reservation* and is queued (``wake(key)``); its next pass uses
the reservation (nobody jumps ahead of it). A reserved or waiting claim whose pass ends without
needing the endpoint any more (bound, paused, gone, failed before) gives its place back in
`settle`, so the next waiting claim is queued: no wake is lost, whatever the claim became. The
queue's `add` of a key being processed runs it once more afterwards, so a wake that comes while
the refused claim is still returning its decision is not lost either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from backends.errors import BackendUnavailableError

__all__ = ["EndpointAdmission", "endpoint_token"]

log = logging.getLogger(__name__)

Key = Hashable


def endpoint_token(endpoint: str) -> tuple[str, str]:
    """Return the wake token claims waiting for ``endpoint`` (``scheme://host:port``) park under."""
    return ("endpoint", endpoint)


@dataclass
class _State:
    """One endpoint's admission (guarded by the `EndpointAdmission` lock)."""

    limit: int
    credit: int = 0  # successes since the limit last changed
    in_flight: dict[Key, int] = field(default_factory=dict)  # key -> epoch at admission
    reserved: dict[Key, None] = field(default_factory=dict)  # woken, place kept for them
    waiting: dict[Key, None] = field(default_factory=dict)  # refused, oldest first
    epoch: int = 0  # decreases so far: a call admitted before the last one cannot decrease

    def room(self) -> int:
        """Places free now (the limit minus those taken or reserved; negative after a cut)."""
        return self.limit - len(self.in_flight) - len(self.reserved)


class EndpointAdmission:
    """Claims in flight per IPAM endpoint, under a limit that adapts (AIMD). Thread-safe.

    Parameters
    ----------
    max_limit:
        The most claims one endpoint may have in flight (>= 1): the transport's per-endpoint
        limit (`backends.transport.EndpointRegistry.max_concurrent`). Each endpoint starts
        there.
    wake:
        Queues a claim's work-queue key (`bridge.runtime.workqueue.WorkQueue.add`); called without
        the lock held. It must run the key once more when the key is being processed.
    on_limit:
        Called with ``(endpoint, limit)`` when an endpoint's limit changes
        and when it is first used (a metric gauge); it must not call back into this object
        (it may be called with the lock held); its errors are logged, never raised.
    """

    def __init__(
        self,
        max_limit: int,
        wake: Callable[[Key], None],
        on_limit: Callable[[str, int], None] | None = None,
    ) -> None:
        if max_limit < 1:
            raise ValueError("max_limit must be >= 1")
        self.max_limit = max_limit
        self._wake = wake
        self._on_limit = on_limit
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}
        self._endpoints_of: dict[Key, set[str]] = {}  # waiting or reserved keys -> endpoints

    # -- queries (tests, metrics) --------------------------------------------------------------

    def limit(self, endpoint: str) -> int:
        """Return the claims ``endpoint`` may have in flight now (`max_limit` if never used)."""
        with self._lock:
            state = self._states.get(endpoint)
            return self.max_limit if state is None else state.limit

    def in_flight(self, endpoint: str) -> int:
        """Return how many claims of ``endpoint`` are admitted and not finished."""
        with self._lock:
            state = self._states.get(endpoint)
            return 0 if state is None else len(state.in_flight)

    def waiting(self, endpoint: str) -> list[Key]:
        """Return the keys refused by ``endpoint`` and not yet woken, oldest first."""
        with self._lock:
            state = self._states.get(endpoint)
            return [] if state is None else list(state.waiting)

    def sizes(self) -> dict[str, int]:
        """Return the sizes of the admission's state, by name (for benchmarks).

        ``endpoints``: states kept, one per IPAM endpoint URL ever used (bounded by the
        pools' configuration, not by claims); ``keys``: claims waiting, reserved or in
        flight somewhere.
        """
        with self._lock:
            return {"endpoints": len(self._states), "keys": len(self._endpoints_of)}

    # -- the protocol ----------------------------------------------------------------------------

    def try_admit(self, endpoint: str, key: Key) -> bool:
        """Admit ``key``'s IPAM work on ``endpoint``, or record it as waiting.

        Returns
        -------
        bool
            True: the claim may call the IPAM now and must then call `finish` (use `held`).
            False: the endpoint is full; the claim is remembered (in arrival order) and will
            be queued through ``wake`` when a place is kept for it: it should park
            (``Decision.wait(endpoint_token(endpoint))``) and call `settle` when its pass ends.
        """
        with self._lock:
            state = self._states.get(endpoint)
            if state is None:
                state = self._states[endpoint] = _State(limit=self.max_limit)
                self._tell(endpoint, self.max_limit)  # first use: the gauge starts at the max
            if key in state.in_flight:  # one worker per key: never count it twice
                return True
            if key in state.reserved:  # woken for this place
                del state.reserved[key]
            elif state.room() > 0:
                # Nobody waits while there is room (every change of room hands it out).
                state.waiting.pop(key, None)
            else:
                state.waiting.setdefault(key, None)
                self._endpoints_of.setdefault(key, set()).add(endpoint)
                return False
            self._forget(key, endpoint, state)
            state.in_flight[key] = state.epoch
            return True

    def wait_if_full(self, endpoint: str, key: Key) -> bool:
        """Record ``key`` as waiting and return True when ``endpoint`` has no room for it now.

        A peek for the writes a claim makes before its IPAM work (its ``ReleaseAddress``
        finalizer): a claim that `try_admit` would refuse parks before writing anything, so
        a burst of new claims does not spend the API server on claims that must wait anyway.
        Takes no place: with room, or a place kept for ``key``, or ``key`` in flight, returns
        False and `try_admit` decides at the IPAM call. After True the claim parks exactly
        as after a refused `try_admit` (``Decision.wait(endpoint_token(endpoint))``).
        """
        with self._lock:
            state = self._states.get(endpoint)
            if state is None or key in state.in_flight or key in state.reserved:
                return False
            if state.room() > 0:
                return False
            state.waiting.setdefault(key, None)
            self._endpoints_of.setdefault(key, set()).add(endpoint)
            return True

    def finish(self, endpoint: str, key: Key, error: BaseException | None = None) -> None:
        """End ``key``'s admitted IPAM work on ``endpoint``; adapt the limit; wake the next.

        ``error``: what the work raised (None: it succeeded). A `BackendUnavailableError`
        halves the limit (once per window: only calls admitted since the last decrease
        count), ``limit`` successes raise it by one, anything else leaves it. The place is
        released, and kept for the longest-waiting claims, before they are queued (``wake``
        is called after the lock is let go). A key not in flight is ignored.
        """
        with self._lock:
            state = self._states.get(endpoint)
            if state is None or key not in state.in_flight:
                return
            epoch = state.in_flight.pop(key)
            before = state.limit
            if error is None and state.limit < self.max_limit:
                state.credit += 1
                if state.credit >= state.limit:
                    state.limit += 1
                    state.credit = 0
            elif isinstance(error, BackendUnavailableError) and epoch == state.epoch:
                state.limit = max(1, state.limit // 2)
                state.credit = 0
                state.epoch += 1
            after = state.limit
            woken = self._hand_out(state)
        if after != before:
            log.info("endpoint %s: %d claims may be in flight (was %d)", endpoint, after, before)
            self._tell(endpoint, after)
        self._call_wake(woken)

    @contextmanager
    def held(self, endpoint: str, key: Key) -> Iterator[None]:
        """Run the enclosed IPAM work of an admitted ``key``, then `finish` it.

        The exception of the block (if any) is passed to `finish` and propagates unchanged;
        the place is given back whatever happens.
        """
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.finish(endpoint, key, error)

    def settle(self, key: Key, waits_on: tuple[Hashable, ...] = ()) -> None:
        """End a pass of ``key``: give back what it holds for endpoints it no longer waits on.

        Called at the end of every pass of a claim (whatever it decided). ``waits_on`` is
        the wake tokens of its decision: for an endpoint whose `endpoint_token` is among
        them the claim keeps its place in line; for any other, it leaves the line, and a
        reservation it did not use goes to the next waiting claim.
        """
        with self._lock:
            endpoints = self._endpoints_of.get(key)
            if not endpoints:
                return
            woken: list[Key] = []
            for endpoint in list(endpoints):
                if endpoint_token(endpoint) in waits_on:
                    continue
                state = self._states[endpoint]
                state.waiting.pop(key, None)
                state.reserved.pop(key, None)
                endpoints.discard(endpoint)
                woken += self._hand_out(state)
            if not endpoints:
                self._endpoints_of.pop(key, None)
        self._call_wake(woken)

    # -- inside --------------------------------------------------------------------------------

    def _hand_out(self, state: _State) -> list[Key]:
        """Keep the free places for the longest-waiting keys; return them (lock held)."""
        woken: list[Key] = []
        while state.waiting and state.room() > 0:
            key = next(iter(state.waiting))
            del state.waiting[key]
            state.reserved[key] = None
            woken.append(key)
        return woken

    def _forget(self, key: Key, endpoint: str, state: _State) -> None:
        """Drop ``endpoint`` from what ``key`` waits for when it neither waits nor is reserved."""
        if key in state.waiting or key in state.reserved:
            return
        endpoints = self._endpoints_of.get(key)
        if endpoints is not None:
            endpoints.discard(endpoint)
            if not endpoints:
                del self._endpoints_of[key]

    def _call_wake(self, keys: list[Key]) -> None:
        for key in keys:
            self._wake(key)

    def _tell(self, endpoint: str, limit: int) -> None:
        if self._on_limit is None:
            return
        try:
            self._on_limit(endpoint, limit)
        except Exception:  # a metric must never break a claim
            log.exception("endpoint limit hook failed")
