"""Authentication, session cookie, WAPI version and the 401/400 non-JSON answers (B.1, B.2)."""

from __future__ import annotations

import re

import requests
from ib_helpers import PASSWORD, USER, Wapi

from mock_infoblox import InfobloxStore, MockInfobloxServer

COOKIE_RE = re.compile(
    r'^ibapauth="ip=[^,]+,client=API,group=[^,]+,ctime=(\d+),timeout=(\d+),mtime=\d+,su=1,'
    r'auth=LOCAL,user=([^,]+),[^"]+"; httponly; Path=/$'
)


def test_basic_auth_sets_ibapauth_cookie(wapi: Wapi, store: InfobloxStore) -> None:
    response = wapi.get("network")
    assert response.status_code == 200
    match = COOKIE_RE.match(response.headers["Set-Cookie"])
    assert match is not None, response.headers["Set-Cookie"]
    assert int(match.group(2)) == store.session_timeout
    assert match.group(3) == USER
    assert PASSWORD not in response.headers["Set-Cookie"]


def test_cookie_alone_authenticates_until_logout(wapi: Wapi) -> None:
    wapi.get("network")
    cookie_only = requests.Session()
    cookie_only.cookies.update(wapi.session.cookies)
    assert cookie_only.get(f"{wapi.url}/network", timeout=5).status_code == 200
    assert cookie_only.post(f"{wapi.url}/logout", timeout=5).status_code == 200
    again = requests.get(f"{wapi.url}/network", cookies=wapi.session.cookies, timeout=5)
    assert again.status_code == 401


def test_wrong_password_is_401_html(wapi: Wapi) -> None:
    response = requests.get(f"{wapi.url}/network", auth=(USER, "wrong"), timeout=5)
    assert response.status_code == 401
    assert response.headers["Content-Type"].startswith("text/html")
    assert "401 Authorization Required" in response.text
    assert response.headers["WWW-Authenticate"].startswith("Basic")
    assert "Set-Cookie" not in response.headers


def test_no_credentials_is_401(wapi: Wapi) -> None:
    response = requests.get(f"{wapi.url}/network", timeout=5)
    assert response.status_code == 401
    assert "<html>" in response.text


def test_cookie_expires_after_session_timeout() -> None:
    now = [1_700_000_000.0]
    store = InfobloxStore(users={USER: PASSWORD}, session_timeout=60, clock=lambda: now[0])
    with MockInfobloxServer(store) as server:
        first = requests.get(f"{server.url}/wapi/v2.12/network", auth=(USER, PASSWORD), timeout=5)
        assert first.status_code == 200
        cookies = first.cookies
        assert (
            requests.get(f"{server.url}/wapi/v2.12/network", cookies=cookies, timeout=5).status_code
            == 200
        )
        now[0] += 60
        expired = requests.get(f"{server.url}/wapi/v2.12/network", cookies=cookies, timeout=5)
        assert expired.status_code == 401
        assert "Authorization Required" in expired.text


def test_expire_sessions_admin_endpoint(wapi: Wapi, server: MockInfobloxServer) -> None:
    wapi.get("network")
    jar = wapi.session.cookies
    answer = requests.post(f"{server.url}/_mock/sessions/expire", timeout=5).json()
    assert answer["expired"] >= 1
    response = requests.get(f"{wapi.url}/network", cookies=jar, timeout=5)
    assert response.status_code == 401
    # Basic auth still works and opens a new session.
    assert wapi.get("network").status_code == 200


def test_unsupported_version_is_plain_text_400(server: MockInfobloxServer, store: object) -> None:
    response = requests.get(f"{server.url}/wapi/v2.99/network", auth=(USER, PASSWORD), timeout=5)
    assert response.status_code == 400
    assert response.headers["Content-Type"].startswith("text/plain")
    assert response.text == "Version 2.99 not supported"


def test_older_versions_are_served(server: MockInfobloxServer, store: object) -> None:
    for version in ("v2.7", "v2.10.5", "v2.12.3"):
        assert Wapi(server.url, version).get("network").status_code == 200
    assert Wapi(server.url, "v2.13").get("network").status_code == 400
    assert Wapi(server.url, "latest").get("network").status_code == 400
