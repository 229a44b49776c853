"""Flow control per IPAM server: one `EndpointFlow` per ``scheme://host:port``.

Three parts per server, nothing else: a circuit breaker, one concurrency limit fed only by
the server's own failures (AIMD), and the login budget. `backends.transport.Transport` sends
through it; the operator's claims reconciler takes places in the limit before a claim's IPAM
work (`FlowControl.try_admit`). Which claims wait for a place and which is woken when one
frees is the operator's runtime (`bridge.runtime.waits`): this module keeps no keys of
claims or pools and imports nothing of Kubernetes or the operator.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from urllib.parse import urlsplit

from backends.errors import AuthenticationFailedError, EndpointUnavailableError
from backends.retry import time_left

__all__ = ["EndpointFlow", "EndpointState", "FlowControl", "RequestRecord", "endpoint_key"]

log = logging.getLogger(__name__)

#: Seconds a login waits for a login of the same credential in flight before it is held
#: back (`EndpointFlow.check_login`).
LOGIN_WAIT_SECONDS = 30.0


@functools.lru_cache(maxsize=1024)
def endpoint_key(url: str) -> str:
    """Return ``scheme://host:port`` of ``url`` (the default port made explicit).

    Idempotent: the key of a key is itself. Memoised (a few pools' URLs, asked for on every
    claim's pass).

    Raises
    ------
    ValueError
        When the URL's port is not a number from 0 to 65535 (`urllib.parse.urlsplit`).
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


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


class EndpointFlow:
    """The flow control of one IPAM endpoint (``scheme://host:port``); thread-safe.

    Holds the endpoint's circuit breaker, its concurrency limit and its login budget (the
    policy is `FlowControl`'s). Made by `FlowControl.endpoint`.
    """

    def __init__(self, key: str, control: FlowControl) -> None:
        self.key = key
        self._control = control
        self._lock = threading.Lock()
        # Told when a login of an unproven credential ends (`check_login` waits for it).
        self._login_done = threading.Condition(self._lock)
        self._place_free = threading.Condition(self._lock)  # told when a place frees
        self._held = threading.local()  # depth: places this thread holds; epoch: its window
        self._state = EndpointState.CLOSED
        self._failures = 0
        self._open_until = 0.0
        self._probing = False
        self._limit = control.max_concurrent
        self._credit = 0  # answers since the limit last changed
        self._epoch = 0  # decreases so far: work placed before the last one cannot decrease
        self.in_flight = 0
        # Login budget: times of refused logins, and per credential its last refusal/success.
        self._refusals: collections.deque[float] = collections.deque()
        self._last_refused: dict[str, tuple[float, str]] = {}
        self._last_ok: dict[str, float] = {}
        # Logins of unproven credentials in flight: they may all be refused, so they count
        # against the budget until they end (concurrent logins could overrun it otherwise).
        self._pending = 0
        self._trying: dict[str, int] = {}  # those logins in flight, by credential
        self._blocked_until = 0.0

    @property
    def state(self) -> EndpointState:
        """The breaker's state (an open breaker past its cool-down still reads OPEN)."""
        with self._lock:
            return self._state

    @property
    def limit(self) -> int:
        """The places (works in flight at once) the endpoint has now: 1 to ``max_concurrent``."""
        with self._lock:
            return self._limit

    def room(self) -> int:
        """Return the places free now (negative after a decrease below those in flight)."""
        with self._lock:
            return self._limit - self.in_flight

    # ------------------------------------------------------------------ the limit

    def acquire(self, wait: float = 0.0) -> bool:
        """Take a place for the calling thread's work; True when taken (re-entrant per thread).

        ``wait``: seconds to wait for a place to free (0: do not wait). A thread that holds a
        place already takes none more. Every True must be ended by `release`.
        """
        depth = getattr(self._held, "depth", 0)
        if depth:
            self._held.depth = depth + 1
            return True
        with self._lock:
            if not self._place_free.wait_for(lambda: self.in_flight < self._limit, wait):
                return False
            self.in_flight += 1
            self._held.epoch = self._epoch
        self._held.depth = 1
        return True

    def release(self) -> None:
        """Give back the calling thread's place (see `acquire`); tells ``on_free``."""
        self._held.depth -= 1
        if self._held.depth:
            return
        with self._lock:
            self.in_flight -= 1
            self._place_free.notify()
        self._control._hook(self._control.on_free, self.key)

    @contextmanager
    def operation(self) -> Iterator[None]:
        """Run one operation in a place: refused while the breaker is open.

        A thread that holds a place (an admitted claim) runs in it; another waits for one
        at most `FlowControl.slot_wait_seconds` (cut to the time left of the current
        `backends.retry.deadline`), so a hung endpoint holds at most its limit of threads.

        Raises
        ------
        EndpointUnavailableError
            "endpoint <url> unreachable, next try at <time>" while the breaker is open
            within its cool-down; "endpoint <url> busy" when no place frees in time. Neither
            changes the limit: only the endpoint's answers do (`congested`, `answered`).
        """
        self.refuse_while_open()
        wait = self._control.slot_wait_seconds
        left = time_left()
        if left is not None:
            wait = max(0.0, min(wait, left))
        if not self.acquire(wait):
            raise EndpointUnavailableError(
                f"endpoint {self.key} busy: {self.limit} calls to it are "
                f"in flight (slow or hung?); not waiting longer than {wait:g}s"
            )
        try:
            yield
        finally:
            self.release()

    def congested(self) -> None:
        """Record a timeout, connection error, HTTP 429 or 5xx: halve the limit (AIMD).

        At most once per window: a failure of work placed before the last decrease does not
        decrease the limit again.
        """
        held = getattr(self._held, "depth", 0)
        with self._lock:
            epoch = self._held.epoch if held else self._epoch
            if epoch != self._epoch or self._limit == 1:
                return
            before, self._limit = self._limit, max(1, self._limit // 2)
            after = self._limit
            self._credit = 0
            self._epoch += 1
        log.info("endpoint %s: %d calls may be in flight (was %d)", self.key, after, before)
        self._control._hook(self._control.on_limit, self.key, after)

    def answered(self) -> None:
        """Record any other answer: ``limit`` of them raise the limit by one (to the max)."""
        with self._lock:
            if self._limit >= self._control.max_concurrent:
                return
            self._credit += 1
            if self._credit < self._limit:
                return
            self._limit += 1
            self._credit = 0
            self._place_free.notify()
            limit = self._limit
        self._control._hook(self._control.on_limit, self.key, limit)
        self._control._hook(self._control.on_free, self.key)

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
        self._control._hook(self._control.on_state, self.key, state)

    # ------------------------------------------------------------------ logins

    def check_login(self, credential: str, limit: int | None = None) -> bool:
        """Raise when a login with ``credential`` must be held back; else admit it.

        The rules are `FlowControl`'s (3. Logins); ``limit`` lowers the budget for this login
        (an IPAM that locks accounts sooner). A login that finds the budget held while a login
        of the same credential is in flight waits for its outcome (at most
        `LOGIN_WAIT_SECONDS`): pools that share credentials log in together at start-up.

        Returns True when the admitted login took a place in the budget (its credentials are
        unproven): the caller must end it with `login_refused` or `login_ended`.

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

    def login_ended(self, credential: str) -> None:
        """Give back the budget place of an admitted login of ``credential`` not refused.

        Record `login_succeeded` first when it succeeded: logins of the same credential
        waiting in `check_login` then go through.
        """
        with self._lock:
            self._pending = max(self._pending - 1, 0)
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


class FlowControl:
    """Flow control of every IPAM endpoint of one operator, under one policy. Thread-safe.

    Built once per operator and given to every backend client and to the claims reconciler,
    so its state outlives pool, Secret and client changes. Endpoints are keyed by
    ``scheme://host:port`` (`endpoint_key`); every method taking an ``endpoint`` accepts any
    URL of it. The policy, per endpoint (`EndpointFlow` holds its state):

    1. **Breaker.** Requests that get no answer (timeout, connection error, HTTP 502/504)
       count as failures; any other answer, a TLS failure included, resets the count.
       ``failure_threshold`` consecutive failures open the breaker for ``cooldown_seconds``:
       while it is open, no claim is admitted, no operation starts and no request is sent
       ("endpoint <url> unreachable, next try at <time>"). After the cool-down exactly one
       request goes through as the probe (half-open), the others fail fast until it ends:
       an answer closes the breaker, no answer opens it for another cool-down. Requests
       stopped before they reached the network (an invalid URL) end a probe without a verdict.
    2. **One limit.** At most ``limit`` works run against the endpoint at once: a claim's
       IPAM work (`try_admit`, which never waits: a claim refused waits parked in the
       operator's runtime and is woken through ``on_free``) or an operation of any other
       caller (`EndpointFlow.operation`, which waits at most ``slot_wait_seconds``). The
       limit adapts by AIMD, as TCP's congestion window does
       (https://www.rfc-editor.org/rfc/rfc5681), fed only by the endpoint's answers: it
       starts at ``max_concurrent``; a timeout, connection error, HTTP 429 or 5xx halves it
       (`backends.transport.Transport`'s ``overloaded``: not phpIPAM's 500 refusals of one
       request), at most once per window (only work placed after the last decrease decreases it
       again); ``limit`` other answers raise it by one, never above ``max_concurrent`` nor
       below 1. Refusals of this object (breaker open, busy) never change it.
    3. **Logins.** A credential (user and password) that logged in and was not refused
       since is never held back by others' refusals. A refused one is not tried again for
       ``login_retry_seconds``. Unproven credentials are tried only while the endpoint's
       refusals in the last ``login_window_seconds`` plus the unproven logins in flight stay
       below ``login_limit`` (a login of a credential already in flight waits for its
       outcome instead), so that the IPAM does not block the operator's address (phpIPAM
       blocks an address after repeated failed logins, ``User::block_*`` in
       https://github.com/phpipam/phpipam/blob/master/functions/classes/class.User.php); an
       IPAM that says it blocks the address holds back every login until then
       (`EndpointFlow.check_login`).
    4. **Writes.** Every request that is not a read (GET, HEAD, OPTIONS) passes ``fence``
       first, in the calling thread; it raises to keep the request from being sent.

    No library does a part: pybreaker holds its lock for the whole guarded call, counts
    failures from exceptions (a 502 answer is a failure here, a TLS error is not), has no
    single half-open probe and reads the wall clock; aiobreaker, purgatory and aiolimiter are
    for asyncio; limits and aiolimiter limit rates, not concurrency, and none adapts a limit.

    Parameters
    ----------
    failure_threshold:
        Consecutive requests without an answer that open the breaker (>= 1).
    cooldown_seconds:
        How long an open breaker refuses before its probe.
    max_concurrent:
        The most works one endpoint may have in flight at once (>= 1).
    slot_wait_seconds:
        How long an operation outside a claim's place waits for one before "busy".
    login_limit, login_window_seconds:
        The budget of refused logins per endpoint (>= 1; 5 per 300 s).
    login_retry_seconds:
        How long a refused credential is not tried again.
    on_free:
        Called with the endpoint key when a place may have freed (a work ended, the limit
        grew); without a lock held.
    on_limit:
        Called with ``(endpoint, limit)`` when an endpoint's limit changes and when it is
        first used.
    on_state:
        Called with ``(endpoint, EndpointState)`` when a breaker changes state.
    on_request:
        Called with a `RequestRecord` after each HTTP request.
    fence:
        Called before each request that is not a read (see 4); None: every request is sent.
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
        on_free: Callable[[str], None] | None = None,
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
        self.on_free = on_free
        self.on_limit = on_limit
        self.on_state = on_state
        self.on_request = on_request
        self.fence = fence
        self.clock = clock
        self.wall_clock = wall_clock
        self._lock = threading.Lock()
        self._endpoints: dict[str, EndpointFlow] = {}

    def endpoint(self, url: str) -> EndpointFlow:
        """Return the `EndpointFlow` of ``url`` (made on first use; tells ``on_limit``)."""
        key = endpoint_key(url)
        with self._lock:
            found = self._endpoints.get(key)
            if found is not None:
                return found
            found = self._endpoints[key] = EndpointFlow(key, self)
        self._hook(self.on_limit, key, found.limit)  # first use: the gauge starts at the max
        return found

    def states(self) -> dict[str, EndpointState]:
        """Return the breaker state of every endpoint used so far."""
        with self._lock:
            endpoints = list(self._endpoints.values())
        return {e.key: e.state for e in endpoints}

    def sizes(self) -> dict[str, int]:
        """Return the sizes of the state kept, by name (for benchmarks).

        ``endpoints``: endpoints used so far (bounded by the pools' configuration);
        ``in_flight``: works holding a place now, all endpoints together.
        """
        with self._lock:
            flows = list(self._endpoints.values())
        return {"endpoints": len(flows), "in_flight": sum(f.in_flight for f in flows)}

    def room(self, endpoint: str) -> int:
        """Return the places of ``endpoint`` free now (negative after a decrease)."""
        return self.endpoint(endpoint).room()

    def try_admit(self, endpoint: str) -> bool:
        """Take a place at ``endpoint`` for the calling thread's IPAM work, without waiting.

        Returns True when taken: the caller must end it with `release` (use `held`). False:
        the endpoint is full; the caller waits (the runtime's parking) for ``on_free``.

        Raises
        ------
        EndpointUnavailableError
            The endpoint's breaker is open (policy 1): nothing is taken.
        """
        flow = self.endpoint(endpoint)
        flow.refuse_while_open()
        return flow.acquire()

    @contextmanager
    def held(self, endpoint: str) -> Iterator[None]:
        """Run the enclosed work in the place `try_admit` took, then give it back."""
        try:
            yield
        finally:
            self.endpoint(endpoint).release()

    def record(self, record: RequestRecord) -> None:
        """Pass a request to the metrics hook (errors of the hook are logged, not raised)."""
        self._hook(self.on_request, record)

    @staticmethod
    def _hook(hook: Callable[..., object] | None, *args: object) -> None:
        """Call ``hook`` with ``args`` (if set); its errors are logged, never raised."""
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:  # a metric or a wake-up must never break a call
            log.exception("flow control hook %r failed", hook)
