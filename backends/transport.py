"""The HTTP layer both IPAM clients share: session, TLS, timeouts, errors, endpoint isolation.

`Transport` is what `backends.phpipam` and `backends.infoblox` send through; they keep only
their API's semantics. It owns:

- the `requests.Session`, with ``User-Agent: ipam-bridge/<version>`` (given by the caller:
  backends never import ``bridge``), no ``~/.netrc`` credentials, and redirects refused (a
  3xx is an `InvalidRequestError` naming its target: a redirect would carry credentials to
  wherever it points); what requests takes from the environment (proxies, ``no_proxy``,
  ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``) is read once, when the session is made, not
  again for every request (`environment_settings`);
- TLS: verification on by default; a CA bundle given as PEM text is loaded into an
  `ssl.SSLContext` mounted with an `HTTPAdapter` (no temporary file);
- timeouts: connect and read timeout per request, both cut to the time left of the
  operation's `backends.retry.deadline`, and no request once it is used up;
- the mapping of transport failures to `backends.errors` (timeouts and connection errors:
  `BackendUnavailableError`; TLS: `TLSVerificationError`; 429/5xx: `status_error`);
- `basic_auth`: HTTP Basic with UTF-8 credentials (requests would use Latin-1);
- per-endpoint isolation through an `EndpointRegistry` (one per operator): a circuit
  breaker, a limit on concurrent operations, and the budget of refused logins;
- a hook for request metrics (`EndpointRegistry.on_request`, `EndpointRegistry.on_state`);
- a fence (`EndpointRegistry.fence`): called in the calling thread before every request that
  is not a read (not GET, HEAD or OPTIONS); it raises to keep the request from being sent
  (the operator's replica that lost its leader Lease must not write).
"""

from __future__ import annotations

import collections
import hashlib
import http.cookiejar
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from importlib import metadata
from typing import Any, Final, Protocol, TypeVar
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.auth import AuthBase, HTTPBasicAuth

from backends.errors import (
    AuthenticationFailedError,
    BackendUnavailableError,
    EndpointUnavailableError,
    InvalidRequestError,
    TLSVerificationError,
    tls_failure,
)
from backends.retry import RetryPolicy, deadline, time_left

