"""``clusterctl move`` between two sandboxes, as CAPI's mover does it (real-cluster.md 13c).

A module of its own (beside ``integration_env``) so that every test that moves objects
moves them the one way the real ``clusterctl move`` does.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence
from typing import Any

from integration_env import NAMESPACE

from backends.base import EntryOwner, parse_owner
from bridge.capi import GROUP, MOVE_ANNOTATION
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer

#: The phpIPAM objects a move takes: (apiVersion, plural), owners first (creation order).
PHPIPAM_MOVE: tuple[tuple[str, str], ...] = (
    ("v1", "secrets"),
    (f"{GROUP}/v1alpha1", "phpipamippools"),
    (f"{GROUP}/v1beta2", "ipaddressclaims"),
    (f"{GROUP}/v1beta2", "ipaddresses"),
)


def moved_copy(body: dict[str, Any], uids: dict[tuple[str, str], str]) -> dict[str, Any]:
    """Return ``body`` as ``clusterctl move`` creates it in the target.

    Parameters
    ----------
    body : dict
        The source object, with its ``apiVersion`` and ``kind``.
    uids : dict
        ``{(kind, name): uid}`` of the objects already created in the target.

    Returns
    -------
    dict
        Name, namespace, labels, annotations and finalizers copied; ``spec``, ``data`` and
        ``type`` copied; no status, UID or resourceVersion; each owner reference carries its
        owner's UID in the target.

    Raises
    ------
    KeyError
        If an owner of ``body`` is not among ``uids`` (it was not created first).

    """
    meta = body["metadata"]
    new: dict[str, Any] = {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": copy.deepcopy(meta.get("labels") or {}),
            "annotations": copy.deepcopy(meta.get("annotations") or {}),
            "finalizers": list(meta.get("finalizers") or []),
            "ownerReferences": [
                {**ref, "uid": uids[(ref["kind"], ref["name"])]}
                for ref in meta.get("ownerReferences") or []
            ],
        },
    }
    for key in ("spec", "data", "type"):
        if key in body:
            new[key] = copy.deepcopy(body[key])
    return new


def delete_for_move(
    sandbox: Sandbox, api_version: str, plural: str, name: str, namespace: str = NAMESPACE
) -> None:
    """Delete one source object as ``clusterctl move`` does (``mover.go`` ``deleteSourceObject``).

    The object is annotated ``clusterctl.cluster.x-k8s.io/delete-for-move: ""``, deleted,
    and then (if a finalizer still holds it) stripped of all its finalizers. An object
    already gone is left alone.
    """
    kube = sandbox.kube
    if kube.get(api_version, plural, name, namespace) is None:
        return
    annotate = {"metadata": {"annotations": {MOVE_ANNOTATION: ""}}}
    kube.patch(api_version, plural, name, annotate, namespace)
    kube.delete(api_version, plural, name, namespace)
    if kube.get(api_version, plural, name, namespace) is not None:
        kube.patch(api_version, plural, name, {"metadata": {"finalizers": None}}, namespace)


def clusterctl_move(
    source: Sandbox,
    target: Sandbox,
    kinds: Sequence[tuple[str, str]],
    *,
    keep: Collection[str] = (),
    namespace: str = NAMESPACE,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Move a namespace's objects from ``source`` to ``target`` as ``clusterctl move`` does.

    First every object of ``kinds`` is created in the target (`moved_copy`: new UIDs, owner
    references re-pointed, status dropped); then, in the reverse order, each source object
    is annotated, deleted and stripped of its finalizers (`delete_for_move`). Pausing the
    Cluster before and unpausing it after are the caller's.

    Parameters
    ----------
    source, target : Sandbox
        The management clusters moved from and to.
    kinds : sequence of (str, str)
        ``(apiVersion, plural)`` of the kinds moved, owners before the objects they own.
    keep : collection of str
        Plurals copied to the target but left at the source (not deleted there).
    namespace : str
        The namespace moved.

    Returns
    -------
    dict
        ``{(kind, name): object}`` of the objects created in the target.

    Raises
    ------
    KeyError
        If an object's owner is not of a kind moved before it.
    mock_kubernetes.store.ApiError
        If the target already holds an object of the same name (409).

    """
    created: dict[tuple[str, str], dict[str, Any]] = {}
    uids: dict[tuple[str, str], str] = {}
    for api_version, plural in kinds:
        for item in source.kube.list(api_version, plural, namespace):
            body = source.kube.get(api_version, plural, item["metadata"]["name"], namespace)
            assert body is not None
            new = target.create(moved_copy(body, uids))
            key = (new["kind"], new["metadata"]["name"])
            created[key] = new
            uids[key] = new["metadata"]["uid"]
    for api_version, plural in reversed(kinds):
        if plural in keep:
            continue
        for item in source.kube.list(api_version, plural, namespace):
            delete_for_move(source, api_version, plural, item["metadata"]["name"], namespace)
    return created


def cluster_id(sandbox: Sandbox) -> str:
    """Return the identity of a sandbox's operator: the uid of its namespace kube-system."""
    namespace = sandbox.kube.get("v1", "namespaces", "kube-system")
    assert namespace is not None
    return str(namespace["metadata"]["uid"])


def phpipam_owners(phpipam: MockPhpipamServer, subnet_id: int = 7) -> dict[str, EntryOwner | None]:
    """Return ``{hostname: owner}`` of a phpIPAM subnet's entries (their ``note``, parsed)."""
    return {
        str(a.hostname): parse_owner(a.values.get("note"))
        for a in phpipam.store.subnet_addresses(subnet_id)
        if a.hostname
    }


def assert_only_owners_rewritten(phpipam: MockPhpipamServer, target: Sandbox, moved: int) -> None:
    """Assert what a move did in phpIPAM since its journal was cleared: owners rewritten only.

    No entry created or deleted; one ``PATCH addresses/{id}/`` per moved claim (the target
    writes itself as the owner, once), and every entry of subnet 7 a claim holds names the
    target's cluster.
    """
    writes = [(e.method, e.path) for e in phpipam.store.requests(writes_only=True)]
    assert [m for m, _ in writes] == ["PATCH"] * moved, writes
    assert all("/addresses/" in path for _, path in writes), writes
    target_id = cluster_id(target)
    for hostname, owner in phpipam_owners(phpipam).items():
        if owner is not None:
            assert owner.cluster_id == target_id, (hostname, owner)
