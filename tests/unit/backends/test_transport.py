"""Unit tests of backends.transport: the HTTP layer both IPAM clients share."""

from __future__ import annotations

import base64
import concurrent.futures
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import responses
import trustme
import urllib3
from urllib3.util import Timeout

from backends.errors import (
    AuthenticationFailedError,
    BackendUnavailableError,
    EndpointUnavailableError,
    InvalidRequestError,
    TLSVerificationError,
)
from backends.flowcontrol import EndpointState, FlowControl, RequestRecord, endpoint_key
from backends.infoblox import InfobloxBackend, InfobloxConfig
from backends.phpipam import PHPIPAMBackend, PHPIPAMConfig
from backends.retry import RetryPolicy
from backends.transport import (
    Transport,
    TransportConfig,
    ssl_context_from_pem,
    status_error,
)

URL = "http://ipam.test/api"
NO_SLEEP = RetryPolicy(attempts=1, sleep=lambda _: None)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def transport(
    *,
    retry: RetryPolicy = NO_SLEEP,
    endpoints: FlowControl | None = None,
    **config: Any,
) -> Transport:
    return Transport(
        TransportConfig(**{"endpoint": URL, **config}),
        retry=retry,
        endpoints=endpoints,
        label="IPAM",
    )


def get(t: Transport, url: str = f"{URL}/x") -> requests.Response:
    return t.call("get", lambda: t.request("GET", url, what="GET x"))


# ------------------------------------------------------------------ basics


def test_endpoint_key_is_scheme_host_port() -> None:
    assert endpoint_key("https://IPAM.example.com/api") == "https://ipam.example.com:443"
    assert endpoint_key("http://10.0.0.1:8080/api/") == "http://10.0.0.1:8080"
    assert endpoint_key("https://[2001:db8::1]/wapi") == "https://[2001:db8::1]:443"


def test_user_agent_and_no_netrc(rsps: responses.RequestsMock) -> None:
    rsps.get(f"{URL}/x", json={})
    get(transport(user_agent="ipam-bridge/9.9.9"))
    request = rsps.calls[0].request
    assert request.headers["User-Agent"] == "ipam-bridge/9.9.9"
    assert "Authorization" not in request.headers


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_redirect_is_refused_naming_the_target(rsps: responses.RequestsMock, status: int) -> None:
    rsps.get(f"{URL}/x", status=status, headers={"Location": "https://ipam.test/api/x"})
    rsps.get("https://ipam.test/api/x", json={})
    with pytest.raises(InvalidRequestError, match=r"redirected \(HTTP \d+\) to 'https://ipam.test"):
        get(transport())
    assert len(rsps.calls) == 1  # not followed


@pytest.mark.parametrize(
    ("failure", "error", "text"),
    [
        (requests.ConnectTimeout("connect timeout"), BackendUnavailableError, "no answer"),
        (requests.ReadTimeout("read timeout"), BackendUnavailableError, "no answer"),
        (requests.ConnectionError("refused"), BackendUnavailableError, "cannot reach"),
        (requests.exceptions.SSLError("bad handshake"), TLSVerificationError, "TLS"),
    ],
    ids=["connect-timeout", "read-timeout", "connection-error", "tls"],
)
def test_transport_failures_map_to_backend_errors(
    rsps: responses.RequestsMock, failure: Exception, error: type[Exception], text: str
) -> None:
    rsps.get(f"{URL}/x", body=failure)
    records: list[RequestRecord] = []
    with pytest.raises(error, match=text):
        get(transport(endpoints=FlowControl(on_request=records.append)))
    assert len(records) == 1 and records[0].endpoint == "http://ipam.test:80"


def test_status_errors() -> None:
    assert isinstance(status_error("IPAM", "GET x", 503, "down"), BackendUnavailableError)
    assert isinstance(status_error("IPAM", "GET x", 429, "slow down"), BackendUnavailableError)
    assert status_error("IPAM", "GET x", 404, "gone") is None
    assert status_error("IPAM", "GET x", 200, "") is None


