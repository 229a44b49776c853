"""Two management clusters, one phpIPAM subnet, the same names and no suffix (issue 36).

The clusters are the API servers of two kubeconfigs: ``KUBECONFIG`` and ``KUBECONFIG_SECOND``
(two real clusters; the test skips when only the first is set). Without ``KUBECONFIG`` both
are in-memory API servers (`mock_kubernetes`) started for the test. One operator runs per
cluster (a thread of this process each, namespaced, as in the other e2e tests), both on the
phpIPAM of ``PHPIPAM_URL`` (else mock_phpipam). The second cluster's claims of the same names
are refused (Ready=False ``HostnameTaken``, a Warning Event); no address is held twice; the
first cluster's releases leave the second's entries alone; each entry names its cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2e_support import (
    E2E_ENV,
    STEP_TIMEOUT,
    ApiServer,
    ClusterKube,
    IpamTarget,
    OperatorThread,
    apply_crds,
    delete_crds,
    in_memory_api_server,
    operator_environment,
    ready_condition,
)

from mock_kubernetes.sandbox import wait_for

NAMES = ("m0", "m1")


@pytest.fixture
def second_api_server(
    api_server: ApiServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiServer]:
    """The second management cluster: ``KUBECONFIG_SECOND``'s, or a second in-memory one.

    Skips when ``KUBECONFIG`` names a real cluster and ``KUBECONFIG_SECOND`` is not set.
    """
    path = E2E_ENV.get("KUBECONFIG_SECOND")
    if path:
        yield ApiServer(kubeconfig=path, emulator=None)
        return
    if api_server.emulator is None:
        pytest.skip("KUBECONFIG_SECOND is not set: no second management cluster")
    with in_memory_api_server(tmp_path_factory.mktemp("e2e-second-api-server")) as server:
        yield server


@pytest.fixture
def second_cluster(second_api_server: ApiServer, namespace: str) -> Iterator[ClusterKube]:
    """Helpers on the second cluster (CRDs applied when real), with `namespace` created."""
    from bridge.runtime.gateway import api_client
    from bridge.runtime.kubeconfig import load_configuration

    api = api_client(load_configuration(second_api_server.kubeconfig))
    created = apply_crds(api) if second_api_server.emulator is None else []
    kube = ClusterKube.discover(api)
    kube.create_namespace(namespace)
    yield kube
    kube.delete_namespace(namespace)
    if created and E2E_ENV.get("IPAM_BRIDGE_E2E_KEEP_CRDS") not in ("1", "true"):
        delete_crds(api, created)
    api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def operators(
    api_server: ApiServer,
    second_api_server: ApiServer,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[], None]]:
    """Start one operator per cluster for `namespace` (each loads its kubeconfig at start)."""
    started: list[OperatorThread] = []

    def start() -> None:
        for key, value in operator_environment(namespace).items():
            monkeypatch.setenv(key, value)
        for server in (api_server, second_api_server):
            monkeypatch.setenv("KUBECONFIG", server.kubeconfig)
            thread = OperatorThread(namespace)
            thread.start()
            started.append(thread)

    yield start
    for thread in reversed(started):
        thread.stop()


def _identity(kube: ClusterKube) -> str:
    return str(kube.core.read_namespace("kube-system").metadata.uid)


def _pool(kube: ClusterKube, target: IpamTarget, namespace: str) -> None:
    kube.phpipam_pool(
        namespace,
        "pool",
        endpoint=target.endpoint,
        app_id=target.app_id,
        subnet_id=target.subnet_id,
        credentials=target.credentials,
        **target.pool_spec(namespace, kube),
    )
    kube.wait_pool_ready(namespace, "pool", timeout=STEP_TIMEOUT)


def _owners(target: IpamTarget, namespace: str) -> dict[str, tuple[str, str, str]]:
    """``{hostname: (address, owner cluster id, owner claim)}`` of `namespace`'s entries."""
    with target.backend() as ipam:
        return {
            e.hostname: (e.address, e.owner.cluster_id, e.owner.claim)
            for e in ipam.entries()
            if e.hostname.endswith(f".{namespace}") and e.owner is not None
        }


def _addresses(kube: ClusterKube, namespace: str) -> dict[str, str]:
    return {a["metadata"]["name"]: a["spec"]["address"] for a in kube.addresses(namespace)}


def _taken(kube: ClusterKube, namespace: str, name: str) -> dict[str, Any]:
    return kube.wait_claim_reason(namespace, name, "HostnameTaken", timeout=STEP_TIMEOUT)


def test_two_clusters_sharing_a_subnet_without_a_suffix_never_share_an_address(
    cluster: ClusterKube,
    second_cluster: ClusterKube,
    namespace: str,
    phpipam: IpamTarget,
    operators: Callable[[], None],
) -> None:
    first, second = cluster, second_cluster
    one, two = _identity(first), _identity(second)
    assert one != two, "the two kubeconfigs name the same cluster (one kube-system uid)"
    operators()
    for kube in (first, second):
        _pool(kube, phpipam, namespace)
    for name in NAMES:
        first.claim(namespace, name, "pool")
    first.wait_claims_bound(namespace, len(NAMES), timeout=STEP_TIMEOUT)
    held = _addresses(first, namespace)
    owners = _owners(phpipam, namespace)
    assert owners == {f"{n}.{namespace}": (held[n], one, f"{namespace}/{n}") for n in NAMES}

    for name in NAMES:
        second.claim(namespace, name, "pool")
    for name in NAMES:
        message = ready_condition(_taken(second, namespace, name)).get("message", "")
        assert held[name] in message and one in message and "hostnameSuffix" in message
        wait_for(
            lambda n=name: [
                e
                for e in second.events(namespace)
                if e.get("reason") == "HostnameTaken" and e["involvedObject"]["name"] == n
            ],
            timeout=STEP_TIMEOUT,
            message=f"the HostnameTaken Event of {name}",
        )
    assert _addresses(second, namespace) == {}  # 0 addresses held by two claims
    assert _owners(phpipam, namespace) == owners

    # The first cluster lets go: its entries only; then the second's claims get their own.
    for name in NAMES:
        first.delete_claim(namespace, name)
    first.wait_gone(namespace, timeout=STEP_TIMEOUT)
    second.wait_claims_bound(namespace, len(NAMES), timeout=STEP_TIMEOUT)
    theirs = _addresses(second, namespace)
    assert _owners(phpipam, namespace) == {
        f"{n}.{namespace}": (theirs[n], two, f"{namespace}/{n}") for n in NAMES
    }
    # The first cluster asks again, is refused, and lets go: the second's entries stay.
    for name in NAMES:
        first.claim(namespace, name, "pool")
    for name in NAMES:
        _taken(first, namespace, name)
        first.delete_claim(namespace, name)
    first.wait_gone(namespace, timeout=STEP_TIMEOUT)
    assert _owners(phpipam, namespace) == {
        f"{n}.{namespace}": (theirs[n], two, f"{namespace}/{n}") for n in NAMES
    }
    for name in NAMES:
        second.delete_claim(namespace, name)
    second.wait_gone(namespace, timeout=STEP_TIMEOUT)
    assert _owners(phpipam, namespace) == {}
