"""CRD validation rules (real-cluster.md item 12): ``x-kubernetes-validations`` CEL rules.

On create and on every update (PUT, merge and JSON patch) of the main resource and of
``/status``, the rules of the request's version are evaluated on the object as it would be
stored; a failure is ``422 Invalid`` naming the field and the rule's message, and nothing is
written. Transition rules (``oldSelf``) run on updates only, and a field-level one only where
the field exists in the old and the new object; a rule failing on an unchanged value is a
warning (ratcheting). The evaluator (``mock_kubernetes.cel``, cel-python) is a test dependency:
without it nothing is checked.
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

from mock_kubernetes import EmulatedKubernetes, cel
from mock_kubernetes.store import ApiError

REPO = Path(__file__).resolve().parents[4]
CAPI_1_14 = REPO / "tests" / "data" / "capi-crds" / "v1.14.0"
GROUP = "example.com"
API = f"{GROUP}/v1"
PATH = f"/apis/{GROUP}/v1/namespaces/default/things"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

ZONE_FIXED = "zone is immutable"
LOCATION_FIXED = "location is immutable"
SIZE_LIMIT = "size is at most 10"
PHASE_RULE = "phase Broken is not allowed"

THINGS: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"things.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "things", "singular": "thing", "kind": "Thing"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    # A field-level transition rule.
                                    "location": {
                                        "type": "string",
                                        "x-kubernetes-validations": [
                                            {"rule": "self == oldSelf", "message": LOCATION_FIXED}
                                        ],
                                    },
                                    "zone": {"type": "string"},
                                    "size": {"type": "integer"},
                                },
                                "x-kubernetes-validations": [
                                    # A spec-level transition rule, with has() as written.
                                    {
                                        "rule": "has(self.zone) == has(oldSelf.zone) && "
                                        "(!has(self.zone) || self.zone == oldSelf.zone)",
                                        "message": ZONE_FIXED,
                                    },
                                    {
                                        "rule": "!has(self.size) || self.size <= 10",
                                        "message": SIZE_LIMIT,
                                    },
                                ],
                            },
                            "status": {
                                "type": "object",
                                "properties": {
                                    "phase": {
                                        "type": "string",
                                        "x-kubernetes-validations": [
                                            {"rule": "self != 'Broken'", "message": PHASE_RULE}
                                        ],
                                    }
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


def thing(name: str = "t", **spec: Any) -> dict[str, Any]:
    spec = spec or {"location": "rack-1", "zone": "a", "size": 1}
    return {
        "apiVersion": API,
        "kind": "Thing",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def invalid(field: str, value_type: str, message: str, name: str = "t") -> str:
    """The API server's message for one failed rule."""
    return f'Thing.{GROUP} "{name}" is invalid: {field}: Invalid value: "{value_type}": {message}'


@pytest.fixture
def kube() -> Iterator[EmulatedKubernetes]:
    with EmulatedKubernetes(crds=[THINGS]) as emulator:
        yield emulator


def refused(kube: EmulatedKubernetes, patch: dict[str, Any], *, status: bool = False) -> ApiError:
    with pytest.raises(ApiError) as caught:
        kube.patch(API, "things", "t", patch, "default", subresource="status" if status else None)
    assert caught.value.status == 422 and caught.value.reason == "Invalid"
    return caught.value


def test_create_is_validated_and_an_invalid_object_is_not_stored(
    kube: EmulatedKubernetes,
) -> None:
    created = kube.create(thing())
    assert created["spec"] == {"location": "rack-1", "zone": "a", "size": 1}
    with pytest.raises(ApiError) as caught:
        kube.create(thing("big", location="x", size=11))
    assert caught.value.status == 422
    assert caught.value.message == invalid("spec", "object", SIZE_LIMIT, name="big")
    assert kube.get(API, "things", "big", "default") is None


