"""Fixtures of the e2e tests: a Kubernetes API server through a kubeconfig, IPAM targets.

The API server (`api_server`) is the cluster of ``KUBECONFIG`` when it is set; otherwise the
in-memory one of `mock_kubernetes` (our CRDs and CAPI's), started once per session on
127.0.0.1 with a kubeconfig of its own, so that the suite runs in every ``make test`` and a
change of the operator's or the API server's behaviour breaks it. The tests talk to either
only through the kubeconfig, with the official client. With ``KUBECONFIG``, the session
applies the CRDs (``crds/``, and ``crds/capi/`` when CAPI's are absent). Each test gets a
fresh namespace (deleted afterwards) and can run the real operator in a thread of this
process (`operator`), against mock_phpipam on 127.0.0.1 (the operator, not a pod, makes the
IPAM calls, so 127.0.0.1 is reachable). With ``PHPIPAM_URL`` (see
`e2e_support.phpipam_target_from_env`), `real_phpipam` is that server (the tests that need a
real one skip without it) and `phpipam` is it too; without it `phpipam` is mock_phpipam.

Optional: ``IPAM_BRIDGE_E2E_TIMEOUT`` (seconds per step, default 90),
``IPAM_BRIDGE_E2E_KEEP_CRDS=1`` (do not delete the CRDs this session created).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import (
    CREDENTIALS,
    E2E_ENV,
    ApiServer,
    ClusterKube,
    IpamTarget,
    OperatorThread,
    apply_crds,
    delete_crds,
    in_memory_api_server,
    mock_target,
    operator_environment,
    phpipam_target_from_env,
    unique_name,
)

#: mock phpIPAM: subnet 7 is a /24 with a gateway, 9 a /30 (two usable hosts).
PHPIPAM_SEED: dict[str, Any] = {
    "users": [{"username": CREDENTIALS["username"], "password": CREDENTIALS["password"]}],
    "apps": [{"id": "capi", "permissions": 2, "security": "none"}],
    "sections": [
        {
            "id": 3,
            "name": "capi-e2e",
            "subnets": [
                {"id": 7, "cidr": "10.20.0.0/24", "gateway": "10.20.0.1"},
                {"id": 9, "cidr": "10.20.1.0/30"},
            ],
        }
    ],
}

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this directory ``e2e`` (``-m "not e2e"`` leaves them out)."""
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


# ------------------------------------------------------------------------------- cluster


@pytest.fixture(scope="session")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """The API server of the session: ``KUBECONFIG``'s cluster, else an in-memory one."""
    path = E2E_ENV.get("KUBECONFIG")
    if path:
        yield ApiServer(kubeconfig=path, emulator=None)
        return
    with in_memory_api_server(tmp_path_factory.mktemp("e2e-api-server")) as server:
        yield server


@pytest.fixture(scope="session")
def cluster_api(api_server: ApiServer) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` of `api_server`, with our CRDs applied.

    Fails when the API server does not answer (a misconfiguration should not pass as a
    skip). The in-memory API server serves the CRDs from its start (and shows them as
    CustomResourceDefinition objects; one applied through the API would serve nothing).
    """
    path = api_server.kubeconfig
    from kubernetes.client import ApisApi

    from bridge.runtime.gateway import api_client
    from bridge.runtime.kubeconfig import load_configuration

    api = api_client(load_configuration(path))
    try:
        ApisApi(api).get_api_versions(_request_timeout=15)
    except Exception as exc:  # no message: it could quote a kubeconfig's credentials
        api.close()  # type: ignore[no-untyped-call]
        status = getattr(exc, "status", None)
        pytest.fail(
            f"the API server of the kubeconfig {path} does not answer API discovery: "
            f"{type(exc).__name__}{f' {status}' if status else ''}"
        )
    created = apply_crds(api) if api_server.emulator is None else []
    yield api
    if created and E2E_ENV.get("IPAM_BRIDGE_E2E_KEEP_CRDS") not in ("1", "true"):
        delete_crds(api, created)
    api.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="session")
def cluster(cluster_api: Any) -> ClusterKube:
    """Helpers on the cluster (same names as `mock_kubernetes.Sandbox`), CAPI version found."""
    return ClusterKube.discover(cluster_api)


@pytest.fixture
def namespace(cluster: ClusterKube) -> Iterator[str]:
    """A fresh namespace, deleted (finalizers of leftovers dropped first) after the test."""
    name = unique_name("ipam-bridge-e2e")
    cluster.create_namespace(name)
    yield name
    if not cluster.delete_namespace(name):
        import warnings

        warnings.warn(f"namespace {name} is still terminating", stacklevel=1)


@pytest.fixture
def operator(
    api_server: ApiServer,
    cluster: ClusterKube,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[..., OperatorThread]]:
    """Start the real operator for `namespace`: ``operator(settings={...})``; stopped after."""
    started: list[OperatorThread] = []

    def start(settings: dict[str, str] | None = None) -> OperatorThread:
        monkeypatch.setenv("KUBECONFIG", api_server.kubeconfig)
        for key, value in operator_environment(namespace, settings).items():
            monkeypatch.setenv(key, value)
        thread = OperatorThread(namespace)
        thread.start()
        started.append(thread)
        return thread

    yield start
    for thread in reversed(started):
        thread.stop()


# --------------------------------------------------------------------------------- IPAM


@pytest.fixture
def mock_phpipam() -> Iterator[IpamTarget]:
    """mock_phpipam on 127.0.0.1 (seed `PHPIPAM_SEED`), as a target on subnet 7."""
    from mock_phpipam.server import MockPhpipamServer
    from mock_phpipam.store import Store

    with MockPhpipamServer(Store(copy.deepcopy(PHPIPAM_SEED))) as server:
        yield mock_target(
            server, app_id="capi", subnet_id=7, credentials=CREDENTIALS, small_subnet_id=9
        )


@pytest.fixture(scope="session")
def real_phpipam() -> IpamTarget:
    """The phpIPAM of ``PHPIPAM_URL`` and friends; skips when ``PHPIPAM_URL`` is not set."""
    try:
        target = phpipam_target_from_env()
    except ValueError as exc:
        pytest.fail(str(exc))
    if target is None:
        pytest.skip("PHPIPAM_URL is not set: no real phpIPAM to run the phpIPAM e2e tests on")
    return target


@pytest.fixture
def phpipam(request: pytest.FixtureRequest) -> IpamTarget:
    """The phpIPAM of ``PHPIPAM_URL`` when it is set, else a fresh `mock_phpipam`."""
    fixture = "real_phpipam" if E2E_ENV.get("PHPIPAM_URL") else "mock_phpipam"
    target: IpamTarget = request.getfixturevalue(fixture)
    return target