__all__ = [
    "NO_AUTH",
    "ClientSettings",
    "Endpoint",
    "EndpointRegistry",
    "EndpointState",
    "RequestRecord",
    "Transport",
    "TransportConfig",
    "basic_auth",
    "credential_id",
    "default_user_agent",
    "endpoint_key",
    "ssl_context_from_pem",
    "status_error",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_MESSAGE_MAX_CHARS: Final = 200
#: Below this many seconds left, a request is not started (it could not get an answer).
_MIN_REQUEST_SECONDS: Final = 0.05
#: Methods that change nothing: sent without asking the fence.
_READ_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
#: Answers of a proxy whose upstream (the IPAM) did not answer: count as unreachable.
_GATEWAY_FAILURES: Final = frozenset({502, 504})


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


def endpoint_key(url: str) -> str:
    """Return ``scheme://host:port`` of ``url`` (the default port made explicit)."""
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


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_MAX_CHARS else text[: _MESSAGE_MAX_CHARS - 3] + "..."


class Endpoint:
    """Breaker, concurrency slots and login budget of one ``scheme://host:port``.

    Made by `EndpointRegistry.endpoint`; thread-safe.
    """

    def __init__(self, key: str, registry: EndpointRegistry) -> None:
        self.key = key
        self._registry = registry
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(registry.max_concurrent)
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
        self._blocked_until = 0.0

    @property
    def state(self) -> EndpointState:
        """The breaker's state (an open breaker past its cool-down still reads OPEN)."""
        with self._lock:
            return self._state

    # ------------------------------------------------------------------ slots

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one of the endpoint's slots for an operation (re-entrant per thread).

        Raises
        ------
        EndpointUnavailableError
            "endpoint <url> busy" when no slot frees within the registry's slot wait (cut
            to the time left of the current deadline).
        """
        depth = getattr(self._held, "depth", 0)
        if depth:
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth -= 1
            return
        wait = self._registry.slot_wait_seconds
        left = time_left()
        if left is not None:
            wait = max(0.0, min(wait, left))
        if not self._slots.acquire(timeout=wait):
            raise EndpointUnavailableError(
                f"endpoint {self.key} busy: {self._registry.max_concurrent} calls to it are "
                f"in flight (slow or hung?); not waiting longer than {wait:g}s"
            )
        self._held.depth = 1
        try:
            yield
        finally:
            self._held.depth = 0
            self._slots.release()

    # ------------------------------------------------------------------ breaker

    def admit(self) -> None:
        """Let a request through, or fail fast while the breaker is open.

        After the cool-down one request goes through as the probe (half-open); others
        fail fast until its outcome is known.

        Raises
        ------
        EndpointUnavailableError
            "endpoint <url> unreachable, next try at <time>".
        """
        registry = self._registry
        with self._lock:
            if self._state is EndpointState.CLOSED:
                return
            now = registry.clock()
            if self._state is EndpointState.OPEN and now >= self._open_until:
                self._set_state(EndpointState.HALF_OPEN)
            if self._state is EndpointState.HALF_OPEN and not self._probing:
                self._probing = True
                return
            next_try = max(self._open_until - now, 0.0)
            failures = self._failures
        raise EndpointUnavailableError(
            f"endpoint {self.key} unreachable, next try at "
            f"{_at(registry.wall_clock() + next_try)} ({failures} consecutive failures)"
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
        registry = self._registry
        with self._lock:
            self._failures += 1
            probe_failed = self._state is EndpointState.HALF_OPEN
            self._probing = False
            if probe_failed or (
                self._state is EndpointState.CLOSED and self._failures >= registry.failure_threshold
            ):
                self._open_until = registry.clock() + registry.cooldown_seconds
                if self._state is not EndpointState.OPEN:
                    log.warning(
                        "endpoint %s: %d consecutive failures; circuit open for %gs",
                        self.key,
                        self._failures,
                        registry.cooldown_seconds,
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
        hook = self._registry.on_state
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
        `EndpointRegistry.login_retry_seconds` after they were refused, and while the
        endpoint refused `EndpointRegistry.login_limit` logins within the window (whatever
        the credentials), so that the refusals of one endpoint stay within that budget.
        ``limit`` lowers that budget for this login (an IPAM that locks accounts sooner).

        Raises
        ------
        AuthenticationFailedError
            Saying why and when the next try is.
        """
        registry = self._registry
        with self._lock:
            now = registry.clock()
            self._prune(now)
            wall = registry.wall_clock()
            if now < self._blocked_until:
                raise AuthenticationFailedError(
                    f"endpoint {self.key} blocked this address after too many failed logins; "
                    f"no login before {_at(wall + self._blocked_until - now)}"
                )
            refused = self._last_refused.get(credential)
            succeeded = self._last_ok.get(credential)
            if succeeded is not None and (refused is None or succeeded > refused[0]):
                return False  # these credentials work: never held back by others' failures
            if refused is not None and now - refused[0] < registry.login_retry_seconds:
                raise AuthenticationFailedError(
                    f"{refused[1]}; a refused login is not repeated for "
                    f"{registry.login_retry_seconds:g}s: next try at "
                    f"{_at(wall + refused[0] + registry.login_retry_seconds - now)}"
                )
            count = len(self._refusals)
            budget = min(limit, registry.login_limit) if limit is not None else registry.login_limit
            if count + self._pending < budget:
                self._pending += 1
                return True
            next_try = (
                self._refusals[0] + registry.login_window_seconds
                if self._refusals
                else now + registry.login_retry_seconds  # only logins in flight hold it back
            )
        cause = f"{refused[1]}; " if refused is not None else ""
        raise AuthenticationFailedError(
            f"{cause}logins held back: endpoint {self.key} refused {count} logins in the "
            f"last {registry.login_window_seconds:g}s (the IPAM may block this address); "
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
        """
        with self._lock:
            if admitted:
                self._pending = max(self._pending - 1, 0)
            now = self._registry.clock()
            self._refusals.append(now)
            self._last_refused[credential] = (now, message)
            if blocked_seconds:
                self._blocked_until = max(self._blocked_until, now + blocked_seconds)

    def login_succeeded(self, credential: str) -> None:
        """Record a successful login (the credential is no longer held back)."""
        with self._lock:
            self._last_ok[credential] = self._registry.clock()

    def login_ended(self) -> None:
        """Give back the budget place of an admitted login that was not refused."""
        with self._lock:
            self._pending = max(self._pending - 1, 0)

    def _prune(self, now: float) -> None:
        window = self._registry.login_window_seconds
        while self._refusals and now - self._refusals[0] >= window:
            self._refusals.popleft()
        for credential, (at, _) in list(self._last_refused.items()):
            if now - at >= window:
                del self._last_refused[credential]


class EndpointRegistry:
    """Per-endpoint isolation, shared by every backend of one operator.

    Built once per operator (``context.Context.endpoints``) and given to each backend
    at build time, so breaker state and login budget outlive pool, Secret and backend
    changes. Endpoints are keyed by ``scheme://host:port`` (`endpoint_key`).

    Parameters
    ----------
    failure_threshold:
        Consecutive requests without an answer (timeout, connection error, 502/504) after
        which the breaker opens.
    cooldown_seconds:
        How long an open breaker fails calls fast before one probe request goes through.
    max_concurrent:
        Operations one endpoint may run at once (each holds a worker).
    slot_wait_seconds:
        How long an operation waits for a slot before it fails with "endpoint <url> busy".
    login_limit, login_window_seconds:
        The budget of refused logins per endpoint (see `Endpoint.check_login`); phpIPAM
        blocks an address after more than 10 failed logins in 5 minutes.
    login_retry_seconds:
        How long a refused credential (user and password) is not tried again.
    on_state:
        Called with ``(endpoint, EndpointState)`` when a breaker changes state.
    on_request:
        Called with a `RequestRecord` after each HTTP request.
    fence:
        Called before each request that is not a read; raises to refuse it (the request is
        not sent, the exception propagates unchanged). None: every request is sent.
    clock, wall_clock:
        Monotonic and POSIX time (tests pass fakes).
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
        self.on_state = on_state
        self.on_request = on_request
        self.fence = fence
        self.clock = clock
        self.wall_clock = wall_clock
        self._lock = threading.Lock()
        self._endpoints: dict[str, Endpoint] = {}

    def endpoint(self, url: str) -> Endpoint:
        """Return the `Endpoint` of ``url`` (made on first use)."""
        key = endpoint_key(url)
        with self._lock:
            found = self._endpoints.get(key)
            if found is None:
                found = self._endpoints[key] = Endpoint(key, self)
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


def default_user_agent() -> str:
    """Return ``ipam-bridge/<installed version>`` (``ipam-bridge`` when not installed)."""
    try:
        return f"ipam-bridge/{metadata.version('ipam-bridge')}"
    except metadata.PackageNotFoundError:
        return "ipam-bridge"


@dataclass(frozen=True)
class TransportConfig:
    """How to reach one IPAM endpoint over HTTP.

    Attributes
    ----------
    endpoint:
        The base URL (its ``scheme://host:port`` is the endpoint's key).
    verify:
        Verify the server's TLS certificate (False only for ``insecureSkipVerify``).
    ca_pem:
        CA bundle (PEM text) to trust instead of the system CAs, or None.
    timeout_seconds:
        Connect and read timeout of each request (cut to the operation's time left).
    user_agent:
        The ``User-Agent`` header.
    keep_cookies:
        Keep cookies the server sets (WAPI's session cookie); False ignores them all.
    """

    endpoint: str
    verify: bool = True
    ca_pem: str | None = field(default=None, repr=False)
    timeout_seconds: float = 10.0
    user_agent: str = field(default_factory=default_user_agent)
    keep_cookies: bool = True


def ssl_context_from_pem(pem: str) -> ssl.SSLContext:
    """Return a verifying client `ssl.SSLContext` that trusts exactly the CAs in ``pem``.

    Raises
    ------
    ValueError
        When ``pem`` holds no usable certificate.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies certificate and host name
    try:
        context.load_verify_locations(cadata=pem)
    except (ssl.SSLError, ValueError) as exc:
        raise ValueError(f"the CA bundle is not valid PEM: {exc}") from None
    if not context.get_ca_certs():
        raise ValueError("the CA bundle holds no certificate")
    return context


class _ContextAdapter(HTTPAdapter):
    """An `HTTPAdapter` whose HTTPS connections verify against one `ssl.SSLContext`."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._context = context
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ssl_context"] = self._context
        super().init_poolmanager(*args, **kwargs)

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        # verify=True: a CA path from REQUESTS_CA_BUNDLE must not widen what is trusted.
        kwargs["verify"] = True
        return super().send(request, *args, **kwargs)


def environment_settings(endpoint: str, verify: bool) -> tuple[dict[str, str], bool | str]:
    """Return the proxies and the ``verify`` value requests takes from the environment.

    The same as a session with ``trust_env`` does for every request to ``endpoint``
    (``Session.merge_environment_settings``): the proxies of ``*_proxy``/``*_PROXY`` unless
    ``no_proxy`` excludes the endpoint's host, and, when verifying, the CA bundle of
    ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE``
    (https://requests.readthedocs.io/en/latest/user/advanced/#proxies,
    https://requests.readthedocs.io/en/latest/user/advanced/#ssl-cert-verification).

    Parameters
    ----------
    endpoint:
        The endpoint's URL.
    verify:
        Whether TLS certificates are verified.

    Returns
    -------
    tuple
        ``(proxies by scheme, verify)``: ``verify`` is False, True, or a CA bundle path.
    """
    proxies = dict(requests.utils.get_environ_proxies(endpoint))
    if not verify:
        return proxies, False
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    return proxies, bundle or True


class _NoAuth(AuthBase):
    """Send no Authorization header (and keep requests from reading ~/.netrc)."""

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        return r


NO_AUTH: Final[AuthBase] = _NoAuth()


def basic_auth(username: str, password: str) -> HTTPBasicAuth:
    """HTTP Basic with UTF-8 credentials (as browsers and curl send them; never raises)."""
    return HTTPBasicAuth(username.encode(), password.encode())


def credential_id(username: str, password: str) -> str:
    """Return a digest naming a username/password pair in the login budget (never logged)."""
    return hashlib.sha256(f"{username}\0{password}".encode()).hexdigest()[:24]


def status_error(label: str, what: str, status: int, detail: str) -> BackendUnavailableError | None:
    """Return the error of a transient HTTP status (429, 5xx), or None for other statuses."""
    if status == 429 or status >= 500:
        return BackendUnavailableError(
            f"{label} {what}: HTTP {status}: {_cut(detail) or 'no detail'}", status=status
        )
    return None


class ClientSettings(Protocol):
    """The fields of a client's config the transport is built from (`Transport.of`)."""

    @property
    def endpoint(self) -> str:
        """The base URL."""
        ...

    @property
    def verify(self) -> bool:
        """Whether TLS certificates are verified."""
        ...

    @property
    def ca_pem(self) -> str | None:
        """The CA bundle (PEM) to trust, or None."""
        ...

    @property
    def timeout_seconds(self) -> float:
        """Connect and read timeout of each request."""
        ...

    @property
    def user_agent(self) -> str:
        """The User-Agent header."""
        ...

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy (its total seconds bound each operation)."""
        ...


class Transport:
    """The HTTP session to one IPAM endpoint, with the operator's isolation rules.

    Parameters
    ----------
    config:
        Endpoint, TLS, timeout, User-Agent.
    retry:
        The retry policy `call` runs operations under (its ``total_seconds`` bounds them).
    endpoints:
        The operator's `EndpointRegistry`; None gives this transport a registry of its own
        (tests, scripts).
    label:
        The API's name in messages (``phpIPAM``, ``WAPI``).
    session:
        A session to use instead of a new one (it is then not closed by `close`).

    Raises
    ------
    ValueError
        When ``config.ca_pem`` is not a valid PEM bundle.
    """

    def __init__(
        self,
        config: TransportConfig,
        *,
        retry: RetryPolicy,
        endpoints: EndpointRegistry | None = None,
        label: str,
        session: requests.Session | None = None,
    ) -> None:
        self.config = config
        self.retry = retry
        self.label = label
        self.endpoints = endpoints if endpoints is not None else EndpointRegistry()
        self.endpoint = self.endpoints.endpoint(config.endpoint)
        self._owns_session = session is None
        self._verify: bool | str = config.verify
        if session is None:
            session = requests.Session()
            if not config.keep_cookies:
                session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
            # requests reads the environment again for every request of a session that
            # trusts it (proxy variables, no_proxy matching, CA bundle variables): CPU for
            # nothing, as the environment does not change. Read once, here.
            proxies, self._verify = environment_settings(config.endpoint, config.verify)
            session.trust_env = False
            session.proxies.update(proxies)
        session.headers["User-Agent"] = config.user_agent
        if config.verify and config.ca_pem:
            adapter = _ContextAdapter(ssl_context_from_pem(config.ca_pem))
            session.mount(f"{urlsplit(config.endpoint).scheme.lower()}://", adapter)
        self.session = session

    @classmethod
    def of(
        cls,
        config: ClientSettings,
        *,
        label: str,
        endpoints: EndpointRegistry | None,
        session: requests.Session | None = None,
        keep_cookies: bool = True,
    ) -> Transport:
        """Return the transport of a client config (`backends.phpipam.PHPIPAMConfig`, ...)."""
        return cls(
            TransportConfig(
                endpoint=config.endpoint,
                verify=config.verify,
                ca_pem=config.ca_pem,
                timeout_seconds=config.timeout_seconds,
                user_agent=config.user_agent,
                keep_cookies=keep_cookies,
            ),
            retry=config.retry,
            endpoints=endpoints,
            label=label,
            session=session,
        )

    def call(self, operation: str, fn: Callable[[], T]) -> T:
        """Run one backend operation: in a slot of the endpoint, under the retry policy.

        The whole of it (the wait for a slot, retries, re-logins, each request) ends within
        ``retry.total_seconds``.
        """
        with deadline(self.retry.total_seconds), self.endpoint.slot():
            return self.retry.call(f"{self.label} {operation}", fn)

    def login(
        self,
        credential: str,
        fn: Callable[[], T],
        *,
        blocked_for: Callable[[AuthenticationFailedError], float] | None = None,
        limit: int | None = None,
    ) -> T:
        """Run a login ``fn`` under the endpoint's login budget.

        Parameters
        ----------
        credential:
            `credential_id` of the username and password.
        fn:
            Sends the login; raises `AuthenticationFailedError` when it is refused.
        blocked_for:
            Tells from a refusal how long the IPAM now blocks this address (0: it does not);
            no login to the endpoint is sent before that.
        limit:
            Refused logins per window this login allows, when below the endpoint's
            ``login_limit`` (Infoblox: 3 per 5 minutes, below NIOS's account lockout).

        Raises
        ------
        AuthenticationFailedError
            The refusal (recorded), or the login held back (not sent).
        """
        admitted = self.endpoint.check_login(credential, limit)
        try:
            result = fn()
        except AuthenticationFailedError as exc:
            blocked = blocked_for(exc) if blocked_for is not None else 0.0
            self.endpoint.login_refused(
                credential, exc.message, blocked_seconds=blocked, admitted=admitted
            )
            raise
        except BaseException:
            if admitted:
                self.endpoint.login_ended()
            raise
        if admitted:
            self.endpoint.login_ended()
        self.endpoint.login_succeeded(credential)
        return result

    def request(
        self,
        method: str,
        url: str,
        *,
        what: str,
        headers: Mapping[str, str] | None = None,
        params: list[tuple[str, str]] | None = None,
        json: Any = None,
        auth: AuthBase | None = None,
    ) -> requests.Response:
        """Send one request and return its answer (any status but 3xx).

        Parameters
        ----------
        what:
            What the request is, for messages (``GET subnets/7/``); no secret.

        Raises
        ------
        EndpointUnavailableError
            The breaker is open.
        BackendUnavailableError
            Timeout, connection error, or the operation's time budget used up.
        TLSVerificationError
            The certificate could not be verified.
        InvalidRequestError
            A redirect (naming its target), or a request that cannot be made.
        Exception
            Whatever `EndpointRegistry.fence` raises before a request that is not a read
            (the request is not sent).
        """
        fence = self.endpoints.fence
        if fence is not None and method.upper() not in _READ_METHODS:
            fence()
        config = self.config
        timeout = config.timeout_seconds
        left = time_left()
        if left is not None:
            if left < _MIN_REQUEST_SECONDS:
                raise BackendUnavailableError(
                    f"{self.label} {what}: the call's time budget of "
                    f"{self.retry.total_seconds:g}s is used up ({config.endpoint})"
                )
            timeout = min(timeout, left)
        endpoint = self.endpoint
        endpoint.admit()
        started = time.monotonic()
        try:
            response = self.session.request(
                method,
                url,
                headers=headers,
                params=params,
                json=json,
                auth=auth or NO_AUTH,
                timeout=(timeout, timeout),
                verify=self._verify,
                allow_redirects=False,
            )
        except requests.Timeout as exc:
            self._failed(method, "timeout", started, reached=False)
            raise BackendUnavailableError(
                f"{self.label} {what}: no answer from {config.endpoint} within {timeout:.3g}s"
            ) from exc
        except requests.exceptions.SSLError as exc:
            self._failed(method, "tls_error", started, reached=True)
            raise TLSVerificationError(
                f"{self.label} {what}: TLS verification of {config.endpoint} failed "
                f"({tls_failure(exc) or 'TLS error'})"
            ) from exc
        except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema) as exc:
            self._failed(method, "error", started, reached=None)
            raise InvalidRequestError(f"{self.label} {what}: invalid URL: {exc}") from exc
        except requests.RequestException as exc:
            self._failed(method, "connection_error", started, reached=False)
            raise BackendUnavailableError(
                f"{self.label} {what}: cannot reach {config.endpoint}: "
                f"{type(exc).__name__}: {_cut(str(exc))}"
            ) from exc
        except OSError as exc:
            self._failed(method, "error", started, reached=None)
            raise InvalidRequestError(
                f"{self.label} {what}: cannot make the request ({_cut(str(exc))}); "
                "check the TLS settings"
            ) from exc
        except BaseException:
            self.endpoint.settled()
            raise
        status = response.status_code
        seconds = time.monotonic() - started
        if status in _GATEWAY_FAILURES:
            endpoint.unreachable()
        else:
            endpoint.reachable()
        self.endpoints.record(RequestRecord(endpoint.key, method, str(status), seconds))
        log.debug("%s %s -> %d in %.3fs", self.label, what, status, seconds)
        if 300 <= status < 400:
            target = response.headers.get("Location")
            raise InvalidRequestError(
                f"{self.label} {what}: redirected (HTTP {status}) to {target!r}; redirects are "
                "not followed: set the endpoint to the final URL (https?)",
                status=status,
            )
        return response

    def _failed(self, method: str, result: str, started: float, *, reached: bool | None) -> None:
        if reached is True:
            self.endpoint.reachable()
        elif reached is False:
            self.endpoint.unreachable()
        else:
            self.endpoint.settled()
        record = RequestRecord(self.endpoint.key, method, result, time.monotonic() - started)
        self.endpoints.record(record)

    def close(self) -> None:
        """Close the session (if this transport made it)."""
        if self._owns_session:
            self.session.close()