# ------------------------------------------------------------------ bounded calls


def test_request_timeouts_are_cut_to_the_time_left(rsps: responses.RequestsMock) -> None:
    rsps.get(f"{URL}/x", json={})
    get(transport(timeout_seconds=10, retry=RetryPolicy(attempts=1, total_seconds=2.0)))
    connect, read = rsps.calls[0].request.req_kwargs["timeout"]  # type: ignore[attr-defined]
    assert 1.5 < connect <= 2.0 and 1.5 < read <= 2.0


def test_a_writes_whole_timeout_is_cut_by_the_write_timeout_reads_are_not(
    rsps: responses.RequestsMock,
) -> None:
    asked: list[float] = []

    def lease_left(seconds: float) -> float:
        asked.append(seconds)
        return min(seconds, 3.0)

    rsps.get(f"{URL}/x", json={})
    rsps.post(f"{URL}/x", json={})
    retry = RetryPolicy(attempts=1, write_timeout=lease_left)
    t = transport(timeout_seconds=10, retry=retry)
    get(t)
    t.call("post", lambda: t.request("POST", f"{URL}/x", what="POST x"))
    assert rsps.calls[0].request.req_kwargs["timeout"] == (10, 10)  # type: ignore[attr-defined]
    limits = rsps.calls[1].request.req_kwargs["timeout"]  # type: ignore[attr-defined]
    assert isinstance(limits, Timeout)
    assert limits.total == 3.0 and limits.connect_timeout == 3.0
    assert len(asked) == 1 and 19.0 < asked[0] <= 20.0  # connect + read of 10 s each


def test_a_write_the_write_timeout_refuses_is_not_sent(rsps: responses.RequestsMock) -> None:
    def nothing_left(seconds: float) -> float:
        raise RefusedError("the Lease ends now")

    rsps.post(f"{URL}/x", json={})
    t = transport(retry=RetryPolicy(attempts=1, write_timeout=nothing_left))
    with pytest.raises(RefusedError):
        t.call("post", lambda: t.request("POST", f"{URL}/x", what="POST x"))
    assert len(rsps.calls) == 0


def test_no_request_after_the_deadline(rsps: responses.RequestsMock) -> None:
    """A retry whose wait would end after the budget is not made; nor is a request."""
    rsps.get(f"{URL}/x", body=requests.ConnectionError("refused"))
    policy = RetryPolicy(attempts=10, initial_delay_seconds=0.2, total_seconds=0.5)
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError):
        get(transport(retry=policy))
    assert time.monotonic() - started < 0.7
    assert len(rsps.calls) < 10


@pytest.fixture
def hung_server() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/api"
    finally:
        stop.set()
        thread.join(timeout=2)
        for conn in held:
            conn.close()
        server.close()


def test_a_hung_endpoint_costs_at_most_the_budget(hung_server: str) -> None:
    """Retries and the request in flight included: the call ends at the total seconds."""
    policy = RetryPolicy(attempts=5, initial_delay_seconds=0.05, total_seconds=1.0)
    config = PHPIPAMConfig(
        endpoint=hung_server,
        app_id="capi",
        subnet_id=7,
        username="u",
        password="p",
        timeout_seconds=10.0,
        retry=policy,
    )
    started = time.monotonic()
    with PHPIPAMBackend(config) as backend, pytest.raises(BackendUnavailableError):
        backend.find("a.ns")
    assert time.monotonic() - started < 1.3


# ------------------------------------------------------------------ circuit breaker


