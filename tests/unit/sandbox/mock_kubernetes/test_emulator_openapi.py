"""OpenAPI schema validation and defaulting of custom resources, as kube-apiserver does them.

The emulator answers a custom resource that breaks its ``openAPIV3Schema`` as kube-apiserver
does: ``422 Invalid``, ``<Kind>.<group> "<name>" is invalid: <field>: <error>``, one
``details.causes`` entry (``field``, ``reason``, ``message``) per error, ``Required value``
for a missing required field, ``Invalid value: <value>: <field> in body should match '<re>'``
for a pattern, ``Unsupported value`` for an enum, ``Too long``, ``Too many``; a blocking error
(type, required, enum, too long, too many) keeps the CEL rules from running and says so. It
fills in schema defaults, honours ``dryRun=All`` and ``fieldValidation=Strict`` on create,
and checks an update only where a value changed (ratcheting).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import requests
from kubernetes.client.exceptions import ApiException

from mock_kubernetes import EmulatedKubernetes
from mock_kubernetes.openapi import FieldError, _go_float, default, validate
from mock_kubernetes.store import ApiError

REPO = Path(__file__).resolve().parents[4]
GROUP = "ipam.cluster.x-k8s.io"
POOLS = f"{GROUP}/v1alpha1"
COLLECTION = f"/apis/{GROUP}/v1alpha1/namespaces/default/phpipamippools"
NOT_CHECKED = (
    "<nil>: Invalid value: null: some validation rules were not checked because the object"
    " was invalid; correct the existing errors to complete validation"
)


def pool(name: str = "nodes-v4", **spec: Any) -> dict[str, Any]:
    """A valid PHPIPAMIPPool (``spec`` fields replaced; ``None`` removes one)."""
    body: dict[str, Any] = {
        "apiVersion": POOLS,
        "kind": "PHPIPAMIPPool",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "endpoint": "https://ipam.example.com/api",
            "appId": "capi",
            "credentialsRef": {"name": "creds"},
            "subnetId": 7,
        },
    }
    for key, value in spec.items():
        if value is None:
            body["spec"].pop(key, None)
        else:
            body["spec"][key] = value
    return body


@pytest.fixture(scope="module")
def kube() -> Iterator[EmulatedKubernetes]:
    with EmulatedKubernetes(crds=sorted((REPO / "crds").glob(f"{GROUP}_*.yaml"))) as emulator:
        yield emulator


def refused(kube: EmulatedKubernetes, body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        kube.create(body)
    assert (caught.value.status, caught.value.reason) == (422, "Invalid")
    assert kube.get(POOLS, "phpipamippools", body["metadata"]["name"], "default") is None
    return caught.value


def test_a_missing_required_field_is_answered_as_kube_apiserver_does(
    kube: EmulatedKubernetes,
) -> None:
    # kube-apiserver v1.36 answers this create (dry run or not) in these words exactly.
    for params in ({}, {"dryRun": "All"}):
        response = requests.post(
            kube.url + COLLECTION, params=params, json=pool(credentialsRef=None), timeout=5
        )
        status = response.json()
        assert (response.status_code, status["reason"]) == (422, "Invalid")
        assert status["message"] == (
            f'PHPIPAMIPPool.{GROUP} "nodes-v4" is invalid: [spec.credentialsRef: Required value, '
            f"{NOT_CHECKED}]"
        )
        assert status["details"]["causes"] == [
            {
                "reason": "FieldValueRequired",
                "message": "Required value",
                "field": "spec.credentialsRef",
            },
            {
                "reason": "FieldValueInvalid",
                "message": NOT_CHECKED.removeprefix("<nil>: "),
                "field": "<nil>",
            },
        ]


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (
            {"hostnameSuffix": ".example.com"},
            'spec.hostnameSuffix: Invalid value: ".example.com": spec.hostnameSuffix in body'
            " should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'",
        ),
        (
            {"appId": "ab"},
            'spec.appId: Invalid value: "ab": spec.appId in body should be at least 3 chars long',
        ),
        (
            {"prefix": -1},
            "spec.prefix: Invalid value: -1: spec.prefix in body should be greater"
            " than or equal to 0",
        ),
        (
            {"addressReuseGracePeriodSeconds": 31536001},
            "spec.addressReuseGracePeriodSeconds: Invalid value: 31536001:"
            " spec.addressReuseGracePeriodSeconds in body should be less than or equal to"
            " 3.1536e+07",
        ),
    ],
    ids=["pattern", "min-length", "minimum", "maximum"],
)
def test_a_non_blocking_error_is_reported_alone(
    kube: EmulatedKubernetes, spec: dict[str, Any], error: str
) -> None:
    refusal = refused(kube, pool(**spec))
    assert refusal.message == f'PHPIPAMIPPool.{GROUP} "nodes-v4" is invalid: {error}'
    field, _, body = error.partition(": ")
    assert refusal.to_status()["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": body, "field": field}
    ]


@pytest.mark.parametrize(
    ("spec", "error", "reason"),
    [
        (
            {"tls": {"insecureSkipVerify": "yes"}},
            'spec.tls.insecureSkipVerify: Invalid value: "string": spec.tls.insecureSkipVerify'
            ' in body must be of type boolean: "string"',
            "FieldValueTypeInvalid",
        ),
        (
            {"subnetId": None, "sectionId": 3, "subnet": "10.20.0.0"},
            'spec.subnet: Invalid value: "10.20.0.0": spec.subnet in body must be of type cidr:'
            ' "10.20.0.0"',
            "FieldValueTypeInvalid",
        ),
        (
            {"appId": "a" * 13},
            "spec.appId: Too long: may not be more than 12 bytes",
            "FieldValueTooLong",
        ),
    ],
    ids=["type", "format", "max-length"],
)
def test_a_blocking_error_keeps_the_cel_rules_from_running(
    kube: EmulatedKubernetes, spec: dict[str, Any], error: str, reason: str
) -> None:
    # subnetId and subnet together would break a CEL rule too: it is not evaluated.
    refusal = refused(kube, pool(**{"subnet": "10.0.0.0/24", **spec}))
    assert (
        refusal.message == f'PHPIPAMIPPool.{GROUP} "nodes-v4" is invalid: [{error}, {NOT_CHECKED}]'
    )
    causes = refusal.to_status()["details"]["causes"]
    assert [(c["field"], c["reason"]) for c in causes] == [
        (error.partition(":")[0], reason),
        ("<nil>", "FieldValueInvalid"),
    ]


def test_enum_and_max_properties_on_infoblox_pools(kube: EmulatedKubernetes) -> None:
    body = pool(appId=None, subnetId=None, subnet="10.0.0.0/24", recordType="a")
    body["kind"] = "InfobloxIPPool"
    refusal = refused(kube, body)
    assert refusal.message.endswith(
        ': [spec.recordType: Unsupported value: "a": supported values: "host", "fixedaddress",'
        f" {NOT_CHECKED}]"
    )
    body["spec"].update(recordType="host", extensibleAttributes={f"A{i}": "x" for i in range(33)})
    refusal = refused(kube, body)
    assert "spec.extensibleAttributes: Too many: 33: must have at most 32 items" in refusal.message


def test_cel_rules_run_after_a_valid_schema(kube: EmulatedKubernetes) -> None:
    refusal = refused(kube, pool(subnet="10.0.0.0/24"))
    assert refusal.message == (
        f'PHPIPAMIPPool.{GROUP} "nodes-v4" is invalid: spec: Invalid value: "object": exactly'
        " one of subnetId, subnet and subnets must be set"
    )


def test_defaults_are_filled_in_on_create_and_update(kube: EmulatedKubernetes) -> None:
    created = kube.create(pool("defaulted"))
    assert created["spec"]["tls"] == {"insecureSkipVerify": False}
    assert created["spec"]["addressReuseGracePeriodSeconds"] == 0
    updated = kube.patch(
        POOLS,
        "phpipamippools",
        "defaulted",
        {"spec": {"tls": {"caSecretRef": {"name": "ca"}}}},
        "default",
    )
    assert updated["spec"]["tls"] == {
        "insecureSkipVerify": False,
        "caSecretRef": {"name": "ca", "key": "ca.crt"},
    }
    # Removing a defaulted field puts the default back: a no-op, same resourceVersion.
    again = kube.patch(
        POOLS,
        "phpipamippools",
        "defaulted",
        {"spec": {"tls": {"insecureSkipVerify": None}}},
        "default",
    )
    assert again["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]


def test_dry_run_stores_nothing_and_strict_refuses_unknown_fields(
    kube: EmulatedKubernetes,
) -> None:
    with kube.api_client() as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        answer = custom.create_namespaced_custom_object(
            GROUP, "v1alpha1", "default", "phpipamippools", pool("dry"), dry_run="All"
        )
        assert answer["metadata"]["uid"] and "resourceVersion" not in answer["metadata"]
        assert answer["spec"]["tls"] == {"insecureSkipVerify": False}
        assert kube.get(POOLS, "phpipamippools", "dry", "default") is None
        with pytest.raises(ApiException) as caught:
            custom.create_namespaced_custom_object(
                GROUP,
                "v1alpha1",
                "default",
                "phpipamippools",
                pool("strict", subnetName="x"),
                field_validation="Strict",
            )
    status = json.loads(caught.value.body)
    assert (caught.value.status, status["reason"]) == (400, "BadRequest")
    assert status["message"] == (
        'PHPIPAMIPPool in version "v1alpha1" cannot be handled as a PHPIPAMIPPool:'
        ' strict decoding error: unknown field "spec.subnetName"'
    )
    assert kube.get(POOLS, "phpipamippools", "strict", "default") is None


def test_an_unchanged_invalid_value_is_not_checked_again() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": "^[a-z]+$"},
                    "size": {"type": "integer"},
                },
            }
        },
    }
    old = {"spec": {"name": "Bad", "size": 1}}
    assert [str(e) for e in validate(old, schema)] == [
        "spec.name: Invalid value: \"Bad\": spec.name in body should match '^[a-z]+$'"
    ]
    assert validate({"spec": {"name": "Bad", "size": 2}}, schema, old) == []
    assert validate({"spec": {"name": "Worse", "size": 1}}, schema, old) == [
        FieldError(
            "spec.name",
            "FieldValueInvalid",
            "Invalid value: \"Worse\": spec.name in body should match '^[a-z]+$'",
        )
    ]


def test_defaulting_rules() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "default": {},
                "properties": {"b": {"type": "integer", "default": 1}},
            },
            "c": {"type": "string", "default": "x"},
            "d": {"type": "string"},
            "e": {"type": "string", "nullable": True, "default": "y"},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"f": {"type": "boolean", "default": False}},
                },
            },
        },
    }
    obj: dict[str, Any] = {"c": None, "d": None, "e": None, "items": [{}, {"f": True}]}
    default(obj, schema)
    assert obj == {"a": {"b": 1}, "c": "x", "e": None, "items": [{"f": False}, {"f": True}]}
    again = copy.deepcopy(obj)
    default(again, schema)
    assert again == obj


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (128.0, "128"),
        (31536000.0, "3.1536e+07"),
        (1e6, "1e+06"),
        (123456.0, "123456"),
        (0.5, "0.5"),
        (1e-5, "1e-05"),
        (2.12, "2.12"),
        (-1.0, "-1"),
    ],
)
def test_numbers_print_as_go_prints_a_float64(value: float, text: str) -> None:
    assert _go_float(value) == text
