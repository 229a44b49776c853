"""Faults for endpoint isolation (issue 10, item 6): a hung endpoint, a redirect on every
request, and phpIPAM's lock-out after more than 10 failed logins within 5 minutes."""

from __future__ import annotations

import threading
import time

import pytest
import requests
from phpipam_mock_helpers import Api

from mock_phpipam import ManualClock, MockPhpipamServer, Store

BLOCKED = "Your IP has been blocked for 5 minutes because of excessive login failures"


def wrong_login(api: Api, password: str = "wrong") -> requests.Response:
    return requests.post(f"{api.base}/user/", auth=("Admin", password), timeout=5)


# ------------------------------------------------------------------------------ hung endpoint


def test_hung_endpoint_accepts_and_never_answers(api: Api, server: MockPhpipamServer) -> None:
    server.faults.update(hang_rate=1.0, hang_seconds=60)
    for _ in range(3):  # every request hangs, logins included
        with pytest.raises(requests.exceptions.ReadTimeout):
            api.call("GET", "/subnets/7/", timeout=0.2)
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"{api.base}/user/", auth=("Admin", "ipamadmin"), timeout=0.2)
    assert server.faults.stats["hangs"] == 4
    admin = requests.get(f"{server.base_url}/_mock/faults", timeout=5)  # admin API exempt
    assert admin.json()["faults"]["hang_rate"] == 1.0


def test_hang_ends_after_its_duration(api: Api, server: MockPhpipamServer) -> None:
    server.faults.update(hang_rate=1.0, hang_seconds=0.3)
    started = time.perf_counter()
    with pytest.raises(requests.exceptions.ConnectionError):  # dropped, never answered
        api.call("GET", "/subnets/7/", timeout=5)
    assert 0.3 <= time.perf_counter() - started < 3


def test_clearing_the_hang_releases_waiting_requests(api: Api, server: MockPhpipamServer) -> None:
    server.faults.update(hang_rate=1.0, hang_seconds=60)
    outcome: list[BaseException | int] = []

    def call() -> None:
        try:
            outcome.append(api.call("GET", "/subnets/7/", timeout=10).status_code)
        except requests.exceptions.RequestException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call)
    started = time.perf_counter()
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()
    server.faults.update(hang_rate=0.0)  # cleared: the hung request ends now
    thread.join(5)
    assert not thread.is_alive() and time.perf_counter() - started < 5
    assert isinstance(outcome[0], requests.exceptions.ConnectionError)
    assert api.call("GET", "/subnets/7/").status_code == 200


def test_hang_over_the_admin_api(api: Api, server: MockPhpipamServer) -> None:
    url = f"{server.base_url}/_mock/faults"
    assert requests.put(url, json={"hang_rate": 1, "hang_seconds": 30}, timeout=5).ok
    with pytest.raises(requests.exceptions.ReadTimeout):
        api.call("GET", "/subnets/7/", timeout=0.2)
    assert requests.delete(url, timeout=5).ok
    assert api.call("GET", "/subnets/7/").status_code == 200


# ------------------------------------------------------------------------------ redirect


def test_redirect_on_every_request(api: Api, server: MockPhpipamServer, store: Store) -> None:
    server.faults.update(redirect_to="https://ipam.example.org")
    response = api.call("POST", "/addresses/first_free/7/", allow_redirects=False)
    assert response.status_code == 302
    assert response.headers["Location"] == (
        "https://ipam.example.org/api/capi/addresses/first_free/7/"
    )
    login = requests.post(
        f"{api.base}/user/?x=1", auth=("Admin", "ipamadmin"), allow_redirects=False, timeout=5
    )
    assert (login.status_code, login.headers["Location"]) == (
        302,
        "https://ipam.example.org/api/capi/user/?x=1",
    )
    assert store.search_hostname("anything") == []
    assert server.faults.stats["redirects"] == 2
    server.faults.update(redirect_to=None)
    assert api.call("GET", "/subnets/7/").status_code == 200


def test_redirect_status_and_fixed_target(api: Api, server: MockPhpipamServer) -> None:
    server.faults.update(
        redirect_to="http://127.0.0.1:9/login", redirect_status=308, redirect_keep_path=False
    )
    response = api.call("GET", "/subnets/7/", allow_redirects=False)
    assert (response.status_code, response.headers["Location"]) == (308, "http://127.0.0.1:9/login")
    with pytest.raises(ValueError, match="redirect_status"):
        server.faults.update(redirect_status=200)


