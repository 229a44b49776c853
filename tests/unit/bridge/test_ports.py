"""Ports the operator listens on: `check_port` and `Metrics.serve` name the port and setting."""

from __future__ import annotations

import errno
import socket
import urllib.request
from collections.abc import Iterator

import pytest

from bridge.metrics import Metrics, PortUnavailableError, check_port, listen_address


@pytest.fixture
def occupied() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_metrics_serve_on_a_taken_port_names_it(occupied: int) -> None:
    metrics = Metrics()
    with pytest.raises(PortUnavailableError) as caught:
        metrics.serve(occupied, "127.0.0.1")
    error = caught.value
    assert str(error) == (
        f"cannot listen on 127.0.0.1:{occupied} for metrics (IPAM_BRIDGE_METRICS_PORT): "
        "Address already in use"
    )
    assert isinstance(error, OSError)  # callers catching OSError keep working
    assert error.errno == errno.EADDRINUSE
    assert (error.address, error.port, error.purpose, error.setting) == (
        "127.0.0.1",
        occupied,
        "metrics",
        "IPAM_BRIDGE_METRICS_PORT",
    )
    metrics.close()  # nothing was started


def test_metrics_serve_names_the_setting_it_is_given(occupied: int) -> None:
    with pytest.raises(PortUnavailableError, match=r"\(--metrics-port\)"):
        Metrics().serve(occupied, "127.0.0.1", setting="--metrics-port")


def test_metrics_serve_on_a_free_port_serves(occupied: int) -> None:
    metrics = Metrics()
    port = metrics.serve(0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert b"ipam_bridge_allocations" in response.read()
    finally:
        metrics.close()


def test_check_port_releases_a_free_port() -> None:
    port = free_port()
    check_port(port, "127.0.0.1", purpose="metrics", setting="IPAM_BRIDGE_METRICS_PORT")
    # the check left nothing bound: a server can take the port
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1)


def test_check_port_zero_is_off(occupied: int) -> None:
    check_port(0, "127.0.0.1", purpose="metrics", setting="IPAM_BRIDGE_METRICS_PORT")


def test_check_port_reports_a_taken_port(occupied: int) -> None:
    with pytest.raises(PortUnavailableError) as caught:
        check_port(occupied, "localhost", purpose="health", setting="IPAM_BRIDGE_HEALTH_PORT")
    assert caught.value.errno == errno.EADDRINUSE
    assert str(caught.value).startswith(f"cannot listen on localhost:{occupied} for health")


def test_check_port_accepts_a_port_held_only_by_time_wait_connections() -> None:
    # a restarted operator finds its old port in TIME_WAIT; the servers bind it with
    # SO_REUSEADDR, and so does the check
    port = free_port()
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(1)
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: its end goes to TIME_WAIT
        client.close()
    check_port(port, "127.0.0.1", purpose="metrics", setting="IPAM_BRIDGE_METRICS_PORT")


def test_listen_address_brackets_ipv6() -> None:
    assert listen_address("0.0.0.0", 8080) == "0.0.0.0:8080"
    assert listen_address("::", 8080) == "[::]:8080"
    error = PortUnavailableError("::", 8080, "metrics", "IPAM_BRIDGE_METRICS_PORT", "x")
    assert str(error) == "cannot listen on [::]:8080 for metrics (IPAM_BRIDGE_METRICS_PORT): x"
