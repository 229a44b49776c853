"""The HTTP layer both IPAM clients share: session, TLS, timeouts, errors.

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
  operation's `backends.retry.deadline`, and no request once it is used up; a request that
  is not a read also gets one total timeout (urllib3's ``Timeout(total=...)``: connecting and
  each wait for bytes end by it) cut by the retry policy's ``write_timeout`` (the operator's
  Lease fence), which may refuse it;
- the mapping of transport failures to `backends.errors` (timeouts and connection errors:
  `BackendUnavailableError`; TLS: `TLSVerificationError`; 429/5xx: `status_error`);
- `basic_auth`: HTTP Basic with UTF-8 credentials (requests would use Latin-1).

Every operation, request and login passes the endpoint's flow control
(`backends.flowcontrol.FlowControl`, one per operator: circuit breaker, one concurrency
limit, login budget, the fence before writes, the request metrics hook), which states the policy.
"""

from __future__ import annotations

import hashlib
import http.cookiejar
import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Final, Protocol, TypeVar, cast
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.auth import AuthBase, HTTPBasicAuth
from urllib3.util import Timeout

from backends.errors import (
    AuthenticationFailedError,
    BackendError,
    BackendUnavailableError,
    InvalidRequestError,
    TLSVerificationError,
    tls_failure,
)
from backends.flowcontrol import FlowControl, RequestRecord
from backends.retry import RetryPolicy, deadline, time_left