def test_breaker_opens_fails_fast_then_probes_once(rsps: responses.RequestsMock) -> None:
    clock = FakeClock()
    states: list[tuple[str, EndpointState]] = []
    registry = FlowControl(
        failure_threshold=2,
        cooldown_seconds=30,
        clock=clock,
        wall_clock=lambda: 1_790_000_000.0,
        on_state=lambda e, s: states.append((e, s)),
    )
    failing = rsps.get(f"{URL}/x", body=requests.ConnectionError("refused"))
    t = transport(endpoints=registry)
    for _ in range(2):
        with pytest.raises(BackendUnavailableError, match="cannot reach"):
            get(t)
    assert registry.states() == {"http://ipam.test:80": EndpointState.OPEN}

    with pytest.raises(EndpointUnavailableError) as caught:
        get(t)
    assert caught.value.message.startswith(
        "endpoint http://ipam.test:80 unreachable, next try at 2026-09-21T"
    )
    assert not caught.value.retryable
    assert failing.call_count == 2  # failed fast, nothing sent

    # After the cool-down one probe goes through; it fails: open again.
    clock.now += 30
    with pytest.raises(BackendUnavailableError, match="cannot reach"):
        get(t)
    assert failing.call_count == 3
    with pytest.raises(EndpointUnavailableError):
        get(t)

    # The next probe succeeds: closed.
    clock.now += 30
    rsps.replace("GET", f"{URL}/x", json={})
    get(t)
    get(t)
    assert [s for _, s in states] == [
        EndpointState.OPEN,
        EndpointState.HALF_OPEN,
        EndpointState.OPEN,
        EndpointState.HALF_OPEN,
        EndpointState.CLOSED,
    ]


def test_breaker_is_shared_by_every_client_of_the_endpoint(rsps: responses.RequestsMock) -> None:
    registry = FlowControl(failure_threshold=1)
    rsps.get(f"{URL}/x", body=requests.ConnectionError("refused"))
    with pytest.raises(BackendUnavailableError):
        get(transport(endpoints=registry))
    with pytest.raises(EndpointUnavailableError, match="unreachable"):
        get(transport(endpoints=registry))
    # Another endpoint is not affected.
    rsps.get("http://other.test/api/x", json={})
    get(transport(endpoints=registry, endpoint="http://other.test/api"), "http://other.test/api/x")


def test_an_answer_is_not_a_failure(rsps: responses.RequestsMock) -> None:
    registry = FlowControl(failure_threshold=1)
    rsps.get(f"{URL}/x", status=500, json={})
    for _ in range(3):
        assert get(transport(endpoints=registry)).status_code == 500
    assert registry.states() == {"http://ipam.test:80": EndpointState.CLOSED}


# ------------------------------------------------------------------ concurrency


def test_a_busy_endpoint_fails_fast(rsps: responses.RequestsMock) -> None:
    registry = FlowControl(max_concurrent=1, slot_wait_seconds=0.1)
    t = transport(endpoints=registry)
    inside, leave = threading.Event(), threading.Event()

    def slow() -> None:
        inside.set()
        leave.wait(5)

    worker = threading.Thread(target=lambda: t.call("slow", slow))
    worker.start()
    try:
        assert inside.wait(5)
        started = time.monotonic()
        with pytest.raises(EndpointUnavailableError, match=r"endpoint http://ipam\.test:80 busy"):
            t.call("other", lambda: None)
        assert time.monotonic() - started < 0.5
        # Another endpoint still has its slots.
        transport(endpoints=registry, endpoint="http://other.test").call("x", lambda: None)
    finally:
        leave.set()
        worker.join()
    t.call("again", lambda: None)  # the slot is free again


# ------------------------------------------------------------------ logins


def test_login_budget_lets_a_credential_that_works_through() -> None:
    clock = FakeClock()
    registry = FlowControl(
        login_limit=3, login_window_seconds=300, login_retry_seconds=10, clock=clock
    )
    endpoint = registry.endpoint(URL)
    endpoint.login_succeeded("good")
    for _ in range(3):
        assert endpoint.check_login("bad") is True  # admitted: it holds a place in the budget
        endpoint.login_refused("bad", "Invalid username or password", admitted=True)
        with pytest.raises(AuthenticationFailedError, match="not repeated for 10s: next try"):
            endpoint.check_login("bad")
        clock.now += 10
    with pytest.raises(AuthenticationFailedError, match=r"logins held back.*next try at"):
        endpoint.check_login("bad")
    assert endpoint.check_login("good") is False  # logged in before: never held back
    with pytest.raises(AuthenticationFailedError, match=r"logins held back.*next try at"):
        endpoint.check_login("new")  # never tried: waits for the window too
    clock.now += 280
    assert endpoint.check_login("bad") is True  # the window has passed