def test_redirect_over_the_admin_api(api: Api, server: MockPhpipamServer) -> None:
    url = f"{server.base_url}/_mock/faults"
    put = requests.put(url, json={"redirect_to": "http://elsewhere.invalid"}, timeout=5)
    assert put.json()["faults"]["redirect_to"] == "http://elsewhere.invalid"
    assert api.call("GET", "/subnets/7/", allow_redirects=False).status_code == 302
    assert requests.put(url, json={"redirect_status": 404}, timeout=5).status_code == 400
    requests.delete(url, timeout=5)
    assert api.call("GET", "/subnets/7/").status_code == 200


# ------------------------------------------------------------------------------ lock-out


def test_lockout_blocks_everything_for_the_block_time(
    api: Api, store: Store, clock: ManualClock
) -> None:
    assert store.settings.lockout  # like phpIPAM
    messages = [wrong_login(api).json()["message"] for _ in range(11)]
    assert messages == ["Invalid username or password"] * 11
    assert store.login_failures("127.0.0.1") == 11
    assert store.is_blocked("127.0.0.1")
    good = requests.post(f"{api.base}/user/", auth=("Admin", "ipamadmin"), timeout=5)
    call = api.call("GET", "/subnets/7/")
    assert (good.status_code, good.json()["message"]) == (500, BLOCKED)
    assert (call.status_code, call.json()["message"]) == (500, BLOCKED)
    assert store.lockout_stats == {"failed_logins": 11, "lockouts": 1, "blocked_requests": 2}
    dump = requests.get(f"{api.server.base_url}/_mock/state", timeout=5).json()
    assert dump["lockout"]["blocked"] == ["127.0.0.1"]
    clock.advance(299)
    assert api.call("GET", "/subnets/7/").status_code == 500
    clock.advance(2)
    assert api.call("GET", "/subnets/7/").status_code == 200
    assert not store.is_blocked("127.0.0.1")


def test_lockout_windows_are_configurable(api: Api, store: Store, clock: ManualClock) -> None:
    store.settings.login_failure_window_seconds = 10
    store.settings.block_seconds = 20
    for _ in range(10):
        wrong_login(api)
    clock.advance(11)  # the next failure starts a new count
    wrong_login(api)
    assert store.login_failures("127.0.0.1") == 1
    assert api.call("GET", "/subnets/7/").status_code == 200
    for _ in range(10):
        clock.advance(9)  # each within the window of the previous one
        wrong_login(api)
    assert store.is_blocked("127.0.0.1")
    assert api.call("GET", "/subnets/7/").json()["message"] == BLOCKED
    clock.advance(19)
    assert api.call("GET", "/subnets/7/").status_code == 500
    clock.advance(2)
    assert api.call("GET", "/subnets/7/").status_code == 200
    assert store.lockout_stats["lockouts"] == 1


def test_ten_failures_do_not_block(api: Api, store: Store) -> None:
    for _ in range(10):
        wrong_login(api)
    assert not store.is_blocked("127.0.0.1")
    assert api.call("GET", "/subnets/7/").status_code == 200
    assert store.lockout_stats == {"failed_logins": 10, "lockouts": 0, "blocked_requests": 0}


def test_lockout_switched_off(api: Api, store: Store) -> None:
    store.settings.lockout = False
    for _ in range(20):
        assert wrong_login(api).json()["message"] == "Invalid username or password"
    assert not store.is_blocked("127.0.0.1") and store.login_failures("127.0.0.1") == 0
    assert api.call("GET", "/subnets/7/").status_code == 200
    assert store.lockout_stats == {"failed_logins": 20, "lockouts": 0, "blocked_requests": 0}


def test_lockout_settings_from_a_seed(clock: ManualClock) -> None:
    seed = {
        "settings": {
            "lockout": False,
            "max_login_failures": 3,
            "login_failure_window_seconds": 5,
            "block_seconds": 7,
        }
    }
    settings = Store(seed, clock=clock).settings
    assert (settings.lockout, settings.max_login_failures) == (False, 3)
    assert (settings.login_failure_window_seconds, settings.block_seconds) == (5, 7)
