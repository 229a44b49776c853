"""Flow control per IPAM endpoint: one object per ``scheme://host:port``, one policy.

`FlowControl` (one per operator) keeps an `EndpointFlow` per IPAM endpoint and decides, for
each of them, which claims may call it, which operations and requests are sent, which logins
are tried, and which pools are not asked for an address; its docstring states the policy.
`backends.transport.Transport` sends through it; the operator's claims reconciler admits claims
through it. Nothing here imports Kubernetes or the operator: claims and pools are opaque
hashable keys.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from urllib.parse import urlsplit

from backends.errors import (
    AuthenticationFailedError,
    BackendUnavailableError,
    EndpointUnavailableError,
)
from backends.retry import time_left

__all__ = [
    "EndpointFlow",
    "EndpointState",
    "FlowControl",
    "RequestRecord",
    "endpoint_key",
    "endpoint_token",
]

log = logging.getLogger(__name__)

#: Seconds a login waits for a login of the same credential in flight before it is held
#: back (`EndpointFlow.check_login`).
LOGIN_WAIT_SECONDS = 30.0

#: A claim's key (the work queue's), or a pool's: opaque here.
Key = Hashable


def endpoint_key(url: str) -> str:
    """Return ``scheme://host:port`` of ``url`` (the default port made explicit).

    Idempotent: the key of a key is itself. Never raises for a string.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def endpoint_token(endpoint: str) -> tuple[str, str]:
    """Return the wake token claims waiting for ``endpoint`` (``scheme://host:port``) park under."""
    return ("endpoint", endpoint)


def _at(wall: float) -> str:
    """Return a POSIX time as ``2026-11-24T03:41:07Z``."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EndpointState(IntEnum):
    """State of an endpoint's circuit breaker (the value of the endpoint-state metric)."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


@dataclass(frozen=True)
class RequestRecord:
    """One HTTP request as the metrics hook sees it (no URL path, no secret).

    Attributes
    ----------
    endpoint:
        ``scheme://host:port``.
    method:
        The HTTP method.
    result:
        The HTTP status as text (``"200"``), or ``timeout``, ``connection_error``,
        ``tls_error``, ``error`` when there was no answer.
    seconds:
        How long the request took.
    """

    endpoint: str
    method: str
    result: str
    seconds: float