def test_logins_in_flight_count_against_the_budget() -> None:
    clock = FakeClock()
    registry = FlowControl(
        login_limit=3, login_window_seconds=300, login_retry_seconds=10, clock=clock
    )
    endpoint = registry.endpoint(URL)
    # Three unproven credentials log in at once: each takes a place before it is sent...
    assert [endpoint.check_login(c) for c in ("a", "b", "c")] == [True, True, True]
    # ...so a fourth is held back although nothing was refused yet.
    with pytest.raises(AuthenticationFailedError, match=r"logins held back"):
        endpoint.check_login("d")
    endpoint.login_refused("a", "Invalid username or password", admitted=True)
    endpoint.login_ended("b")  # b's login failed otherwise (no answer): its place is given back
    endpoint.login_succeeded("c")
    endpoint.login_ended("c")
    assert endpoint.check_login("d") is True  # one refusal + nothing in flight: room again
    endpoint.login_refused("d", "Invalid username or password", admitted=True)
    assert endpoint.check_login("c") is False  # proven credentials are never held back


def test_a_login_of_a_credential_in_flight_waits_for_its_outcome() -> None:
    """Pools sharing credentials log in together at start-up: the first success proves them."""
    registry = FlowControl(login_limit=1, login_window_seconds=300, clock=FakeClock())
    endpoint = registry.endpoint(URL)
    assert endpoint.check_login("shared") is True  # the first login, in flight
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        second = pool.submit(endpoint.check_login, "shared")
        with pytest.raises(concurrent.futures.TimeoutError):
            second.result(timeout=0.3)  # waits instead of being held back
        endpoint.login_succeeded("shared")
        endpoint.login_ended("shared")
        assert second.result(timeout=10) is False  # proven: no budget place needed


def test_transport_login_gives_the_budget_place_back_on_any_outcome() -> None:
    registry = FlowControl(login_limit=1, login_window_seconds=300, clock=FakeClock())
    t = transport(endpoints=registry)

    def unreachable() -> None:
        raise BackendUnavailableError("connection refused")

    for _ in range(3):  # failures that are not refusals never use the budget up
        with pytest.raises(BackendUnavailableError):
            t.login("x", unreachable)
    assert t.login("x", lambda: "token") == "token"

    def refused() -> None:
        raise AuthenticationFailedError("Invalid username or password")

    with pytest.raises(AuthenticationFailedError, match="Invalid username"):
        t.login("y", refused)
    with pytest.raises(AuthenticationFailedError, match=r"logins held back"):
        t.login("z", lambda: "never sent")  # the budget of one refusal is used up
    assert t.login("x", lambda: "token again") == "token again"  # proven credentials pass


def test_blocked_address_holds_back_every_login() -> None:
    clock = FakeClock()
    endpoint = FlowControl(clock=clock).endpoint(URL)
    endpoint.login_refused("a", "blocked", blocked_seconds=300)
    with pytest.raises(AuthenticationFailedError, match="blocked this address"):
        endpoint.check_login("b")
    clock.now += 301
    endpoint.check_login("b")


def test_infoblox_basic_auth_is_utf8(rsps: responses.RequestsMock) -> None:
    password = "pässwörd-密码"
    rsps.get("https://gm.test/wapi/v2.12/record:host", json=[])
    config = InfobloxConfig(
        endpoint="https://gm.test", subnet="10.20.0.0/24", username="ädmin", password=password
    )
    backend = InfobloxBackend(config)
    try:
        assert backend.find("a.ns") is None
    finally:
        backend.close()
    sent = rsps.calls[0].request.headers["Authorization"]
    assert sent == "Basic " + base64.b64encode(f"ädmin:{password}".encode()).decode()


