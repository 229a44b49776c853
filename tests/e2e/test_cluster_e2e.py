"""The operator and the CRDs against a real Kubernetes API server (``KUBECONFIG``).

Skipped when ``KUBECONFIG`` is not set. The operator runs in this process, serving only a
fresh namespace; the IPAM is mock_phpipam on 127.0.0.1 (and, when ``PHPIPAM_URL`` is also set,
the real phpIPAM).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from e2e_support import (
    CREDENTIALS,
    ClusterKube,
    IpamTarget,
    OperatorThread,
    allocation_scenario,
    crd_examples_module,
)
from kubernetes.client.exceptions import ApiException

from bridge import capi

EXAMPLES = crd_examples_module()
VALID: dict[str, dict[str, Any]] = EXAMPLES.VALID
INVALID: dict[str, tuple[dict[str, Any], str, str]] = EXAMPLES.INVALID

#: Settings for a real phpIPAM, which answers slower than the mock.
REAL_IPAM_SETTINGS = {
    "IPAM_BRIDGE_BACKEND_TIMEOUT_SECONDS": "15",
    "IPAM_BRIDGE_RETRY_TOTAL_SECONDS": "30",
    "IPAM_BRIDGE_RETRY_MAX_DELAY_SECONDS": "2",
}


@pytest.fixture(params=["mock", "phpipam"])
def ipam(request: pytest.FixtureRequest) -> IpamTarget:
    """mock_phpipam, then the real phpIPAM (skipped without ``PHPIPAM_URL``)."""
    fixture = "mock_phpipam" if request.param == "mock" else "real_phpipam"
    target: IpamTarget = request.getfixturevalue(fixture)
    return target


# ------------------------------------------------------------------- the CRDs themselves


def test_crds_are_established_with_the_designed_versions(cluster: ClusterKube) -> None:
    from kubernetes.client import ApiextensionsV1Api

    crds = ApiextensionsV1Api(cluster.api)
    for plural in ("phpipamippools", "infobloxippools"):
        crd = cluster.api.sanitize_for_serialization(
            crds.read_custom_resource_definition(f"{plural}.{capi.GROUP}")
        )
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True", conditions
        assert conditions.get("NamesAccepted") == "True", conditions
        assert [(v["name"], v["served"], v["storage"]) for v in crd["spec"]["versions"]] == [
            ("v1alpha1", True, True)
        ]
    assert cluster.version in capi.SUPPORTED_VERSIONS


def _dry_run(cluster: ClusterKube, pool: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(pool)
    body["metadata"]["namespace"] = "default"  # a dry run persists nothing
    return cluster.create(body, dry_run=True)


@pytest.mark.parametrize("pool", VALID.values(), ids=VALID.keys())
def test_api_server_accepts_valid_pools_and_defaults_them(
    cluster: ClusterKube, pool: dict[str, Any]
) -> None:
    created = _dry_run(cluster, pool)
    schema = EXAMPLES.schema_of(EXAMPLES.load_crd(EXAMPLES.POOL_FILES[pool["kind"]]), "v1alpha1")
    # The unit tests' defaulting harness and the API server agree on the stored spec.
    assert created["spec"] == EXAMPLES.apply_defaults(schema, copy.deepcopy(pool))["spec"]


def _mentions(field: str, fragment: str) -> set[str]:
    """Texts of which the API server's answer must contain one for this rejection."""
    path = field.lstrip(".")
    texts = {fragment, path}
    if path.count(".") >= 1:
        texts.add(path.rsplit(".", 1)[-1])
    if "is a required property" in fragment:
        texts.add(f"{path}.{fragment.split(chr(39))[1]}")
    return {t for t in texts if t and t != "spec"}


@pytest.mark.parametrize(("pool", "field", "fragment"), INVALID.values(), ids=INVALID.keys())
def test_api_server_rejects_invalid_pools(
    cluster: ClusterKube, pool: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(ApiException) as caught:
        _dry_run(cluster, pool)
    error = caught.value
    # 422 Invalid (OpenAPI or CEL), or 400 for an unknown field under strict validation.
    assert error.status in (400, 422), (error.status, error.body)
    answer = str(error.body)
    assert any(text in answer for text in _mentions(field, fragment)), answer


# ----------------------------------------------------------------- the operator, issue 2


def test_claims_get_addresses_and_give_them_back(
    cluster: ClusterKube,
    namespace: str,
    operator: Callable[..., OperatorThread],
    ipam: IpamTarget,
) -> None:
    operator(REAL_IPAM_SETTINGS if ipam.mock is None else None)
    allocation_scenario(cluster, ipam, namespace, claims=5)


def test_exhausted_pool_holds_claims_until_an_address_is_freed(
    cluster: ClusterKube,
    namespace: str,
    operator: Callable[..., OperatorThread],
    mock_phpipam: IpamTarget,
) -> None:
    operator()
    cluster.phpipam_pool(
        namespace,
        "small",
        endpoint=mock_phpipam.endpoint,
        app_id="capi",
        subnet_id=9,
        credentials=CREDENTIALS,
    )
    pool = cluster.wait_pool_ready(namespace, "small")
    assert pool["status"]["ipAddresses"] == {"total": 2, "used": 0, "free": 2}
    names = ["m1", "m2", "m3"]
    for name in names:
        cluster.claim(namespace, name, "small")
    bound = {c["metadata"]["name"] for c in cluster.wait_claims_bound(namespace, 2)}
    (waiting,) = set(names) - bound
    claim = cluster.wait_claim_reason(namespace, waiting, capi.Reason.POOL_EXHAUSTED)
    ready = next(
        c
        for c in claim["status"].get("conditions", [])
        + claim["status"].get("v1beta2", {}).get("conditions", [])
        if c["type"] == "Ready" and c.get("reason") == capi.Reason.POOL_EXHAUSTED
    )
    assert ready["status"] == "False" and ready["message"]
    assert "addressRef" not in claim["status"] or not claim["status"]["addressRef"].get("name")
    assert {a["metadata"]["name"] for a in cluster.addresses(namespace)} == bound

    freed_claim = sorted(bound)[0]
    freed = next(
        a["spec"]["address"]
        for a in cluster.addresses(namespace)
        if a["metadata"]["name"] == freed_claim
    )
    cluster.delete_claim(namespace, freed_claim)
    cluster.wait_claim_reason(namespace, waiting, capi.Reason.ALLOCATED)
    (address,) = [a for a in cluster.addresses(namespace) if a["metadata"]["name"] == waiting]
    assert address["spec"]["address"] == freed
    for name in set(names) - {freed_claim}:
        cluster.delete_claim(namespace, name)
    cluster.wait_gone(namespace)
    assert mock_phpipam.mock is not None
    assert [a.hostname for a in mock_phpipam.mock.store.subnet_addresses(9)] == []