def test_a_violating_update_is_422_with_the_rules_message_and_changes_nothing(
    kube: EmulatedKubernetes,
) -> None:
    rv = kube.create(thing())["metadata"]["resourceVersion"]
    # Field-level transition rule: the field's path.
    error = refused(kube, {"spec": {"location": "rack-2"}})
    assert error.message == invalid("spec.location", "string", LOCATION_FIXED)
    assert error.to_status()["details"] == {
        "name": "t",
        "group": GROUP,
        "kind": "Thing",
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": f'Invalid value: "string": {LOCATION_FIXED}',
                "field": "spec.location",
            }
        ],
    }
    # Spec-level transition rule: changed, removed, added.
    assert refused(kube, {"spec": {"zone": "b"}}).message == invalid("spec", "object", ZONE_FIXED)
    assert refused(kube, {"spec": {"zone": None}}).message == invalid("spec", "object", ZONE_FIXED)
    # A rule without oldSelf is evaluated on updates too; several failures are listed.
    both = refused(kube, {"spec": {"zone": "b", "size": 11}}).message
    assert both == (
        f'Thing.{GROUP} "t" is invalid: [spec: Invalid value: "object": {ZONE_FIXED}, '
        f'spec: Invalid value: "object": {SIZE_LIMIT}]'
    )
    stored = kube.get(API, "things", "t", "default")
    assert stored is not None and stored["metadata"]["resourceVersion"] == rv
    assert stored["spec"] == {"location": "rack-1", "zone": "a", "size": 1}


