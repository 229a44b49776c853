"""Token flow, sliding expiry via the injectable clock, lock-out, app security modes.

Expected answers come from phpipam-api.md sections 1, 9, 10g and 11, and from phpIPAM's
``api/controllers/User.php`` (60 s write throttling of the sliding expiry).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import requests
from phpipam_mock_helpers import Api

from mock_phpipam import ManualClock, MockPhpipamServer, Store

SIX_HOURS = 21600


def expires_of(clock_time: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(clock_time)))


def test_login_gives_24_char_token_valid_six_hours(
    server: MockPhpipamServer, clock: ManualClock
) -> None:
    response = requests.post(
        f"{server.app_url('capi')}/user/", auth=("Admin", "ipamadmin"), timeout=5
    )
    data = response.json()["data"]
    assert list(data) == ["token", "expires"]
    assert len(data["token"]) == 24
    assert set(data["token"]) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    )
    assert data["expires"] == expires_of(clock() + SIX_HOURS)


def test_login_while_valid_returns_same_token_and_slides(api: Api, clock: ManualClock) -> None:
    first = api.token
    clock.advance(3600)
    response = api.session.post(f"{api.base}/user/", auth=("Admin", "ipamadmin"), timeout=5)
    assert response.json()["data"] == {"token": first, "expires": expires_of(clock() + SIX_HOURS)}


def test_parallel_logins_share_one_token(server: MockPhpipamServer) -> None:
    def login(_: int) -> str:
        response = requests.post(
            f"{server.app_url('capi')}/user/", auth=("Admin", "ipamadmin"), timeout=5
        )
        return str(response.json()["data"]["token"])

    with ThreadPoolExecutor(20) as pool:
        tokens = set(pool.map(login, range(20)))
    assert len(tokens) == 1
    ok = requests.get(
        f"{server.app_url('capi')}/subnets/7/", headers={"token": tokens.pop()}, timeout=5
    )
    assert ok.status_code == 200


def test_sliding_expiry_writes_only_when_it_moves_60_seconds(api: Api, clock: ManualClock) -> None:
    login_expiry = expires_of(clock() + SIX_HOURS)
    clock.advance(59)
    assert api.call("PATCH", "/user/").json()["data"]["expires"] == login_expiry  # 9a
    assert api.call("GET", "/subnets/7/").status_code == 200
    assert api.call("GET", "/user/").json()["data"]["expires"] == login_expiry
    clock.advance(1)
    assert api.call("GET", "/subnets/7/").status_code == 200  # 9g: any call slides
    assert api.call("GET", "/user/token_expires/").json()["data"]["expires"] == expires_of(
        clock() + SIX_HOURS
    )


def test_get_user_does_not_slide(api: Api, clock: ManualClock) -> None:
    login_expiry = expires_of(clock() + SIX_HOURS)
    clock.advance(600)
    assert api.call("GET", "/user/").json()["data"]["expires"] == login_expiry


def test_expired_token(api: Api, clock: ManualClock, store: Store) -> None:
    old = api.token
    clock.advance(SIX_HOURS + 1)
    response = api.call("GET", "/subnets/7/")  # 9h
    assert (response.status_code, response.headers["Location"]) == (401, "/api//user/")
    assert response.json()["message"] == "Unauthorized"
    assert (
        api.call("POST", "/addresses/first_free/7/", json={"hostname": "expired.x"}).status_code
        == 401
    )
    for method in ("PATCH", "GET"):  # 9j, 9k: refresh does not revive it
        response = api.call(method, "/user/")
        assert (response.status_code, response.json()["message"]) == (403, "Token expired")
        assert "Connection" not in response.headers
    new = api.login()  # 9l
    assert new != old
    api.token = old
    assert api.call("GET", "/subnets/7/").status_code == 401  # 9m
    assert store.search_hostname("expired.x") == []


def test_logout_removes_the_token_for_everyone(api: Api) -> None:
    response = api.call("DELETE", "/user/")  # 9n
    assert response.json()["data"] == ["Token removed"]
    assert api.call("GET", "/subnets/7/").status_code == 401  # 9o
    again = api.call("DELETE", "/user/")  # 9p
    assert (again.status_code, again.json()["message"]) == (403, "Invalid token")


def test_user_controller_token_errors(server: MockPhpipamServer) -> None:
    base = server.app_url("capi")
    missing = requests.patch(f"{base}/user/", timeout=5)
    bogus = requests.patch(f"{base}/user/", headers={"token": "bogus"}, timeout=5)
    assert (missing.status_code, missing.json()["message"]) == (403, "Please provide token")
    assert (bogus.status_code, bogus.json()["message"]) == (403, "Invalid token")


def test_phpipam_token_header_wins_over_token(api: Api) -> None:
    response = api.call(
        "GET", "/subnets/7/", headers={"token": "bogus", "phpipam-token": api.token}
    )
    assert response.status_code == 200


def test_lockout_after_more_than_ten_failures(api: Api, clock: ManualClock) -> None:
    base = api.base
    messages = [
        requests.post(f"{base}/user/", auth=("Admin", "wrong"), timeout=5).json()["message"]
        for _ in range(12)
    ]
    blocked = "Your IP has been blocked for 5 minutes because of excessive login failures"
    assert messages[:11] == ["Invalid username or password"] * 11
    assert messages[11] == blocked
    good = requests.post(f"{base}/user/", auth=("Admin", "ipamadmin"), timeout=5)  # 11a
    call = api.call("GET", "/subnets/7/")  # 11b
    assert (good.status_code, good.json()["message"]) == (500, blocked)
    assert (call.status_code, call.json()["message"], call.headers["Connection"]) == (
        500,
        blocked,
        "close",
    )
    clock.advance(301)
    assert api.call("GET", "/subnets/7/").status_code == 200


def test_successful_login_clears_the_failure_count(api: Api) -> None:
    for _ in range(10):
        requests.post(f"{api.base}/user/", auth=("Admin", "wrong"), timeout=5)
    api.login()
    for _ in range(10):
        requests.post(f"{api.base}/user/", auth=("Admin", "wrong"), timeout=5)
    assert api.call("GET", "/subnets/7/").status_code == 200


def test_api_disabled(api: Api, store: Store) -> None:
    store.settings.api_enabled = False  # 10g
    response = api.call("GET", "/subnets/7/")
    assert (response.status_code, response.json()["message"]) == (503, "API server disabled")
    assert response.headers["Connection"] == "close"


def test_ssl_code_app_uses_the_static_app_code(server: MockPhpipamServer) -> None:
    base = server.app_url("capicode")
    ok = requests.get(f"{base}/subnets/7/", headers={"token": "static-app-code-0123"}, timeout=5)
    wrong = requests.get(f"{base}/subnets/7/", headers={"token": "nope"}, timeout=5)
    login = requests.post(f"{base}/user/", auth=("Admin", "ipamadmin"), timeout=5)
    assert ok.status_code == 200 and ok.json()["data"]["id"] == 7
    assert (wrong.status_code, wrong.headers["Location"]) == (401, "/api//user/")
    assert (login.status_code, login.json()["message"]) == (409, "Authentication not needed")


def test_ssl_apps_need_https_when_enforced(server: MockPhpipamServer, store: Store) -> None:
    store.settings.enforce_ssl = True
    for app in ("capicode", "capissl"):
        response = requests.get(
            f"{server.app_url(app)}/subnets/7/", headers={"token": "x"}, timeout=5
        )
        assert (response.status_code, response.json()["message"]) == (
            503,
            "SSL connection is required for API",
        )


def test_disabled_app(server: MockPhpipamServer, store: Store) -> None:
    store.add_app("off", permissions=0)
    response = requests.get(f"{server.app_url('off')}/subnets/7/", timeout=5)
    assert (response.status_code, response.json()["message"]) == (503, "Application disabled")


def test_tokens_never_appear_in_the_state_dump(api: Api) -> None:
    dump = api.session.get(f"{api.server.base_url}/_mock/state", timeout=5)
    assert api.token is not None and api.token not in dump.text
    assert "ipamadmin" not in dump.text and "static-app-code-0123" not in dump.text
    assert dump.json()["users"][0]["has_token"] is True