__all__ = [
    "NO_AUTH",
    "ClientSettings",
    "Transport",
    "TransportConfig",
    "basic_auth",
    "credential_id",
    "default_user_agent",
    "overloaded",
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


def overloaded(response: requests.Response) -> bool:
    """Return True when an answer says its server is overloaded or failing: HTTP 429 or 5xx.

    The default of `Transport`'s ``overloaded``: such an answer halves the endpoint's
    concurrency limit (`backends.flowcontrol.EndpointFlow.congested`).
    """
    return response.status_code == 429 or response.status_code >= 500


def _cut(text: str) -> str:
    """Return ``text`` on one line, cut to 200 characters."""
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_MAX_CHARS else text[: _MESSAGE_MAX_CHARS - 3] + "..."


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
    """The HTTP session to one IPAM endpoint, sent through the endpoint's flow control.

    Parameters
    ----------
    config:
        Endpoint, TLS, timeout, User-Agent.
    retry:
        The retry policy `call` runs operations under (its ``total_seconds`` bounds them).
    endpoints:
        The operator's `backends.flowcontrol.FlowControl`; None gives this transport one of
        its own (tests, scripts).
    label:
        The API's name in messages (``phpIPAM``, ``WAPI``).
    session:
        A session to use instead of a new one (it is then not closed by `close`).
    overloaded:
        Tells whether an answer says the server is overloaded or failing (it then halves
        the endpoint's concurrency limit; any other answer may raise it). Default: the
        module's `overloaded` (429, 5xx); an IPAM that refuses requests with a 5xx gives
        its own.

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
        endpoints: FlowControl | None = None,
        label: str,
        session: requests.Session | None = None,
        overloaded: Callable[[requests.Response], bool] = overloaded,
    ) -> None:
        self.config = config
        self._overloaded = overloaded
        self.retry = retry
        self.label = label
        self.endpoints = endpoints if endpoints is not None else FlowControl()
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
        endpoints: FlowControl | None,
        session: requests.Session | None = None,
        keep_cookies: bool = True,
        overloaded: Callable[[requests.Response], bool] = overloaded,
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
            overloaded=overloaded,
        )

    def call(self, operation: str, fn: Callable[[], T]) -> T:
        """Run one backend operation: as one of the endpoint's operations, under the retry policy.

        The whole of it (the wait for a place, retries, re-logins, each request) ends within
        ``retry.total_seconds``.

        Raises
        ------
        EndpointUnavailableError
            The breaker is open, or no place freed in time
            (`backends.flowcontrol.EndpointFlow.operation`); ``fn`` is not called.
        BackendError
            What ``fn`` raised last (`backends.retry.RetryPolicy.call`).
        """
        with deadline(self.retry.total_seconds), self.endpoint.operation():
            return self.retry.call(f"{self.label} {operation}", fn)

    def login(
        self,
        credential: str,
        fn: Callable[[], T],
        *,
        blocked_for: Callable[[AuthenticationFailedError], float] | None = None,
        limit: int | None = None,
    ) -> T:
        """Run a login ``fn`` under the endpoint's login budget and return its result.

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
                self.endpoint.login_ended(credential)
            raise
        self.endpoint.login_succeeded(credential)
        if admitted:
            self.endpoint.login_ended(credential)
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

        The steps: the fence (writes only), the time left, the breaker's admission, the
        request itself, then its outcome recorded (breaker, metrics hook) and a redirect
        refused.

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
            Whatever `backends.flowcontrol.FlowControl.fence` raises before a request that
            is not a read (the request is not sent).
        """
        self._pass_fence(method)
        timeout = self._timeout(what)
        limits = self._limits(method, timeout)
        self.endpoint.admit()
        started = time.monotonic()
        response = self._send(
            method,
            url,
            what,
            limits,
            started,
            headers=headers,
            params=params,
            json=json,
            auth=auth,
        )
        self._answered(method, what, response, started)
        return response

    def _pass_fence(self, method: str) -> None:
        """Ask the fence before a request that is not a read (it raises to stop it)."""
        fence = self.endpoints.fence
        if fence is not None and method.upper() not in _READ_METHODS:
            fence()

    def _timeout(self, what: str) -> float:
        """Return the request's timeout in seconds: the configured one, cut to the time left.

        Raises
        ------
        BackendUnavailableError
            Less than 50 ms of the operation's time budget is left.
        """
        timeout = self.config.timeout_seconds
        left = time_left()
        if left is None:
            return timeout
        if left < _MIN_REQUEST_SECONDS:
            raise BackendUnavailableError(
                f"{self.label} {what}: the call's time budget of "
                f"{self.retry.total_seconds:g}s is used up ({self.config.endpoint})"
            )
        return min(timeout, left)

    def _limits(self, method: str, timeout: float) -> tuple[float, float] | Timeout:
        """Return the urllib3 timeouts of one request whose per-wait timeout is ``timeout``.

        A read waits ``timeout`` to connect and ``timeout`` for each read. A request that is
        not a read also ends in all (connecting and reading) within the policy's
        ``write_timeout(2 * timeout)`` (the Lease's time left; requests passes a urllib3
        ``Timeout`` on, https://requests.readthedocs.io/en/latest/api/#requests.adapters.HTTPAdapter.send).

        Raises
        ------
        Exception
            Whatever ``write_timeout`` raises to refuse the request (it is not sent).
        """
        cut = self.retry.write_timeout
        if cut is None or method.upper() in _READ_METHODS:
            return (timeout, timeout)
        total = cut(2 * timeout)
        return Timeout(connect=min(timeout, total), read=min(timeout, total), total=total)

    def _send(
        self,
        method: str,
        url: str,
        what: str,
        limits: tuple[float, float] | Timeout,
        started: float,
        **kwargs: Any,
    ) -> requests.Response:
        """Send the request admitted by the breaker; map a failure to a backend error.

        ``kwargs``: ``headers``, ``params``, ``json``, ``auth`` of `request`. A failure is
        recorded (breaker, metrics hook) before its error is raised; the errors are those
        of `request`.
        """
        auth = kwargs.pop("auth") or NO_AUTH
        session = self.session
        try:
            # Prepared with the session's headers and cookie jar, then sent by the session
            # (its adapters, its cookie jar, its proxies), as ``Session.request`` would do
            # (https://requests.readthedocs.io/en/latest/user/advanced/#prepared-requests)
            # without merging the session's empty params, auth and hooks for every request.
            prepared = requests.Request(
                method,
                url,
                headers={**session.headers, **(kwargs.pop("headers") or {})},
                cookies=session.cookies,
                auth=auth,
                **kwargs,
            ).prepare()
            return session.send(
                prepared,
                # HTTPAdapter.send takes a urllib3 Timeout (its documented parameter);
                # types-requests' Session.send stub names only floats and pairs.
                timeout=cast(Any, limits),
                verify=self._verify,
                proxies=session.proxies,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            wait = limits[1] if isinstance(limits, tuple) else cast(float, limits.total)
            raise self._request_failed(method, what, wait, started, exc) from exc
        except OSError as exc:
            self._failed(method, "error", started, reached=None)
            raise InvalidRequestError(
                f"{self.label} {what}: cannot make the request ({_cut(str(exc))}); "
                "check the TLS settings"
            ) from exc
        except BaseException:
            self.endpoint.settled()
            raise

    def _request_failed(
        self,
        method: str,
        what: str,
        timeout: float,
        started: float,
        exc: requests.RequestException,
    ) -> BackendError:
        """Record a request that got no answer and return the backend error it becomes."""
        endpoint = self.config.endpoint
        if isinstance(exc, requests.Timeout):
            self._failed(method, "timeout", started, reached=False)
            return BackendUnavailableError(
                f"{self.label} {what}: no answer from {endpoint} within {timeout:.3g}s"
            )
        if isinstance(exc, requests.exceptions.SSLError):
            self._failed(method, "tls_error", started, reached=True)
            return TLSVerificationError(
                f"{self.label} {what}: TLS verification of {endpoint} failed "
                f"({tls_failure(exc) or 'TLS error'})"
            )
        if isinstance(exc, requests.exceptions.InvalidURL | requests.exceptions.MissingSchema):
            self._failed(method, "error", started, reached=None)
            return InvalidRequestError(f"{self.label} {what}: invalid URL: {exc}")
        self._failed(method, "connection_error", started, reached=False)
        return BackendUnavailableError(
            f"{self.label} {what}: cannot reach {endpoint}: {type(exc).__name__}: {_cut(str(exc))}"
        )

    def _answered(
        self, method: str, what: str, response: requests.Response, started: float
    ) -> None:
        """Record an answer (breaker, metrics hook); refuse a redirect.

        Raises
        ------
        InvalidRequestError
            The answer is a redirect (3xx), naming its target.
        """
        endpoint = self.endpoint
        status = response.status_code
        seconds = time.monotonic() - started
        if status in _GATEWAY_FAILURES:
            endpoint.unreachable()
        else:
            endpoint.reachable()
        if self._overloaded(response):
            endpoint.congested()  # the IPAM is overloaded: fewer calls at once
        else:
            endpoint.answered()
        self.endpoints.record(RequestRecord(endpoint.key, method, str(status), seconds))
        log.debug("%s %s -> %d in %.3fs", self.label, what, status, seconds)
        if 300 <= status < 400:
            target = response.headers.get("Location")
            raise InvalidRequestError(
                f"{self.label} {what}: redirected (HTTP {status}) to {target!r}; redirects are "
                "not followed: set the endpoint to the final URL (https?)",
                status=status,
            )

    def _failed(self, method: str, result: str, started: float, *, reached: bool | None) -> None:
        """Record a request without an answer: in the breaker (``reached``) and the hook.

        ``reached``: True when the endpoint answered at the TLS level, False when it did not
        answer, None when the request never left (ends a probe without a verdict).
        """
        if reached is True:
            self.endpoint.reachable()
        elif reached is False:
            self.endpoint.unreachable()
            self.endpoint.congested()
        else:
            self.endpoint.settled()
        record = RequestRecord(self.endpoint.key, method, result, time.monotonic() - started)
        self.endpoints.record(record)

    def close(self) -> None:
        """Close the session (if this transport made it)."""
        if self._owns_session:
            self.session.close()
