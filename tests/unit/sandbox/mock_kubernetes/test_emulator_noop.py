"""No-op writes (real-cluster.md item 9): same resourceVersion, no watch event.

A write that changes nothing, once the API server has pruned and normalised it, is not stored:
the answer carries the old resourceVersion and watchers see nothing. This holds for merge and
JSON patches, PUT, the main resource and ``/status``, custom and built-in resources.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes.client
import pytest
import requests
from emulator_helpers import GROUP, widget

from mock_kubernetes import EmulatedKubernetes

ALL_WIDGETS = f"/apis/{GROUP}/v2/widgets"


def events_since(kube: EmulatedKubernetes, path: str, rv: str) -> list[dict[str, Any]]:
    """Watch events of ``path`` after resourceVersion ``rv`` (the history, replayed at once)."""
    params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "0.2"}
    with requests.get(kube.url + path, params=params, stream=True, timeout=5) as response:
        return [json.loads(line) for line in response.iter_lines() if line]


@pytest.fixture
def custom(client: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(client)


@pytest.fixture
def stored(custom: kubernetes.client.CustomObjectsApi) -> dict[str, Any]:
    """A Widget with spec, labels, finalizers and status."""
    body = widget(
        "w",
        metadata={"name": "w", "labels": {"a": "1"}, "finalizers": ["example.com/f"]},
        spec={"x": 1, "list": [1, 2]},
    )
    custom.create_namespaced_custom_object(GROUP, "v2", "default", "widgets", body)
    result: dict[str, Any] = custom.patch_namespaced_custom_object_status(
        GROUP, "v2", "default", "widgets", "w", {"status": {"ready": True}}
    )
    return result


def noop_writes(
    custom: kubernetes.client.CustomObjectsApi, stored: dict[str, Any]
) -> dict[str, Any]:
    args = (GROUP, "v2", "default", "widgets", "w")
    rv = stored["metadata"]["resourceVersion"]
    put_body = copy.deepcopy(stored)
    return {
        "merge patch of spec": lambda: custom.patch_namespaced_custom_object(
            *args, {"spec": {"x": 1}}
        ),
        "merge patch of labels": lambda: custom.patch_namespaced_custom_object(
            *args, {"metadata": {"labels": {"a": "1"}}}
        ),
        "merge patch of status on the main resource": lambda: custom.patch_namespaced_custom_object(
            *args, {"status": {"ready": False}}
        ),
        "JSON patch with a resourceVersion test (as kopf writes)": (
            lambda: custom.patch_namespaced_custom_object(
                *args,
                [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                    {"op": "replace", "path": "/spec/list", "value": [1, 2]},
                ],
                _content_type="application/json-patch+json",
            )
        ),
        "PUT of the object as read": lambda: custom.replace_namespaced_custom_object(
            *args, put_body
        ),
        "merge patch of /status": lambda: custom.patch_namespaced_custom_object_status(
            *args, {"status": {"ready": True}}
        ),
        "PUT of /status": lambda: custom.replace_namespaced_custom_object_status(*args, put_body),
        "merge patch of spec on /status": lambda: custom.patch_namespaced_custom_object_status(
            *args, {"spec": {"x": 2}}
        ),
    }


@pytest.mark.parametrize(
    "write",
    [
        "merge patch of spec",
        "merge patch of labels",
        "merge patch of status on the main resource",
        "JSON patch with a resourceVersion test (as kopf writes)",
        "PUT of the object as read",
        "merge patch of /status",
        "PUT of /status",
        "merge patch of spec on /status",
    ],
)
def test_a_write_that_changes_nothing_keeps_the_resource_version_and_sends_no_event(
    kube: EmulatedKubernetes,
    custom: kubernetes.client.CustomObjectsApi,
    stored: dict[str, Any],
    write: str,
) -> None:
    answer = noop_writes(custom, stored)[write]()
    rv = stored["metadata"]["resourceVersion"]
    assert answer == stored
    assert answer["metadata"]["resourceVersion"] == rv
    assert answer["metadata"]["generation"] == stored["metadata"]["generation"]
    assert events_since(kube, ALL_WIDGETS, rv) == []


def test_a_write_that_changes_something_sends_one_event(
    kube: EmulatedKubernetes, custom: kubernetes.client.CustomObjectsApi, stored: dict[str, Any]
) -> None:
    rv = stored["metadata"]["resourceVersion"]
    answer = custom.patch_namespaced_custom_object_status(
        GROUP, "v2", "default", "widgets", "w", {"status": {"ready": False}}
    )
    assert int(answer["metadata"]["resourceVersion"]) > int(rv)
    events = events_since(kube, ALL_WIDGETS, rv)
    assert [(e["type"], e["object"]["status"]) for e in events] == [("MODIFIED", {"ready": False})]


def test_normalised_writes_that_change_nothing_are_noops(
    kube: EmulatedKubernetes, client: kubernetes.client.ApiClient
) -> None:
    core = kubernetes.client.CoreV1Api(client)
    created = core.create_namespaced_secret(
        "default", {"metadata": {"name": "s"}, "stringData": {"token": "t"}}
    )
    rv = created.metadata.resource_version
    # stringData is folded into data: the same value again is no change.
    again = core.patch_namespaced_secret("s", "default", {"stringData": {"token": "t"}})
    assert again.metadata.resource_version == rv
    assert events_since(kube, "/api/v1/secrets", rv) == []
    changed = core.patch_namespaced_secret("s", "default", {"stringData": {"token": "u"}})
    assert changed.metadata.resource_version != rv
