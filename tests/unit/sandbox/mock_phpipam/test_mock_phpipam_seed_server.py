"""Seeding (YAML, JSON, flags), the /_mock/state admin API, the runner and the console script."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import trustme
import yaml
from phpipam_mock_helpers import SEED, Api
from pydantic import ValidationError

import mock_phpipam
from mock_phpipam import MockPhpipamServer, Seed, Store
from mock_phpipam.__main__ import build_parser, build_store, main
from mock_phpipam.store import StoreSettings

EXAMPLE = Path(mock_phpipam.__file__).parent / "seed.example.yaml"


def test_yaml_and_json_seeds_give_the_same_state(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SEED))
    (tmp_path / "s.json").write_text(json.dumps(SEED))
    from_yaml = Store.from_file(tmp_path / "s.yaml").dump()
    from_json = Store.from_file(tmp_path / "s.json").dump()
    assert from_yaml == from_json
    subnets = from_yaml["sections"][0]["subnets"]
    assert [s["cidr"] for s in subnets][:3] == ["10.20.0.0/24", "2001:db8:20::/64", "10.20.1.0/30"]
    assert subnets[0]["addresses"][0]["id"] == 11


def test_example_seed_is_valid_and_serves(tmp_path: Path) -> None:
    store = Store.from_file(EXAMPLE)
    with MockPhpipamServer(store) as server:
        api = Api(server)
        api.login()
        subnet = api.call("GET", "/subnets/7/").json()["data"]
        adopted = api.call("GET", "/addresses/search_hostname/reserved.by-network-team/").json()
        coded = requests.get(
            f"{server.app_url('capicode')}/subnets/9/",
            headers={"token": "change-me-app-code-0123"},
            timeout=5,
        )
    assert subnet["gateway"]["ip_addr"] == "10.20.0.1"
    assert adopted["data"][0]["ip"] == "10.20.0.10"
    assert coded.json()["data"]["calculation"]["Number of hosts"] == "2"


@pytest.mark.parametrize(
    "bad",
    [
        {"sections": [{"name": "s", "subnets": [{"cidr": "10.0.0.1/24"}]}]},
        {"sections": [{"name": "s", "subnets": [{"cidr": "10.0.0.0/24", "gateway": "10.9.9.9"}]}]},
        {"apps": [{"id": "x", "security": "ssl_code"}]},
    ],
)
def test_invalid_seed_objects_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Store(bad)


def test_unknown_seed_keys_are_rejected() -> None:
    with pytest.raises(ValidationError):
        Seed.model_validate({"subnets": []})


def test_state_admin_reset_clear_seed(api: Api, store: Store) -> None:
    url = f"{api.server.base_url}/_mock/state"
    api.call("POST", "/addresses/first_free/7/", json={"hostname": "tmp"})
    assert store.search_hostname("tmp")
    reset = requests.post(url, json={"action": "reset"}, timeout=5)
    assert reset.status_code == 200 and not store.search_hostname("tmp")
    assert api.call("GET", "/subnets/7/").status_code == 401  # tokens are gone too
    seeded = requests.post(
        url,
        json={
            "action": "seed",
            "seed": {
                "sections": [
                    {"id": 3, "name": "capi-test", "subnets": [{"id": 50, "cidr": "10.50.0.0/24"}]}
                ]
            },
        },
        timeout=5,
    )
    assert 50 in store.subnets and seeded.json()["sections"][0]["subnets"][-1]["id"] == 50
    bad = requests.post(url, json={"action": "seed", "seed": {"bogus": 1}}, timeout=5)
    dup = requests.post(
        url,
        json={
            "action": "seed",
            "seed": {
                "sections": [
                    {"id": 3, "name": "capi-test", "subnets": [{"id": 50, "cidr": "10.51.0.0/24"}]}
                ]
            },
        },
        timeout=5,
    )
    nonsense = requests.post(url, json={"action": "explode"}, timeout=5)
    assert (bad.status_code, dup.status_code, nonsense.status_code) == (400, 400, 400)
    cleared = requests.post(url, json={"action": "clear"}, timeout=5).json()
    assert cleared["sections"] == [] and cleared["users"] == []


def test_store_python_api_reset_keeps_the_initial_seed() -> None:
    store = Store(SEED, settings=StoreSettings(stringify_results=True))
    store.add_subnet("10.60.0.0/24")
    store.settings.legacy_not_found = True
    store.reset()
    assert sorted(store.subnets) == [7, 8, 9, 10, 11, 12]
    assert store.settings.stringify_results and not store.settings.legacy_not_found


def test_runner_urls_and_lifecycle(store: Store) -> None:
    server = MockPhpipamServer(store)
    with pytest.raises(RuntimeError):
        _ = server.url
    with server:
        port = server.port
        assert port > 0 and server.url == f"http://127.0.0.1:{port}/api"
        assert requests.get(f"{server.base_url}/_mock/health", timeout=5).json() == {"status": "ok"}
        with pytest.raises(RuntimeError):
            server.start()
    server.stop()  # idempotent
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/_mock/health", timeout=1)


def test_runner_serves_https(store: Store, tmp_path: Path) -> None:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    store.settings.enforce_ssl = True
    with MockPhpipamServer(store, ssl_context=context) as server:
        assert server.url.startswith("https://")
        response = requests.get(
            f"{server.app_url('capicode')}/subnets/7/",
            headers={"token": "static-app-code-0123"},
            verify=str(tmp_path / "ca.pem"),
            timeout=5,
        )
    assert response.status_code == 200


def test_cli_defaults() -> None:
    store = build_store(build_parser().parse_args([]))
    assert list(store.apps) == ["capi"] and store.find_user("Admin") is not None
    assert [s.cidr for s in store.subnets.values()] == ["10.20.0.0/24"]
    assert str(store.gateway_of(1).ip) == "10.20.0.1"  # type: ignore[union-attr]


def test_cli_flags_on_top_of_a_seed() -> None:
    args = build_parser().parse_args(
        [
            "--seed",
            str(EXAMPLE),
            "--app-id",
            "other",
            "--username",
            "svc",
            "--password",
            "pw",
            "--subnet",
            "10.70.0.0/24",
            "--subnet",
            "10.71.0.0/24",
            "--gateway",
            "10.71.0.254",
            "--stringify-results",
        ]
    )
    store = build_store(args)
    assert {"capi", "capiro", "capicode", "other"} <= set(store.apps)
    assert store.find_user("svc") is not None and store.settings.stringify_results
    new = {s.cidr: s for s in store.subnets.values()}
    assert store.gateway_of(new["10.70.0.0/24"].id) is None
    assert str(store.gateway_of(new["10.71.0.0/24"].id).ip) == "10.71.0.254"  # type: ignore[union-attr]


def test_cli_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad_seed = tmp_path / "bad.yaml"
    bad_seed.write_text("users: [{username: a}]\n")
    assert main(["--seed", str(bad_seed)]) == 2
    assert main(["--subnet", "10.1.0.0/24", "--gateway", "10.2.0.1"]) == 2
    assert "--gateway 10.2.0.1" in capsys.readouterr().err


def test_console_script_serves_and_never_prints_the_password(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mock_phpipam",
            "--port",
            str(port),
            "--password",
            "s3cret-pw",
            "--subnet",
            "10.80.0.0/24",
            "--gateway",
            "10.80.0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                requests.get(f"http://127.0.0.1:{port}/_mock/health", timeout=1)
                break
            except requests.exceptions.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
        login = requests.post(
            f"http://127.0.0.1:{port}/api/capi/user/", auth=("Admin", "s3cret-pw"), timeout=5
        )
        token = login.json()["data"]["token"]
        subnet = requests.get(
            f"http://127.0.0.1:{port}/api/capi/subnets/1/", headers={"token": token}, timeout=5
        )
        assert subnet.json()["data"]["gateway"]["ip_addr"] == "10.80.0.1"
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=10)
    assert "serving phpIPAM API" in output
    assert "s3cret-pw" not in output and token not in output


def test_container_files_are_consistent() -> None:
    here = EXAMPLE.parent
    compose = yaml.safe_load((here / "docker-compose.yml").read_text())
    mock, operator = compose["services"]["phpipam-mock"], compose["services"]["operator"]
    assert operator["profiles"] == ["operator"] and "profiles" not in mock
    assert mock["build"]["dockerfile"] == "sandbox/mock_phpipam/Dockerfile"
    assert (here / mock["volumes"][0].split(":")[0]).resolve() == EXAMPLE.resolve()
    args = build_parser().parse_args(mock["command"])
    assert (args.host, args.port, args.seed) == ("0.0.0.0", 8080, "/etc/mock-phpipam/seed.yaml")
    dockerfile = (here / "Dockerfile").read_text()
    assert "USER 65532" in dockerfile and 'ENTRYPOINT ["mock-phpipam"]' in dockerfile
    cmd = json.loads(dockerfile.split("\nCMD ", 1)[1].splitlines()[0])
    assert cmd == mock["command"]