# ------------------------------------------------------------------ TLS


@pytest.fixture
def https_server(
    tls_server: Callable[[Callable[[str], bytes]], tuple[str, str]],
) -> tuple[str, str]:
    """A TLS server on 127.0.0.1 with a trustme certificate; its URL and CA PEM."""
    url, ca_pem = tls_server(lambda _: b'{"ok": true}')
    return f"{url}/api", ca_pem


def test_ca_from_pem_data(
    https_server: tuple[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    url, pem = https_server
    # A CA bundle from the environment must not change what is trusted.
    other = tmp_path / "other.pem"
    other.write_bytes(trustme.CA().cert_pem.bytes())
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other))

    t = transport(endpoint=url, ca_pem=pem)
    assert get(t, f"{url}/x").json() == {"ok": True}

    with pytest.raises(TLSVerificationError, match="certificate verify failed"):
        get(transport(endpoint=url), f"{url}/x")
    wrong = trustme.CA().cert_pem.bytes().decode()
    with pytest.raises(TLSVerificationError, match="certificate verify failed"):
        get(transport(endpoint=url, ca_pem=wrong), f"{url}/x")
    with pytest.warns(urllib3.exceptions.InsecureRequestWarning):  # insecureSkipVerify
        assert get(transport(endpoint=url, verify=False), f"{url}/x").status_code == 200


def test_invalid_pem_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="CA bundle"):
        ssl_context_from_pem("not a certificate")
    with pytest.raises(ValueError, match="CA bundle"):
        transport(ca_pem="-----BEGIN CERTIFICATE-----\n")


def test_messages_name_no_secret(rsps: responses.RequestsMock) -> None:
    rsps.get(f"{URL}/x", body=requests.ConnectionError("refused"))
    with pytest.raises(BackendUnavailableError) as caught:
        get(transport())
    assert re.search(r"cannot reach http://ipam.test/api", caught.value.message)


# ------------------------------------------------------------------ fence


class RefusedError(Exception):
    pass


def test_the_fence_is_asked_before_every_request_but_reads_and_can_stop_it(
    rsps: responses.RequestsMock,
) -> None:
    asked: list[str] = []
    allowed = [True]

    def fence() -> None:
        asked.append("asked")
        if not allowed[0]:
            raise RefusedError("not the leader")

    t = transport(endpoints=FlowControl(fence=fence))
    rsps.get(f"{URL}/x", json={})
    rsps.post(f"{URL}/x", json={})
    rsps.delete(f"{URL}/x", json={})
    get(t)
    t.call("post", lambda: t.request("POST", f"{URL}/x", what="POST x"))
    assert asked == ["asked"] and len(rsps.calls) == 2  # the GET did not ask

    allowed[0] = False
    for method in ("POST", "PATCH", "PUT", "DELETE"):
        with pytest.raises(RefusedError):
            t.call("w", lambda m=method: t.request(m, f"{URL}/x", what=f"{m} x"))  # type: ignore[misc]
    assert len(rsps.calls) == 2  # nothing sent
    get(t)  # reads go on
    assert len(rsps.calls) == 3


# ------------------------------------------------------------------ environment


def test_proxies_and_ca_bundle_come_from_the_environment_once(
    monkeypatch: pytest.MonkeyPatch, rsps: responses.RequestsMock
) -> None:
    for name in ("NO_PROXY", "no_proxy", "http_proxy", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/corporate.pem")
    rsps.add("GET", f"{URL}/x", json={})
    t = transport()
    monkeypatch.setenv("HTTP_PROXY", "http://changed.invalid:3128")
    get(t)
    request = rsps.calls[0].request  # type: ignore[attr-defined]
    assert request.req_kwargs["proxies"]["http"] == "http://proxy.invalid:3128"
    assert request.req_kwargs["verify"] == "/etc/ssl/corporate.pem"

    monkeypatch.setenv("NO_PROXY", urlsplit(URL).hostname or "")
    assert "http" not in transport().session.proxies
