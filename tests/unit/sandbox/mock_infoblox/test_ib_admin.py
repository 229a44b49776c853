"""Admin API (/_mock/state, /_mock/faults), fault injection, the server runner and the CLI."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
from ib_helpers import PASSWORD, USER, Wapi, host_body

from mock_infoblox import InfobloxStore, MockInfobloxServer, infoblox_faults
from mock_infoblox.__main__ import main

EXAMPLE = Path(__file__).resolve().parents[4] / "sandbox" / "mock_infoblox" / "seed.example.yaml"


def test_state_dump_has_objects_and_no_secrets(wapi: Wapi, server: MockInfobloxServer) -> None:
    wapi.post("record:host", host_body("m1.default"))
    dump = requests.get(f"{server.url}/_mock/state", timeout=5).json()
    assert [h["name"] for h in dump["objects"]["record:host"]] == ["m1.default"]
    assert dump["users"] == [USER]
    assert dump["sessions"] >= 1
    assert PASSWORD not in str(dump)


def test_state_reset_and_seed(wapi: Wapi, server: MockInfobloxServer) -> None:
    wapi.post("record:host", host_body("m1.default"))
    seed = {"networks": [{"network": "192.0.2.0/28"}]}
    dump = requests.post(f"{server.url}/_mock/state", json={"seed": seed}, timeout=5).json()
    assert "record:host" not in dump["objects"]
    assert [n["network"] for n in dump["objects"]["network"]] == ["192.0.2.0/28"]
    assert [n["network"] for n in wapi.get("network").json()] == ["192.0.2.0/28"]


def test_bad_seed_is_400(server: MockInfobloxServer, store: InfobloxStore) -> None:
    response = requests.post(
        f"{server.url}/_mock/state", json={"reset": False, "seed": {"bogus": 1}}, timeout=5
    )
    assert response.status_code == 400
    assert "bogus" in response.json()["error"]


def test_injected_errors_are_html_5xx(wapi: Wapi, server: MockInfobloxServer) -> None:
    put = requests.put(
        f"{server.url}/_mock/faults", json={"error_rate": 1.0, "error_statuses": [503]}, timeout=5
    )
    assert put.status_code == 200
    response = wapi.post("record:host", host_body("m1.default"))
    assert response.status_code == 503
    assert response.headers["Content-Type"].startswith("text/html")
    requests.delete(f"{server.url}/_mock/faults", timeout=5)
    assert wapi.get("record:host").json() == []  # the faulted create changed nothing


def test_race_after_mode_creates_then_answers_conflict(
    wapi: Wapi, server: MockInfobloxServer
) -> None:
    server.faults.update(race_rate=1.0, race_mode="after")
    response = wapi.post("record:host", host_body("m1.default"))
    server.faults.reset()
    assert response.status_code == 400
    assert response.json()["code"] == "Client.Ibap.Data.Conflict"
    assert response.json()["text"] == "The record 'm1.default' already exists."
    assert [r["name"] for r in wapi.get("record:host").json()] == ["m1.default"]


def test_race_instead_mode_creates_nothing(wapi: Wapi, server: MockInfobloxServer) -> None:
    server.faults.update(race_rate=1.0, race_mode="instead")
    response = wapi.post("fixedaddress", {"ipv4addr": "func:nextavailableip:10.20.0.0/24,default",
                                          "mac": "00:00:00:00:00:00"})  # fmt: skip
    server.faults.reset()
    assert response.status_code == 400
    assert response.json()["code"] == "Client.Ibap.Data.Conflict"
    assert wapi.get("fixedaddress").json() == []


def test_server_stops_quickly_and_frees_port() -> None:
    server = MockInfobloxServer(faults=infoblox_faults(hang_rate=1.0, hang_seconds=30))
    server.start()
    url = server.url
    with pytest.raises(requests.ReadTimeout):
        requests.get(f"{url}/wapi/v2.12/network", timeout=0.3)  # hangs, then the client gives up
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 3
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/_mock/health", timeout=1)


def test_https_with_trustme() -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    context = __import__("ssl").create_default_context(__import__("ssl").Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    with MockInfobloxServer(ssl_context=context) as server, ca.cert_pem.tempfile() as bundle:
        assert server.url.startswith("https://127.0.0.1:")
        response = requests.get(
            f"{server.url}/wapi/v2.12/network", auth=("admin", "infoblox"), verify=bundle,
            timeout=5,
        )  # fmt: skip
        assert response.status_code == 200


def test_example_seed_loads() -> None:
    store = InfobloxStore.from_yaml(EXAMPLE)
    objects = store.dump()["objects"]
    assert {"network", "ipv6network", "range", "record:host", "fixedaddress"} <= set(objects)
    # The pre-registered host got its address through func:nextavailableip.
    hosts = {h["name"]: h for h in objects["record:host"]}
    assert hosts["pre-registered.default"]["ipv4addrs"][0]["ipv4addr"].startswith("10.20.0.")


def test_cli_rejects_a_bad_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "seed.yaml"
    bad.write_text("networks: [{network: 10.0.0.0/24}]\nbogus: 1\n", encoding="utf-8")
    assert main(["--seed", str(bad), "--port", "0"]) == 2
    assert "bogus" in capsys.readouterr().err