@dataclass
class _Line:
    """The claims of one endpoint: its AIMD limit and its line (guarded by `FlowControl`)."""

    limit: int
    credit: int = 0  # successes since the limit last changed
    in_flight: dict[Key, int] = field(default_factory=dict)  # key -> epoch at admission
    reserved: dict[Key, None] = field(default_factory=dict)  # woken, place kept for them
    waiting: dict[Key, None] = field(default_factory=dict)  # refused, oldest first
    epoch: int = 0  # decreases so far: a call admitted before the last one cannot decrease

    def room(self) -> int:
        """Places free now (the limit minus those taken or reserved; negative after a cut)."""
        return self.limit - len(self.in_flight) - len(self.reserved)

    def adapt(self, epoch: int, error: BaseException | None, max_limit: int) -> None:
        """Adapt the limit to the outcome of a call admitted at ``epoch`` (AIMD)."""
        if error is None and self.limit < max_limit:
            self.credit += 1
            if self.credit >= self.limit:
                self.limit += 1
                self.credit = 0
        elif isinstance(error, BackendUnavailableError) and epoch == self.epoch:
            self.limit = max(1, self.limit // 2)
            self.credit = 0
            self.epoch += 1

    def hand_out(self) -> list[Key]:
        """Keep the free places for the longest-waiting keys and return them."""
        woken: list[Key] = []
        while self.waiting and self.room() > 0:
            key = next(iter(self.waiting))
            del self.waiting[key]
            self.reserved[key] = None
            woken.append(key)
        return woken


class EndpointFlow:
    """The flow control of one IPAM endpoint (``scheme://host:port``); thread-safe.

    Holds, for that endpoint, every state the policy of `FlowControl` decides from: the
    circuit breaker, the operation slots, the login budget, the pools found exhausted, and
    the line of claims (AIMD limit, guarded by the `FlowControl` lock because a claim's place
    spans endpoints). Made by `FlowControl.endpoint`.
    """

    def __init__(self, key: str, control: FlowControl) -> None:
        self.key = key
        self._control = control
        self._lock = threading.Lock()
        # Told when a login of an unproven credential ends (`check_login` waits for it).
        self._login_done = threading.Condition(self._lock)
        self._slots = threading.BoundedSemaphore(control.max_concurrent)
        self._held = threading.local()
        self._state = EndpointState.CLOSED
        self._failures = 0
        self._open_until = 0.0
        self._probing = False
        # Login budget: times of refused logins, and per credential its last refusal/success.
        self._refusals: collections.deque[float] = collections.deque()
        self._last_refused: dict[str, tuple[float, str]] = {}
        self._last_ok: dict[str, float] = {}
        # Logins of unproven credentials in flight: they may all be refused, so they count
        # against the budget until they end (concurrent logins could overrun it otherwise).
        self._pending = 0
        self._trying: dict[str, int] = {}  # those logins in flight, by credential
        self._blocked_until = 0.0
        self._exhausted: dict[Key, float] = {}  # pool -> when it was found exhausted
        self.line: _Line | None = None  # claims; made at the first admission

    @property
    def state(self) -> EndpointState:
        """The breaker's state (an open breaker past its cool-down still reads OPEN)."""
        with self._lock:
            return self._state

    # ------------------------------------------------------------------ slots

    @contextmanager
    def operation(self) -> Iterator[None]:
        """Run one operation: refused while the breaker is open, else in a slot.

        Raises
        ------
        EndpointUnavailableError
            "endpoint <url> unreachable, next try at <time>" while the breaker is open
            within its cool-down (no slot is taken, nothing is sent); "endpoint <url> busy"
            when no slot frees in time (see `slot`).
        """
        self.refuse_while_open()
        with self.slot():
            yield

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one of the endpoint's slots for an operation (re-entrant per thread).

        Raises
        ------
        EndpointUnavailableError
            "endpoint <url> busy" when no slot frees within `FlowControl.slot_wait_seconds`
            (cut to the time left of the current `backends.retry.deadline`).
        """
        depth = getattr(self._held, "depth", 0)
        if depth:
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth -= 1
            return
        control = self._control
        wait = control.slot_wait_seconds
        left = time_left()
        if left is not None:
            wait = max(0.0, min(wait, left))
        if not self._slots.acquire(timeout=wait):
            raise EndpointUnavailableError(
                f"endpoint {self.key} busy: {control.max_concurrent} calls to it are "
                f"in flight (slow or hung?); not waiting longer than {wait:g}s"
            )
        self._held.depth = 1
        try:
            yield
        finally:
            self._held.depth = 0
            self._slots.release()

    # ------------------------------------------------------------------ breaker

    def refuse_while_open(self) -> None:
        """Raise while the breaker is open and its cool-down runs; else return (takes nothing).

        Raises
        ------
        EndpointUnavailableError
            "endpoint <url> unreachable, next try at <time> (<n> consecutive failures)".
        """
        with self._lock:
            if self._state is not EndpointState.OPEN:
                return
            now = self._control.clock()
            if now >= self._open_until:
                return  # the cool-down is over: the next request is the probe
            next_try, failures = self._open_until - now, self._failures
        self._raise_unreachable(next_try, failures)

    def admit(self) -> None:
        """Let a request through, or fail fast while the breaker is open.

        After the cool-down one request goes through as the probe (half-open); others
        fail fast until its outcome is known.

        Raises
        ------
        EndpointUnavailableError
            "endpoint <url> unreachable, next try at <time> (<n> consecutive failures)".
        """
        with self._lock:
            if self._state is EndpointState.CLOSED:
                return
            now = self._control.clock()
            if self._state is EndpointState.OPEN and now >= self._open_until:
                self._set_state(EndpointState.HALF_OPEN)
            if self._state is EndpointState.HALF_OPEN and not self._probing:
                self._probing = True
                return
            next_try, failures = max(self._open_until - now, 0.0), self._failures
        self._raise_unreachable(next_try, failures)

    def _raise_unreachable(self, next_try: float, failures: int) -> None:
        """Raise the open breaker's error; ``next_try`` is in seconds from now."""
        raise EndpointUnavailableError(
            f"endpoint {self.key} unreachable, next try at "
            f"{_at(self._control.wall_clock() + next_try)} ({failures} consecutive failures)"
        )

    def reachable(self) -> None:
        """Record that the endpoint answered (closes the breaker)."""
        with self._lock:
            self._failures = 0
            self._probing = False
            if self._state is not EndpointState.CLOSED:
                log.info("endpoint %s answers again; circuit closed", self.key)
                self._set_state(EndpointState.CLOSED)

    def unreachable(self) -> None:
        """Record a request without an answer (opens the breaker at the threshold)."""
        control = self._control
        with self._lock:
            self._failures += 1
            probe_failed = self._state is EndpointState.HALF_OPEN
            self._probing = False
            if probe_failed or (
                self._state is EndpointState.CLOSED and self._failures >= control.failure_threshold
            ):
                self._open_until = control.clock() + control.cooldown_seconds
                if self._state is not EndpointState.OPEN:
                    log.warning(
                        "endpoint %s: %d consecutive failures; circuit open for %gs",
                        self.key,
                        self._failures,
                        control.cooldown_seconds,
                    )
                self._set_state(EndpointState.OPEN)

    def settled(self) -> None:
        """Record a request that neither reached nor missed the endpoint (ends a probe)."""
        with self._lock:
            self._probing = False

    def _set_state(self, state: EndpointState) -> None:
        """Change the state (the caller holds the lock) and tell the hook."""
        if state is self._state:
            return
        self._state = state
        hook = self._control.on_state
        if hook is not None:
            try:
                hook(self.key, state)
            except Exception:  # a metric must never break a call
                log.exception("endpoint state hook failed")

    # ------------------------------------------------------------------ logins

    def check_login(self, credential: str, limit: int | None = None) -> bool:
        """Raise when a login with ``credential`` must be held back; else admit it.

        Returns True when the admitted login took a place in the budget (its credentials are
        unproven): the caller must end it with `login_refused` or `login_ended`.

        Credentials that logged in successfully (and were not refused since) are never held
        back, except while the IPAM reports this address blocked. Others are held back for
        `FlowControl.login_retry_seconds` after they were refused, and while the endpoint
        refused `FlowControl.login_limit` logins within the window (whatever the
        credentials), so that the refusals of one endpoint stay within that budget.
        ``limit`` lowers that budget for this login (an IPAM that locks accounts sooner).
        A login that finds the budget held while a login of the same credential is in
        flight waits for that login's outcome (at most `LOGIN_WAIT_SECONDS`): pools that
        share credentials log in together at start-up, and the first success proves them.

        Raises
        ------
        AuthenticationFailedError
            Saying why and when the next try is.
        """
        control = self._control
        deadline = time.monotonic() + LOGIN_WAIT_SECONDS
        with self._lock:
            while True:
                now = control.clock()
                self._prune(now)
                wall = control.wall_clock()
                if now < self._blocked_until:
                    raise AuthenticationFailedError(
                        f"endpoint {self.key} blocked this address after too many failed logins; "
                        f"no login before {_at(wall + self._blocked_until - now)}"
                    )
                refused = self._last_refused.get(credential)
                succeeded = self._last_ok.get(credential)
                if succeeded is not None and (refused is None or succeeded > refused[0]):
                    return False  # these credentials work: never held back by others' failures
                if refused is not None and now - refused[0] < control.login_retry_seconds:
                    raise AuthenticationFailedError(
                        f"{refused[1]}; a refused login is not repeated for "
                        f"{control.login_retry_seconds:g}s: next try at "
                        f"{_at(wall + refused[0] + control.login_retry_seconds - now)}"
                    )
                count = len(self._refusals)
                budget = (
                    min(limit, control.login_limit) if limit is not None else control.login_limit
                )
                if count + self._pending < budget:
                    self._pending += 1
                    self._trying[credential] = self._trying.get(credential, 0) + 1
                    return True
                next_try = (
                    self._refusals[0] + control.login_window_seconds
                    if self._refusals
                    else now + control.login_retry_seconds  # only logins in flight hold it back
                )
                left = deadline - time.monotonic()
                if not self._trying.get(credential) or left <= 0:
                    break
                # The same credential is being tried: its outcome decides for this one too
                # (proven, or refused), so wait for it rather than fail.
                self._login_done.wait(left)
        cause = f"{refused[1]}; " if refused is not None else ""
        raise AuthenticationFailedError(
            f"{cause}logins held back: endpoint {self.key} refused {count} logins in the "
            f"last {control.login_window_seconds:g}s (the IPAM may block this address); "
            f"next try at {_at(wall + next_try - now)}"
        )

    def login_refused(
        self,
        credential: str,
        message: str,
        *,
        blocked_seconds: float = 0.0,
        admitted: bool = False,
    ) -> None:
        """Record a refused login (and, when the IPAM said so, that it blocks this address).

        ``admitted``: the login held a place in the budget (`check_login` returned True).
        ``blocked_seconds``: how long the IPAM now refuses every login from this address.
        """
        with self._lock:
            if admitted:
                self._pending = max(self._pending - 1, 0)
                self._ended(credential)
            now = self._control.clock()
            self._refusals.append(now)
            self._last_refused[credential] = (now, message)
            if blocked_seconds:
                self._blocked_until = max(self._blocked_until, now + blocked_seconds)

    def login_succeeded(self, credential: str) -> None:
        """Record a successful login (the credential is no longer held back)."""
        with self._lock:
            self._last_ok[credential] = self._control.clock()

    def login_ended(self, credential: str | None = None) -> None:
        """Give back the budget place of an admitted login that was not refused.

        ``credential``: the login's (`check_login` waits for the end of a login of the
        same credential in flight; record `login_succeeded` first when it succeeded).
        """
        with self._lock:
            self._pending = max(self._pending - 1, 0)
            if credential is not None:
                self._ended(credential)

    def _ended(self, credential: str) -> None:
        """Count a login of ``credential`` as no longer in flight (the caller holds the lock)."""
        left = self._trying.pop(credential, 0) - 1
        if left > 0:
            self._trying[credential] = left
        self._login_done.notify_all()

    def _prune(self, now: float) -> None:
        """Forget refusals older than the login window (the caller holds the lock)."""
        window = self._control.login_window_seconds
        while self._refusals and now - self._refusals[0] >= window:
            self._refusals.popleft()
        for credential, (at, _) in list(self._last_refused.items()):
            if now - at >= window:
                del self._last_refused[credential]

    # ------------------------------------------------------------------ exhaustion

    def pool_exhausted(self, pool: Key) -> None:
        """Record that ``pool`` (its subnets at this endpoint) was just found exhausted."""
        with self._lock:
            self._exhausted[pool] = self._control.clock()

    def pool_is_exhausted(self, pool: Key) -> bool:
        """Return True when ``pool`` was found exhausted within `FlowControl.exhausted_seconds`."""
        with self._lock:
            since = self._exhausted.get(pool)
            return since is not None and self._control.clock() - since < (
                self._control.exhausted_seconds
            )

    def pool_refilled(self, pool: Key) -> bool:
        """Forget that ``pool`` was exhausted; return True when it was remembered."""
        with self._lock:
            return self._exhausted.pop(pool, None) is not None

    def exhausted_pools(self) -> int:
        """Return how many pools are remembered as exhausted at this endpoint."""
        with self._lock:
            return len(self._exhausted)


class FlowControl:
    """Flow control of every IPAM endpoint of one operator, under one policy. Thread-safe.

    Built once per operator and given to every backend client and to the claims reconciler,
    so its state outlives pool, Secret and client changes. Endpoints are keyed by
    ``scheme://host:port`` (`endpoint_key`); every method taking an ``endpoint`` accepts any
    URL of it. Claims and pools are opaque hashable keys.

    The policy, per endpoint (`EndpointFlow` holds its state), in the order a claim's IPAM
    work meets it:

    1. **Exhaustion.** A pool found exhausted (`exhausted`) is not asked for a first-free
       address for ``exhausted_seconds`` (`is_exhausted`; its claims wait for an address);
       a release in the pool, or the pool gone, ends that at once (`refilled`). A request for
       a specific address is not held back.
    2. **Breaker.** Requests that get no answer (timeout, connection error, HTTP 502/504)
       count as failures; any other answer, a TLS failure included, resets the count.
       ``failure_threshold`` consecutive failures open the breaker for ``cooldown_seconds``:
       while it is open, no claim is admitted and no operation starts (`try_admit` and
       `EndpointFlow.operation` raise the breaker's "endpoint <url> unreachable, next try at
       <time>"), and no request is sent. After the cool-down exactly one request goes
       through as the probe (half-open), the others fail fast until it ends: an answer
       closes the breaker, no answer opens it for another cool-down. Requests stopped
       before they reached the network (an invalid URL) end a probe without a verdict.
    3. **Claims.** At most ``limit`` claims of the endpoint do IPAM work at once
       (`try_admit`, `held`); others wait in arrival order, cost no worker, and are queued
       through ``wake`` one by one when a place is kept for them (a reservation: nobody
       jumps ahead of a woken claim; one that no longer needs the endpoint gives its place
       to the next, `settle`). The limit adapts by AIMD, as TCP's congestion window does
       (https://www.rfc-editor.org/rfc/rfc5681): it starts at ``max_concurrent``; a claim's
       work that ends in `backends.errors.BackendUnavailableError` (timeout, connection
       error, 429/5xx, breaker open, endpoint busy) halves it, at most once per window
       (only work admitted after the last decrease decreases it again); ``limit`` successes
       raise it by one, never above ``max_concurrent`` nor below 1; other errors (refused
       login, exhausted pool) leave it.
    4. **Operations.** One backend operation (its retries and re-logins included) holds one
       of ``max_concurrent`` slots of the endpoint (`EndpointFlow.slot`); one that gets no
       slot within ``slot_wait_seconds`` fails with "endpoint <url> busy", so a hung
       endpoint holds at most that many threads.
    5. **Logins.** A credential (user and password) that logged in and was not refused
       since is never held back by others' refusals. A refused one is not tried again for
       ``login_retry_seconds``. Unproven credentials are tried only while the endpoint's
       refusals in the last ``login_window_seconds`` plus the unproven logins in flight stay
       below ``login_limit`` (a login of a credential already in flight waits for its
       outcome instead), so that the IPAM does not block the operator's address (phpIPAM
       blocks an address after repeated failed logins, ``User::block_*`` in
       https://github.com/phpipam/phpipam/blob/master/functions/classes/class.User.php); an
       IPAM that says it blocks the address holds back every login until then
       (`EndpointFlow.check_login`).
    6. **Writes.** Every request that is not a read (GET, HEAD, OPTIONS) passes ``fence``
       first, in the calling thread; it raises to keep the request from being sent.

    Why no library does a part: pybreaker (https://github.com/danielfm/pybreaker) holds its
    lock for the whole guarded call (concurrent requests to one endpoint would run one at a
    time), counts failures from exceptions (here a 502 answer is a failure and a TLS error
    is not), has no single probe while half-open, and reads the wall clock
    (``datetime.now``), which tests cannot replace; aiobreaker and purgatory are for
    asyncio, and the backends run in threads.
    limits (https://limits.readthedocs.io/) would count the refusals of the login budget
    only (a deque here), with its own clock, and none of the per-credential rules;
    aiolimiter is an asyncio leaky bucket (a rate, where this limits concurrency). No
    maintained Python library implements an adaptive concurrency limit with a line of
    parked work-queue keys.

    Parameters
    ----------
    failure_threshold:
        Consecutive requests without an answer that open the breaker (>= 1).
    cooldown_seconds:
        How long an open breaker refuses before its probe.
    max_concurrent:
        Operations one endpoint may run at once, and the most claims it may have in flight
        (>= 1).
    slot_wait_seconds:
        How long an operation waits for a slot before "endpoint <url> busy".
    login_limit, login_window_seconds:
        The budget of refused logins per endpoint (>= 1; 5 per 300 s).
    login_retry_seconds:
        How long a refused credential is not tried again.
    exhausted_seconds:
        How long a pool found exhausted is not asked again for a first-free address.
    wake:
        Queues a claim's key when a place is kept for it (the work queue's ``add``; it must
        run the key once more when the key is being processed); called without the lock.
    on_limit:
        Called with ``(endpoint, limit)`` when an endpoint's claim limit changes and when
        it is first used; it must not call back into this object.
    on_state:
        Called with ``(endpoint, EndpointState)`` when a breaker changes state.
    on_request:
        Called with a `RequestRecord` after each HTTP request.
    fence:
        Called before each request that is not a read (see 6); None: every request is sent.
    clock, wall_clock:
        Monotonic and POSIX time in seconds (tests pass fakes).

    The hooks are attributes and may be set after construction. A hook's errors are
    logged, never raised.

    Raises
    ------
    ValueError
        When ``failure_threshold``, ``max_concurrent`` or ``login_limit`` is below 1.
    """

    def __init__(
        self,
        *,
        failure_threshold: int = 5,
        cooldown_seconds: float = 10.0,
        max_concurrent: int = 4,
        slot_wait_seconds: float = 1.0,
        login_limit: int = 5,
        login_window_seconds: float = 300.0,
        login_retry_seconds: float = 60.0,
        exhausted_seconds: float = 5.0,
        wake: Callable[[Key], None] | None = None,
        on_limit: Callable[[str, int], None] | None = None,
        on_state: Callable[[str, EndpointState], None] | None = None,
        on_request: Callable[[RequestRecord], None] | None = None,
        fence: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if failure_threshold < 1 or max_concurrent < 1 or login_limit < 1:
            raise ValueError("failure_threshold, max_concurrent and login_limit must be >= 1")
        self.failure_threshold = failure_threshold
        self.cooldown_seconds = cooldown_seconds
        self.max_concurrent = max_concurrent
        self.slot_wait_seconds = slot_wait_seconds
        self.login_limit = login_limit
        self.login_window_seconds = login_window_seconds
        self.login_retry_seconds = login_retry_seconds
        self.exhausted_seconds = exhausted_seconds
        self.wake = wake
        self.on_limit = on_limit
        self.on_state = on_state
        self.on_request = on_request
        self.fence = fence
        self.clock = clock
        self.wall_clock = wall_clock
        self._lock = threading.Lock()  # the endpoints, every line, and `_lines_of`
        self._endpoints: dict[str, EndpointFlow] = {}
        self._lines_of: dict[Key, set[str]] = {}  # waiting or reserved keys -> endpoints

    # -- endpoints -------------------------------------------------------------------------------

    def endpoint(self, url: str) -> EndpointFlow:
        """Return the `EndpointFlow` of ``url`` (made on first use)."""
        key = endpoint_key(url)
        with self._lock:
            return self._flow(key)

    def _flow(self, key: str) -> EndpointFlow:
        """Return the flow of an endpoint key, made on first use (lock held)."""
        found = self._endpoints.get(key)
        if found is None:
            found = self._endpoints[key] = EndpointFlow(key, self)
        return found

    def states(self) -> dict[str, EndpointState]:
        """Return the breaker state of every endpoint used so far."""
        with self._lock:
            endpoints = list(self._endpoints.values())
        return {e.key: e.state for e in endpoints}

    def record(self, record: RequestRecord) -> None:
        """Pass a request to the metrics hook (errors of the hook are logged, not raised)."""
        if self.on_request is not None:
            try:
                self.on_request(record)
            except Exception:
                log.exception("request metrics hook failed")

    def sizes(self) -> dict[str, int]:
        """Return the sizes of the state kept, by name (for benchmarks).

        ``endpoints``: endpoints used so far, and ``lines`` those with a line of claims
        (both bounded by the pools' configuration, not by claims); ``keys``: claims waiting
        or reserved somewhere; ``exhausted``: pools remembered as exhausted.
        """
        with self._lock:
            flows = list(self._endpoints.values())
            lines = sum(1 for f in flows if f.line is not None)
            keys = len(self._lines_of)
        return {
            "endpoints": len(flows),
            "lines": lines,
            "keys": keys,
            "exhausted": sum(f.exhausted_pools() for f in flows),
        }

    # -- exhaustion (policy 1) -------------------------------------------------------------------

    def exhausted(self, endpoint: str, pool: Key) -> None:
        """Record that ``pool`` at ``endpoint`` was just found exhausted."""
        self.endpoint(endpoint).pool_exhausted(pool)

    def is_exhausted(self, endpoint: str, pool: Key) -> bool:
        """Return True when ``pool`` at ``endpoint`` was found exhausted within the hold time."""
        return self.endpoint(endpoint).pool_is_exhausted(pool)

    def refilled(self, pool: Key) -> None:
        """Record that ``pool`` may have a free address (a release, or the pool is gone)."""
        with self._lock:
            flows = list(self._endpoints.values())
        for flow in flows:
            flow.pool_refilled(pool)

    # -- claims (policy 3) -----------------------------------------------------------------------

    def limit(self, endpoint: str) -> int:
        """Return the claims ``endpoint`` may have in flight now (``max_concurrent`` if unused)."""
        with self._lock:
            line = self._line(endpoint)
            return self.max_concurrent if line is None else line.limit

    def in_flight(self, endpoint: str) -> int:
        """Return how many claims of ``endpoint`` are admitted and not finished."""
        with self._lock:
            line = self._line(endpoint)
            return 0 if line is None else len(line.in_flight)

    def waiting(self, endpoint: str) -> list[Key]:
        """Return the keys refused by ``endpoint`` and not yet woken, oldest first."""
        with self._lock:
            line = self._line(endpoint)
            return [] if line is None else list(line.waiting)

    def try_admit(self, endpoint: str, key: Key) -> bool:
        """Admit ``key``'s IPAM work on ``endpoint``, or record it as waiting.

        Returns
        -------
        bool
            True: the claim may call the IPAM now and must then call `finish` (use `held`).
            False: the endpoint is full; the claim is remembered (in arrival order) and will
            be queued through ``wake`` when a place is kept for it: it should park under
            `endpoint_token` and call `settle` when its pass ends.

        Raises
        ------
        EndpointUnavailableError
            The endpoint's breaker is open (policy 2): nothing is taken, the claim keeps
            any place it had in line.
        """
        endpoint = endpoint_key(endpoint)
        self.endpoint(endpoint).refuse_while_open()
        with self._lock:
            flow = self._flow(endpoint)
            line = flow.line
            if line is None:
                line = flow.line = _Line(limit=self.max_concurrent)
                self._tell(endpoint, line.limit)  # first use: the gauge starts at the max
            if key in line.in_flight:  # one worker per key: never count it twice
                return True
            if key in line.reserved:  # woken for this place
                del line.reserved[key]
            elif line.room() > 0:
                # Nobody waits while there is room (every change of room hands it out).
                line.waiting.pop(key, None)
            else:
                line.waiting.setdefault(key, None)
                self._lines_of.setdefault(key, set()).add(endpoint)
                return False
            self._forget(key, endpoint, line)
            line.in_flight[key] = line.epoch
            return True

    def wait_if_full(self, endpoint: str, key: Key) -> bool:
        """Record ``key`` as waiting and return True when ``endpoint`` has no room for it now.

        A peek for the writes a claim makes before its IPAM work (its finalizer): a claim
        that `try_admit` would refuse parks before writing anything. Takes no place: with
        room, or a place kept for ``key``, or ``key`` in flight, returns False and
        `try_admit` decides at the IPAM call. After True the claim parks exactly as after a
        refused `try_admit`.
        """
        endpoint = endpoint_key(endpoint)
        with self._lock:
            line = self._line(endpoint)
            if line is None or key in line.in_flight or key in line.reserved:
                return False
            if line.room() > 0:
                return False
            line.waiting.setdefault(key, None)
            self._lines_of.setdefault(key, set()).add(endpoint)
            return True

    def finish(self, endpoint: str, key: Key, error: BaseException | None = None) -> None:
        """End ``key``'s admitted IPAM work on ``endpoint``; adapt the limit; wake the next.

        ``error``: what the work raised (None: it succeeded); it adapts the limit (policy 3).
        The place is released, and kept for the longest-waiting claims, before they are
        queued (``wake`` is called after the lock is let go). A key not in flight is ignored.
        """
        endpoint = endpoint_key(endpoint)
        with self._lock:
            line = self._line(endpoint)
            if line is None or key not in line.in_flight:
                return
            before = line.limit
            line.adapt(line.in_flight.pop(key), error, self.max_concurrent)
            after = line.limit
            woken = line.hand_out()
        if after != before:
            log.info("endpoint %s: %d claims may be in flight (was %d)", endpoint, after, before)
            self._tell(endpoint, after)
        self._wake_all(woken)

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
            endpoints = self._lines_of.get(key)
            if not endpoints:
                return
            woken: list[Key] = []
            for endpoint in list(endpoints):
                if endpoint_token(endpoint) in waits_on:
                    continue
                line = self._line(endpoint)
                if line is not None:
                    line.waiting.pop(key, None)
                    line.reserved.pop(key, None)
                    woken += line.hand_out()
                endpoints.discard(endpoint)
            if not endpoints:
                self._lines_of.pop(key, None)
        self._wake_all(woken)

    def _line(self, endpoint: str) -> _Line | None:
        """Return the line of claims of an endpoint key, None if unused (lock held)."""
        flow = self._endpoints.get(endpoint)
        return None if flow is None else flow.line

    def _forget(self, key: Key, endpoint: str, line: _Line) -> None:
        """Drop ``endpoint`` from what ``key`` waits for when it neither waits nor is reserved."""
        if key in line.waiting or key in line.reserved:
            return
        endpoints = self._lines_of.get(key)
        if endpoints is not None:
            endpoints.discard(endpoint)
            if not endpoints:
                del self._lines_of[key]

    def _wake_all(self, keys: list[Key]) -> None:
        """Queue ``keys`` through ``wake`` (nothing when there is no hook)."""
        if self.wake is None:
            return
        for key in keys:
            self.wake(key)

    def _tell(self, endpoint: str, limit: int) -> None:
        """Tell the limit hook an endpoint's new limit (its errors are logged)."""
        if self.on_limit is None:
            return
        try:
            self.on_limit(endpoint, limit)
        except Exception:  # a metric must never break a claim
            log.exception("endpoint limit hook failed")
