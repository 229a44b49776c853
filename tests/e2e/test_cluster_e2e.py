"""The operator and the CRDs against a Kubernetes API server through a kubeconfig.

The cluster of ``KUBECONFIG``, else the in-memory API server (see ``conftest.py``): the same
assertions hold for both, those on the API server's answers included (its field paths and
cause reasons, as kube-apiserver reports them). The operator runs in this process, serving
only a fresh namespace; the IPAM is mock_phpipam on 127.0.0.1 (and, when ``PHPIPAM_URL`` is
also set, the real phpIPAM).
"""

from __future__ import annotations

import copy
import json
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


#: The cases of `INVALID` that the OpenAPI schema refuses, by case name without the kind:
#: the ``details.causes[]`` entry (``field``, ``reason``) the API server reports for each.
#: Every other case is refused by a CEL rule: ``FieldValueInvalid`` on the case's field, with
#: the rule's message (ours, so the fragment of `INVALID` is in it).
SCHEMA_CAUSES: dict[str, tuple[str, str]] = {
    "missing-endpoint": ("spec.endpoint", "FieldValueRequired"),
    "credentials-missing": ("spec.credentialsRef", "FieldValueRequired"),
    "credentials-without-name": ("spec.credentialsRef.name", "FieldValueRequired"),
    "missing-app-id": ("spec.appId", "FieldValueRequired"),
    "gateway-not-ip": ("spec.gateway", "FieldValueTypeInvalid"),  # format ipv4 or ipv6
    "gateway-hostname": ("spec.gateway", "FieldValueTypeInvalid"),
    "subnet-not-cidr": ("spec.subnet", "FieldValueTypeInvalid"),  # format cidr
    "subnet-bad-address": ("spec.subnet", "FieldValueTypeInvalid"),
    "insecure-not-bool": ("spec.tls.insecureSkipVerify", "FieldValueTypeInvalid"),
    "subnet-id-string": ("spec.subnetId", "FieldValueTypeInvalid"),
    "wapi-version-number": ("spec.wapiVersion", "FieldValueTypeInvalid"),
    "ea-value-not-string": ("spec.extensibleAttributes.Rack", "FieldValueTypeInvalid"),
    "prefix-129-ipv6": ("spec.prefix", "FieldValueInvalid"),  # maximum
    "prefix-negative": ("spec.prefix", "FieldValueInvalid"),  # minimum
    "subnet-id-zero": ("spec.subnetId", "FieldValueInvalid"),
    "app-id-too-short": ("spec.appId", "FieldValueInvalid"),  # minLength
    "ea-value-empty": ("spec.extensibleAttributes.Rack", "FieldValueInvalid"),
    "hostname-suffix-leading-dot": ("spec.hostnameSuffix", "FieldValueInvalid"),  # pattern
    "hostname-suffix-upper-case": ("spec.hostnameSuffix", "FieldValueInvalid"),
    "ca-key-with-slash": ("spec.tls.caSecretRef.key", "FieldValueInvalid"),
    "app-id-not-alnum": ("spec.appId", "FieldValueInvalid"),
    "dns-zone-with-space": ("spec.dnsZone", "FieldValueInvalid"),
    "wapi-version-with-v": ("spec.wapiVersion", "FieldValueInvalid"),
    "app-id-too-long": ("spec.appId", "FieldValueTooLong"),  # maxLength
    "ea-too-many": ("spec.extensibleAttributes", "FieldValueTooMany"),  # maxProperties
    "record-type-a": ("spec.recordType", "FieldValueNotSupported"),  # enum
}
#: The cases that name a field the kind's schema does not have: ``fieldValidation=Strict``
#: makes it ``400 BadRequest`` (``strict decoding error: unknown field "<path>"``).
UNKNOWN_FIELDS: dict[str, str] = {
    "unknown-field": "spec.subnetName",
    "phpipam-record-type": "spec.recordType",
    "infoblox-subnet-id": "spec.subnetId",
    "infoblox-app-id": "spec.appId",
}
#: ``field.ErrorType`` text of each cause reason (``k8s.io/apimachinery`` field errors).
REASON_TEXT = {
    "FieldValueRequired": "Required value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueTypeInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
}


def _case(case_id: str) -> str:
    """The name of an `INVALID` case without its kind (``PHPIPAMIPPool-x`` -> ``x``)."""
    kind, _, rest = case_id.partition("-")
    return rest if kind in ("PHPIPAMIPPool", "InfobloxIPPool") else case_id


def test_the_answer_tables_name_cases_of_invalid() -> None:
    assert (SCHEMA_CAUSES.keys() | UNKNOWN_FIELDS.keys()) <= {_case(c) for c in INVALID}


@pytest.mark.parametrize("case_id", INVALID.keys())
def test_api_server_rejects_invalid_pools(cluster: ClusterKube, case_id: str) -> None:
    pool, field, fragment = INVALID[case_id]
    case = _case(case_id)
    with pytest.raises(ApiException) as caught:
        _dry_run(cluster, pool)
    error = caught.value
    status = json.loads(error.body)
    if case in UNKNOWN_FIELDS:
        assert (error.status, status["reason"]) == (400, "BadRequest"), error.body
        assert "strict decoding error" in status["message"], status["message"]
        assert f'unknown field "{UNKNOWN_FIELDS[case]}"' in status["message"]
        return
    assert (error.status, status["reason"]) == (422, "Invalid"), error.body
    name = pool["metadata"]["name"]
    assert status["message"].startswith(f'{pool["kind"]}.{capi.GROUP} "{name}" is invalid: ')
    causes = status["details"]["causes"]
    if case in SCHEMA_CAUSES:
        path, reason = SCHEMA_CAUSES[case]
        found = [c for c in causes if (c.get("field"), c.get("reason")) == (path, reason)]
        assert found, causes
        assert found[0]["message"].startswith(REASON_TEXT[reason]), found
        assert f"{path}: {found[0]['message']}" in status["message"]
        if reason == "FieldValueRequired":
            assert found[0]["message"] == "Required value"
    else:  # a CEL rule: its message, on the rule's field
        path = field.lstrip(".")
        found = [
            c
            for c in causes
            if (c.get("field"), c.get("reason")) == (path, "FieldValueInvalid")
            and fragment in c.get("message", "")
        ]
        assert found, causes


# ------------------------------------------------------------------------- the operator


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
