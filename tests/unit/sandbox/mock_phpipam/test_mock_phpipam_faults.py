"""Fault injection: latency, 5xx, hangs, down mode, first_free races, and the admin API."""

from __future__ import annotations

import asyncio
import ipaddress
import random
import time

import aiohttp
import pytest
import requests
from aiohttp import web
from aiohttp.test_utils import TestServer
from phpipam_mock_helpers import Api

from mock_phpipam import FaultConfig, FaultInjector, MockPhpipamServer, Store


def claim(api: Api, hostname: str) -> requests.Response:
    return api.call("POST", "/addresses/first_free/7/", json={"hostname": hostname})


def test_latency(api: Api, server: MockPhpipamServer) -> None:
    server.faults.update(latency_seconds=0.2)
    started = time.perf_counter()
    assert api.call("GET", "/subnets/7/").status_code == 200
    assert time.perf_counter() - started >= 0.2
    assert server.faults.stats["latency"] == 1


def test_injected_errors_use_the_phpipam_envelope_and_change_nothing(
    api: Api, server: MockPhpipamServer, store: Store
) -> None:
    server.faults.update(error_rate=1.0, error_statuses=[503])
    response = claim(api, "err.x")
    assert response.status_code == 503
    assert response.json() == {
        "code": 503,
        "success": False,
        "message": "Service Unavailable",
        "time": 0,
    }
    assert response.headers["Connection"] == "close"
    assert store.search_hostname("err.x") == []


def test_error_rate_is_a_share(api: Api, server: MockPhpipamServer) -> None:
    server.faults.rng = random.Random(7)
    server.faults.update(error_rate=0.5)
    statuses = [api.call("GET", "/subnets/7/").status_code for _ in range(40)]
    assert 5 < statuses.count(200) < 35
    assert set(statuses) <= {200, 500, 503}


def test_hang_until_the_client_times_out(api: Api, server: MockPhpipamServer) -> None:
    server.faults.update(hang_rate=1.0, hang_seconds=30)
    with pytest.raises(requests.exceptions.ReadTimeout):
        api.call("GET", "/subnets/7/", timeout=0.3)
    server.faults.reset()  # releases the hung request
    assert api.call("GET", "/subnets/7/").status_code == 200
    started = time.perf_counter()
    server.faults.update(hang_rate=1.0, hang_seconds=30)
    with pytest.raises(requests.exceptions.ReadTimeout):
        api.call("GET", "/subnets/7/", timeout=0.2)
    server.stop()  # stops quickly although a request hangs
    assert time.perf_counter() - started < 3


def test_down_mode_close_drops_the_connection(api: Api, server: MockPhpipamServer) -> None:
    server.faults.update(down=True)
    with pytest.raises(requests.exceptions.ConnectionError):
        api.call("GET", "/subnets/7/")
    admin = requests.get(f"{server.base_url}/_mock/faults", timeout=5)  # admin API is exempt
    assert admin.json()["faults"]["down"] is True
    server.faults.update(down=False)
    assert api.call("GET", "/subnets/7/").status_code == 200


def test_down_mode_503(api: Api, server: MockPhpipamServer) -> None:
    server.faults.update(down=True, down_mode="503")
    response = api.call("GET", "/subnets/7/")
    assert (response.status_code, response.json()["success"]) == (503, False)


def test_race_after_inserts_then_answers_409(
    api: Api, server: MockPhpipamServer, store: Store
) -> None:
    server.faults.update(race_rate=1.0, race_mode="after", race_error="conflict")
    response = claim(api, "race.after")
    assert (response.status_code, response.json()["message"]) == (409, "IP address already exists")
    assert [str(a.ip) for a in store.search_hostname("race.after")] == ["10.20.0.2"]
    assert api.call("GET", "/subnets/7/").status_code == 200  # only first_free POSTs race


def test_race_instead_inserts_nothing_and_names_the_contended_row(
    api: Api, server: MockPhpipamServer, store: Store
) -> None:
    server.faults.update(race_rate=1.0, race_mode="instead", race_error="duplicate")
    response = claim(api, "race.instead")
    decimal = int(ipaddress.ip_address("10.20.0.2"))
    assert response.status_code == 500
    assert response.json()["message"] == (
        "Error: SQLSTATE[23000]: Integrity constraint violation: 1062 Duplicate entry "
        f"'{decimal}-7' for key 'sid_ip_unique'"
    )
    assert store.search_hostname("race.instead") == []
    server.faults.reset()
    assert claim(api, "race.instead").json()["data"] == "10.20.0.2"