def test_a_compliant_update_is_accepted(kube: EmulatedKubernetes) -> None:
    kube.create(thing())
    updated = kube.patch(API, "things", "t", {"spec": {"size": 5}}, "default")
    assert updated["spec"] == {"location": "rack-1", "zone": "a", "size": 5}
    assert updated["metadata"]["generation"] == 2
    # The same values written again: transition rules hold.
    again = kube.patch(API, "things", "t", {"spec": {"location": "rack-1", "zone": "a"}}, "default")
    assert again["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]


def test_field_level_transition_rules_need_the_field_in_both_objects(
    kube: EmulatedKubernetes,
) -> None:
    """As on the API server: ``self == oldSelf`` on a field does not stop adding or removing it."""
    kube.create(thing(zone="a"))
    added = kube.patch(API, "things", "t", {"spec": {"location": "rack-1"}}, "default")
    assert added["spec"]["location"] == "rack-1"
    assert refused(kube, {"spec": {"location": "rack-2"}}).message == invalid(
        "spec.location", "string", LOCATION_FIXED
    )
    removed = kube.patch(API, "things", "t", {"spec": {"location": None}}, "default")
    assert "location" not in removed["spec"]
    # The spec-level rule with has() catches both.
    assert refused(kube, {"spec": {"zone": None}}).message == invalid("spec", "object", ZONE_FIXED)


def test_put_json_patch_and_the_kubernetes_client_are_refused_alike(
    kube: EmulatedKubernetes,
) -> None:
    created = kube.create(thing())
    body = copy.deepcopy(created)
    body["spec"]["zone"] = "b"
    response = requests.put(f"{kube.url}{PATH}/t", json=body, timeout=5)
    assert response.status_code == 422
    assert response.json()["message"] == invalid("spec", "object", ZONE_FIXED)
    assert response.json()["details"]["causes"][0]["field"] == "spec"
    response = requests.patch(
        f"{kube.url}{PATH}/t",
        data=json.dumps([{"op": "replace", "path": "/spec/location", "value": "rack-9"}]),
        headers={"Content-Type": JSON_PATCH},
        timeout=5,
    )
    assert response.status_code == 422
    assert response.json()["message"] == invalid("spec.location", "string", LOCATION_FIXED)
    with kube.api_client() as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        with pytest.raises(kubernetes.client.ApiException) as caught:
            custom.patch_namespaced_custom_object(
                GROUP, "v1", "default", "things", "t", {"spec": {"location": "rack-3"}}
            )
    assert caught.value.status == 422
    assert LOCATION_FIXED in json.loads(caught.value.body)["message"]


def test_status_writes_are_validated(kube: EmulatedKubernetes) -> None:
    kube.create(thing())
    written = kube.patch(
        API, "things", "t", {"status": {"phase": "Fine"}}, "default", subresource="status"
    )
    assert written["status"] == {"phase": "Fine"}
    error = refused(kube, {"status": {"phase": "Broken"}}, status=True)
    assert error.message == invalid("status.phase", "string", PHASE_RULE)
    # The main resource ignores status: a spec violation is still refused there.
    assert refused(kube, {"spec": {"zone": "c"}, "status": {"phase": "Broken"}}).message == (
        invalid("spec", "object", ZONE_FIXED)
    )


def test_a_rule_failing_on_an_unchanged_value_is_a_warning(kube: EmulatedKubernetes) -> None:
    """Ratcheting: a stricter rule does not block writes that leave the old value alone."""
    kube.create(thing(location="x", size=8))
    stricter = copy.deepcopy(THINGS)
    spec = stricter["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["size"]["x-kubernetes-validations"] = [
        {"rule": "self <= 5", "message": "size is at most 5"}
    ]
    kube.declare_crd(stricter)
    response = requests.patch(
        f"{kube.url}{PATH}/t",
        json={"metadata": {"labels": {"a": "b"}}},
        headers={"Content-Type": MERGE},
        timeout=5,
    )
    assert response.status_code == 200
    assert "size is at most 5" in response.headers["Warning"]
    assert refused(kube, {"spec": {"size": 7}}).message == invalid(
        "spec.size", "integer", "size is at most 5"
    )
    assert kube.patch(API, "things", "t", {"spec": {"size": 4}}, "default")["spec"]["size"] == 4


def test_rule_reason_field_path_and_message_expression() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"a": {"type": "string"}, "n": {"type": "number"}},
                "x-kubernetes-validations": [
                    {
                        "rule": "self.a != 'x'",
                        "messageExpression": "'a may not be ' + self.a",
                        "reason": "FieldValueForbidden",
                        "fieldPath": ".a",
                    },
                    {"rule": "self.n > 1.5"},
                    {"rule": "self.missing == 1", "message": "unused"},
                ],
            }
        },
    }
    errors, ratcheted = cel.Validator(schema).validate({"spec": {"a": "x", "n": 1}})
    assert ratcheted == []
    assert [str(e) for e in errors[:2]] == [
        "spec.a: Forbidden: a may not be x",
        'spec: Invalid value: "object": failed rule: self.n > 1.5',
    ]
    assert errors[2].field == "spec" and "evaluating rule: self.missing == 1" in errors[2].detail


def test_validation_can_be_turned_off() -> None:
    with EmulatedKubernetes(crds=[THINGS], crd_validation=False) as kube:
        assert not kube.store.crd_validation
        kube.create(thing(location="x", size=99))
        assert kube.patch(API, "things", "t", {"spec": {"location": "y"}}, "default")


def test_without_cel_python_nothing_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cel, "AVAILABLE", False)
    with EmulatedKubernetes(crds=[THINGS]) as kube:
        assert not kube.store.crd_validation
        kube.create(thing(location="x", size=99))


# ------------------------------------------------------------------------- real CRDs

POOLS = "ipam.cluster.x-k8s.io/v1alpha1"
IMMUTABLE = "is immutable: the addresses already registered stay where they are"


