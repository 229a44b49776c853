"""Faults for endpoint isolation (issue 10, item 6): a hung WAPI and a redirect."""

from __future__ import annotations

import threading
import time

import pytest
import requests
from ib_helpers import Wapi, host_body

from mock_infoblox import InfobloxStore, MockInfobloxServer


def test_hung_endpoint_accepts_and_never_answers(
    wapi: Wapi, server: MockInfobloxServer, store: InfobloxStore
) -> None:
    server.faults.update(hang_rate=1.0, hang_seconds=60)
    with pytest.raises(requests.exceptions.ReadTimeout):
        wapi.session.get(f"{wapi.url}/network", timeout=0.2)
    with pytest.raises(requests.exceptions.ReadTimeout):
        wapi.session.post(f"{wapi.url}/record:host", json=host_body("h.default"), timeout=0.2)
    assert server.faults.stats["hangs"] == 2
    server.faults.update(hang_rate=0.0)
    assert wapi.get("record:host").json() == []  # the hung create changed nothing


def test_clearing_the_hang_releases_waiting_requests(
    wapi: Wapi, server: MockInfobloxServer, store: InfobloxStore
) -> None:
    server.faults.update(hang_rate=1.0, hang_seconds=60)
    outcome: list[BaseException | int] = []

    def call() -> None:
        try:
            outcome.append(wapi.session.get(f"{wapi.url}/network", timeout=10).status_code)
        except requests.exceptions.RequestException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call)
    started = time.perf_counter()
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()
    server.faults.reset()
    thread.join(5)
    assert not thread.is_alive() and time.perf_counter() - started < 5
    assert isinstance(outcome[0], requests.exceptions.ConnectionError)
    assert wapi.get("network").status_code == 200


def test_hang_ends_after_its_duration(
    wapi: Wapi, server: MockInfobloxServer, store: InfobloxStore
) -> None:
    server.faults.update(hang_rate=1.0, hang_seconds=0.3)
    with pytest.raises(requests.exceptions.ConnectionError):
        wapi.session.get(f"{wapi.url}/network", timeout=5)


def test_redirect_on_every_request(
    wapi: Wapi, server: MockInfobloxServer, store: InfobloxStore
) -> None:
    url = f"{server.url}/_mock/faults"
    put = requests.put(url, json={"redirect_to": "https://grid.example.org/"}, timeout=5)
    assert put.status_code == 200
    response = wapi.session.get(
        f"{wapi.url}/network", params={"network": "10.20.0.0/24"}, allow_redirects=False
    )
    assert response.status_code == 302
    assert response.headers["Location"] == (
        "https://grid.example.org/wapi/v2.12/network?network=10.20.0.0%2F24"
    )
    created = wapi.session.post(
        f"{wapi.url}/record:host", json=host_body("r.default"), allow_redirects=False
    )
    assert created.status_code == 302
    assert server.faults.stats["redirects"] == 2
    requests.delete(url, timeout=5)
    assert wapi.get("record:host").json() == []  # nothing was created


def test_redirect_status_and_fixed_target(
    wapi: Wapi, server: MockInfobloxServer, store: InfobloxStore
) -> None:
    server.faults.update(
        redirect_to="https://sso.example.org/login", redirect_status=307, redirect_keep_path=False
    )
    response = wapi.session.get(f"{wapi.url}/network", allow_redirects=False)
    assert (response.status_code, response.headers["Location"]) == (
        307,
        "https://sso.example.org/login",
    )