def test_race_after_duplicate_names_the_inserted_address(
    api: Api, server: MockPhpipamServer, store: Store
) -> None:
    server.faults.update(race_rate=1.0, race_error="duplicate")
    message = claim(api, "race.dup").json()["message"]
    inserted = store.search_hostname("race.dup")[0].ip
    assert f"'{int(inserted)}-7'" in message


def test_admin_api(server: MockPhpipamServer) -> None:
    url = f"{server.base_url}/_mock/faults"
    changed = requests.put(url, json={"latency_seconds": 0.01, "race_rate": 0.5}, timeout=5)
    assert changed.status_code == 200
    assert changed.json()["faults"]["race_rate"] == 0.5
    assert server.faults.config.latency_seconds == 0.01
    bad = requests.put(url, json={"error_rate": 2}, timeout=5)
    unknown = requests.put(url, json={"nope": 1}, timeout=5)
    assert bad.status_code == 400 and unknown.status_code == 400
    assert server.faults.config.error_rate == 0.0
    assert requests.delete(url, timeout=5).json()["faults"] == FaultConfig().model_dump(mode="json")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="5xx"):
        FaultConfig(error_statuses=(404,))
    injector = FaultInjector()
    with pytest.raises(ValueError, match="hang_rate"):
        injector.update(hang_rate=-1)


def test_injector_is_generic() -> None:
    """A WAPI-like mock reuses the middleware with its own error body."""

    def wapi_error(status: int, message: str) -> web.Response:
        return web.json_response(
            {"Error": f"AdmConProtoError: {message}", "code": "x"}, status=status
        )

    async def scenario() -> tuple[int, dict[str, str], int]:
        injector = FaultInjector(
            FaultConfig(error_rate=1.0, error_statuses=(502,)), error_response=wapi_error
        )
        app = web.Application(middlewares=[injector.middleware])

        async def ok(_: web.Request) -> web.Response:
            return web.json_response({"ok": True})

        app.router.add_get("/wapi/v2.12/network", ok)
        injector.add_routes(app)
        async with TestServer(app, host="127.0.0.1", port=0) as srv, aiohttp.ClientSession() as s:
            async with s.get(srv.make_url("/wapi/v2.12/network")) as failed:
                body = await failed.json()
                status = failed.status
            injector.reset()
            async with s.get(srv.make_url("/wapi/v2.12/network")) as passed:
                return status, body, passed.status

    status, body, after = asyncio.run(scenario())
    assert (status, body["Error"], after) == (502, "AdmConProtoError: Bad Gateway", 200)


def test_journal_records_api_requests_and_injected_faults() -> None:
    import requests

    from mock_phpipam.server import MockPhpipamServer
    from mock_phpipam.store import Store

    store = Store(
        {
            "users": [{"username": "u", "password": "p"}],
            "apps": [{"id": "capi", "permissions": 2, "security": "none"}],
            "sections": [{"id": 1, "name": "s", "subnets": [{"id": 7, "cidr": "10.0.0.0/29"}]}],
        }
    )
    with MockPhpipamServer(store) as server:
        token = requests.post(f"{server.app_url('capi')}/user/", auth=("u", "p"), timeout=5).json()[
            "data"
        ]["token"]
        headers = {"token": token}
        requests.post(
            f"{server.app_url('capi')}/addresses/first_free/7/",
            headers=headers,
            json={"hostname": "a"},
            timeout=5,
        )
        requests.get(f"{server.app_url('capi')}/subnets/7/", headers=headers, timeout=5)
        server.faults.update(error_rate=1.0)
        requests.get(f"{server.app_url('capi')}/subnets/7/", headers=headers, timeout=5)
        requests.get(f"{server.base_url}/_mock/state", timeout=5)
    entries = store.requests()
    assert [(e.method, e.status) for e in entries] == [
        ("POST", 200),
        ("POST", 201),
        ("GET", 200),
        ("GET", entries[-1].status),
    ]
    assert entries[-1].status >= 500
    assert [e.path for e in store.requests(writes_only=True)] == [
        "/api/capi/addresses/first_free/7/"
    ]
    store.clear_journal()
    assert store.requests() == []