def test_our_pool_crds_make_the_ipam_location_immutable() -> None:
    crds = sorted((REPO / "crds").glob("ipam.cluster.x-k8s.io_*.yaml"))
    with EmulatedKubernetes(crds=crds) as kube:
        kube.create(
            {
                "apiVersion": POOLS,
                "kind": "PHPIPAMIPPool",
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {
                    "endpoint": "https://ipam.example.com/api",
                    "appId": "capi",
                    "credentialsRef": {"name": "creds"},
                    "subnetId": 7,
                },
            }
        )
        for patch, field in (
            ({"subnetId": 8}, "spec"),
            ({"endpoint": "https://other.example.com/api"}, "spec.endpoint"),
        ):
            with pytest.raises(ApiError) as caught:
                kube.patch(POOLS, "phpipamippools", "p", {"spec": patch}, "default")
            assert caught.value.status == 422
            prefix = f'PHPIPAMIPPool.ipam.cluster.x-k8s.io "p" is invalid: {field}: Invalid value'
            assert caught.value.message.startswith(prefix)
            assert IMMUTABLE in caught.value.message
        kept = kube.patch(
            POOLS, "phpipamippools", "p", {"spec": {"gateway": "10.0.0.1"}}, "default"
        )
        assert kept["spec"]["subnetId"] == 7


def health_check(condition_type: str) -> dict[str, Any]:
    return {
        "checks": {
            "unhealthyMachineConditions": [
                {"type": condition_type, "status": "False", "timeoutSeconds": 300}
            ]
        }
    }


def template_ref(kind: str) -> dict[str, str]:
    """A ClusterClass ``templateRef`` (apiVersion, kind and name are required)."""
    return {"apiVersion": "example.com/v1beta1", "kind": kind, "name": "quick-start"}


def test_capi_1_14_crds_load_and_accept_valid_objects() -> None:
    with EmulatedKubernetes(crds=sorted(CAPI_1_14.glob("*.yaml"))) as kube:
        assert kube.store.crd_validation
        cluster = {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "default"},
            "spec": {
                "topology": {
                    "classRef": {"name": "quick-start"},
                    "version": "v1.33.0",
                    "workers": {
                        "machineDeployments": [
                            {"class": "default", "name": "md-0", "healthCheck": health_check("X")}
                        ]
                    },
                }
            },
        }
        kube.create(cluster)
        kube.patch(
            "cluster.x-k8s.io/v1beta2",
            "clusters",
            "c1",
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Available",
                            "status": "True",
                            "reason": "Available",
                            "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z",
                        }
                    ]
                }
            },
            "default",
            subresource="status",
        )
        kube.create(
            {
                "apiVersion": "cluster.x-k8s.io/v1beta2",
                "kind": "ClusterClass",
                "metadata": {"name": "quick-start", "namespace": "default"},
                "spec": {
                    "controlPlane": {
                        "templateRef": template_ref("KubeadmControlPlaneTemplate"),
                        "healthCheck": health_check("EtcdHealthy"),
                    },
                    "infrastructure": {"templateRef": template_ref("DockerClusterTemplate")},
                },
            }
        )
        claim = kube.create(
            {
                "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
                "kind": "IPAddressClaim",
                "metadata": {"name": "m1", "namespace": "default"},
                "spec": {
                    "clusterName": "c1",
                    "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "K", "name": "p"},
                },
            }
        )
        assert claim["spec"]["clusterName"] == "c1"
        kube.create(
            {
                "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
                "kind": "IPAddress",
                "metadata": {"name": "m1", "namespace": "default"},
                "spec": {
                    "address": "10.0.0.2",
                    "prefix": 24,
                    "claimRef": {"name": "m1"},
                    "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "K", "name": "p"},
                },
            }
        )
        # Their own rules are enforced: a rule inside a list of a list-type map list.
        bad = copy.deepcopy(cluster)
        bad["metadata"]["name"] = "c2"
        workers = bad["spec"]["topology"]["workers"]
        workers["machineDeployments"][0]["healthCheck"] = health_check("Ready")
        with pytest.raises(ApiError) as caught:
            kube.create(bad)
        field = (
            "spec.topology.workers.machineDeployments[0].healthCheck.checks"
            ".unhealthyMachineConditions[0].type"
        )
        assert caught.value.message.startswith(
            f'Cluster.cluster.x-k8s.io "c2" is invalid: {field}: Invalid value: "string": '
            "type must not be one of: Ready"
        )
