"""Where the operator's objects live on the Kubernetes API, and how each is read and written.

`ObjectClient` is the generic gateway (`bridge.runtime.gateway.Kube`) plus the resources
the operator uses: IPAddressClaims and IPAddresses (``ipam.cluster.x-k8s.io``, the served
CAPI version), our pools (``v1alpha1``, namespaced and Global kinds), CAPI Clusters
(``cluster.x-k8s.io``), the objects a Cluster references (its InfraCluster and control plane,
any kind: resolved by API discovery) and Secrets. Write outcomes are the gateway's `Write`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.client import ApiClient, ApiException, ApisApi, CustomObjectsApi

from bridge.capi import (
    ADDRESS_FINALIZER,
    CLUSTER_GROUP,
    GLOBAL_POOL_KINDS,
    GROUP,
    POOL_KINDS,
    Claim,
    ObjectRef,
)
from bridge.models import Condition, IPPool, wire
from bridge.runtime.expectations import GONE, Expectations
from bridge.runtime.gateway import Kube, NotServedError, Outcome, Resource, Write
from bridge.runtime.store import version_of

__all__ = [
    "CLUSTER_VERSIONS",
    "POOL_VERSION",
    "ObjectClient",
    "address_resource",
    "claim_resource",
    "cluster_resource",
    "pool_resource",
]

#: The version of our pool kinds.
POOL_VERSION = "v1alpha1"
#: The CAPI ``Cluster`` versions read, in order of preference.
CLUSTER_VERSIONS = ("v1beta2", "v1beta1")


def claim_resource(version: str) -> Resource:
    """Return the ``IPAddressClaim`` resource in ``version`` (``v1beta2``/``v1beta1``)."""
    return Resource(GROUP, version, "ipaddressclaims", "IPAddressClaim")


def address_resource(version: str) -> Resource:
    """Return the ``IPAddress`` resource in ``version`` (``v1beta2``/``v1beta1``)."""
    return Resource(GROUP, version, "ipaddresses", "IPAddress")


def pool_resource(kind: str) -> Resource:
    """Return the resource of one of our pool kinds (`bridge.capi.POOL_KINDS`).

    Raises
    ------
    KeyError
        For a kind that is not ours.
    """
    return Resource(
        GROUP, POOL_VERSION, POOL_KINDS[kind], kind, namespaced=kind not in GLOBAL_POOL_KINDS
    )


def cluster_resource(version: str) -> Resource:
    """Return the CAPI ``Cluster`` resource in ``version`` (``v1beta2``/``v1beta1``)."""
    return Resource(CLUSTER_GROUP, version, "clusters", "Cluster")


class ObjectClient(Kube):
    """The gateway with the operator's resources: claims, IPAddresses, pools, Clusters.

    "Not found" is None for reads and `Outcome.GONE` for writes; any other API failure
    propagates as ``kubernetes.client.ApiException``.

    Parameters
    ----------
    client:
        An ``ApiClient`` (`bridge.runtime.gateway.Kube`).
    expectations:
        Where the answers of our writes of claims and IPAddresses go, keyed ``(plural,
        namespace, name)``: the version written, `bridge.runtime.expectations.GONE` for a
        deletion (`Expectations.wrote`). None: nowhere.
    """

    def __init__(self, client: ApiClient, expectations: Expectations | None = None) -> None:
        super().__init__(client)
        self.expectations = expectations
        self._referenced: dict[tuple[str, str, str], Resource] = {}
        self._referenced_lock = threading.Lock()

    def _expect(
        self, plural: str, namespace: str, name: str, written: Write, *, deletion: bool = False
    ) -> Write:
        """Record a write's answer in `expectations`; return it.

        Written: its version, or `GONE` for the last finalizer off an object being deleted
        (the API server deletes it). ``deletion``: `GONE` also for an object found gone, and
        for a deletion the version its finalizer removal wrote first (``obj``), so that
        neither echo queues anything.
        """
        found_gone = deletion and written.outcome is Outcome.GONE
        if self.expectations is None or not (written.written or found_gone):
            return written
        key = (plural, namespace, name)
        meta = (written.obj or {}).get("metadata") or {}
        if deletion and written.obj is not None:
            self.expectations.wrote(key, version_of(written.obj))
        gone = (
            deletion
            or written.obj is None
            or (meta.get("deletionTimestamp") and not meta.get("finalizers"))
        )
        self.expectations.wrote(key, GONE if gone else version_of(written.obj))
        return written

    # -- claims -------------------------------------------------------------------

    def get_claim(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return an ``IPAddressClaim`` as served in ``version``, or None when it does not exist."""
        return self.get(claim_resource(version), namespace, name)

    def list_claims(
        self, version: str, namespaces: tuple[str, ...] = (), *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Return the ``IPAddressClaim`` objects of ``namespaces`` (empty: all namespaces).

        ``limit`` asks the API server for at most that many per namespace (a cheap check
        that the operator may list claims at all).
        """
        return self.list(Resource(GROUP, version, "ipaddressclaims"), namespaces, limit=limit)

    def create_claim(self, version: str, body: Mapping[str, Any]) -> Write:
        """Create an ``IPAddressClaim`` (a control-plane endpoint's).

        Not recorded in the expectations: the claim's own watch event queues it.

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the claim, or `Outcome.CONFLICT` when the name exists.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 409 AlreadyExists (e.g. 403 in a terminating namespace).
        """
        return self.create(claim_resource(version), body)

    def patch_claim_status(
        self,
        version: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> Write:
        """Merge-patch a claim's status subresource (`Kube.patch_status`).

        What the served schema does not know is pruned by the API server (e.g.
        ``status.v1beta2`` on CAPI < 1.9): the returned object shows what was kept. With
        ``resource_version`` the patch carries ``metadata.resourceVersion``: the API server
        applies it only to that version of the claim
        (https://kubernetes.io/docs/reference/using-api/api-concepts/#conflicts), so a
        condition another writer added since is never dropped (a merge patch replaces
        ``status.conditions`` whole).

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the claim as stored, `Outcome.GONE` (404), or
            `Outcome.CONFLICT` (409: the claim changed since ``resource_version``).

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 404 and 409.
        """
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            written = self.patch_status(claim_resource(version), namespace, name, body)
        except ApiException as exc:
            if exc.status == 409:
                return Write(Outcome.CONFLICT)
            raise
        return self._expect("ipaddressclaims", namespace, name, written)

    def set_claim_finalizer(self, claim: Claim, finalizer: str, present: bool) -> Write:
        """Add or remove ``finalizer`` on a claim as read (`Kube.set_finalizer`).

        Guarded by the claim's resourceVersion: a claim changed since it was read answers
        `Outcome.CONFLICT`.
        """
        written = self.set_finalizer(
            claim_resource(claim.version), claim.as_object(), finalizer, present
        )
        return self._expect("ipaddressclaims", claim.namespace, claim.name, written)

    # -- IPAddresses --------------------------------------------------------------

    def get_ip_address(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return an ``IPAddress``, or None when it does not exist."""
        return self.get(address_resource(version), namespace, name)

    def list_ip_addresses(self, version: str, namespace: str | None) -> list[dict[str, Any]]:
        """Return every ``IPAddress`` of a namespace (None: of all namespaces)."""
        return self.list(Resource(GROUP, version, "ipaddresses"), (namespace,))

    def create_ip_address(self, version: str, body: Mapping[str, Any]) -> Write:
        """Create an ``IPAddress`` (its version recorded in `expectations`).

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the stored IPAddress; on 409 AlreadyExists the one of that
            name is read: `Outcome.CONFLICT` with it (None when it was deleted meanwhile), so
            the caller can tell its own from a foreign one.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 409 of the create, any failure but 404 of the read.
        """
        meta = body["metadata"]
        created = self.create(address_resource(version), body)
        if created.outcome is not Outcome.CONFLICT:
            return self._expect("ipaddresses", meta["namespace"], meta["name"], created)
        return Write(
            Outcome.CONFLICT, self.get_ip_address(version, meta["namespace"], meta["name"])
        )

    def delete_ip_address(
        self,
        version: str,
        namespace: str,
        name: str,
        current: Mapping[str, Any] | None = None,
    ) -> Write:
        """Remove our ``ProtectAddress`` finalizer from an ``IPAddress`` and delete it.

        The finalizer goes first (the contract: an IPAddress must not outlive its claim's
        finalizer); a missing object is success; ``current`` is the IPAddress as last seen
        (see `Kube.delete`, which gives the outcome).
        """
        deleted = self.delete(
            address_resource(version), namespace, name, finalizer=ADDRESS_FINALIZER, current=current
        )
        return self._expect("ipaddresses", namespace, name, deleted, deletion=True)

    # -- pools ----------------------------------------------------------------------

    def get_pool(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """Return a pool object of one of our kinds, or None when it does not exist.

        A Global kind is cluster-scoped: ``namespace`` is ignored (pass ``""``).
        """
        return self.get(pool_resource(kind), namespace, name)

    def list_pools(self, kind: str, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Return every pool of ``kind`` in ``namespaces`` (empty: all namespaces).

        A Global kind is cluster-scoped: all of them, whatever ``namespaces``. Each item
        carries its ``kind`` and ``apiVersion``.
        """
        return self.list(pool_resource(kind), namespaces)

    def set_pool_finalizer(self, pool: IPPool, finalizer: str, present: bool) -> Write:
        """Add or remove ``finalizer`` on a pool as read (`Kube.set_finalizer`)."""
        return self.set_finalizer(pool_resource(pool.kind), pool.as_object(), finalizer, present)

    def annotate_pool(self, pool: IPPool, key: str, value: str | None) -> Write:
        """Set (or, with None, remove) one annotation of a pool (`Kube.patch`, unguarded).

        Returns
        -------
        Write
            `Outcome.WRITTEN`, `Outcome.GONE` (no such pool), or `Outcome.UNCHANGED` when
            the pool as read already holds ``value`` (no request).
        """
        if pool.metadata.annotations.get(key) == value:
            return Write(Outcome.UNCHANGED)
        return self.patch(
            pool_resource(pool.kind),
            pool.metadata.namespace,
            pool.name,
            {"metadata": {"annotations": {key: value}}},
        )

    def patch_pool_status(
        self,
        namespace: str,
        kind: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> Write:
        """Merge-patch a pool's status subresource (`Kube.patch_status`).

        A Global kind is cluster-scoped: ``namespace`` is ignored. With
        ``resource_version`` the patch carries ``metadata.resourceVersion``: the API server
        applies it only to that version of the pool and answers 409 Conflict otherwise
        (https://kubernetes.io/docs/reference/using-api/api-concepts/#conflicts). A writer
        of a list (``status.conditions``: a merge patch replaces lists whole) passes the
        version it merged into, so a condition written by another writer since is never
        dropped.

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the pool as stored, `Outcome.GONE` (404), or
            `Outcome.CONFLICT` (409: the pool changed since ``resource_version``).

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 404 and 409.
        """
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            return self.patch_status(pool_resource(kind), namespace, name, body)
        except ApiException as exc:
            if exc.status == 409:
                return Write(Outcome.CONFLICT)
            raise

    def patch_pool_conditions(self, pool: IPPool, conditions: Sequence[Condition]) -> Write:
        """Write a pool's ``status.conditions`` whole, guarded by the resourceVersion read.

        For a writer that owns one condition type among others (the drift audit's
        ``InSync``): a status written by someone else since makes the API answer 409
        Conflict instead of being overwritten.

        Parameters
        ----------
        pool:
            The pool as read (its ``resourceVersion`` guards the write).
        conditions:
            The whole new list of conditions (written as `bridge.models.wire` gives them).

        Returns
        -------
        Write
            As `patch_pool_status`: `Outcome.CONFLICT` when the pool changed since it was
            read.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 404 and 409.
        """
        return self.patch_pool_status(
            pool.metadata.namespace,
            pool.kind,
            pool.name,
            {"conditions": [wire(c) for c in conditions]},
            resource_version=pool.metadata.resource_version or None,
        )

    # -- Clusters -------------------------------------------------------------------

    def get_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return the CAPI ``Cluster`` object, or None when it (or the Cluster CRD) is absent."""
        for version in CLUSTER_VERSIONS:
            cluster = self.get(cluster_resource(version), namespace, name)
            if cluster is not None:
                return cluster
        return None

    def list_clusters(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]] | None:
        """Return the CAPI ``Cluster`` objects of ``namespaces`` (empty: all namespaces).

        In the first served version of ``v1beta2``, ``v1beta1``; None when Clusters are not
        served at all (a management cluster without CAPI core).
        """
        for version in CLUSTER_VERSIONS:
            try:
                return self.list(cluster_resource(version), namespaces)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return None

    def read_cluster(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return the CAPI ``Cluster`` as served in ``version``, or None.

        For control-plane endpoints (`bridge.reconcilers.control_plane`): one GET in the
        version detected at start-up, so the patch that follows speaks the same schema.
        """
        return self.get(cluster_resource(version), namespace, name)

    def patch_cluster(
        self, version: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Write:
        """Merge-patch a CAPI ``Cluster`` (`Kube.patch`).

        The caller puts the ``metadata.resourceVersion`` it read into ``patch``; lists in the
        patch (``spec.topology.variables``) replace the stored ones whole.

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the Cluster as stored, `Outcome.GONE`, or
            `Outcome.CONFLICT` (the resourceVersion is stale).

        Raises
        ------
        kubernetes.client.ApiException
            422 when the Cluster's schema refuses the result; any other failure but 404
            and 409.
        """
        return self.patch(cluster_resource(version), namespace, name, patch)

    # -- objects a Cluster references ---------------------------------------------------

    def referenced_resource(self, ref: ObjectRef) -> Resource:
        """Return where the object of ``ref`` (a Cluster's InfraCluster, control plane) lives.

        The version is the one ``ref`` names when it is served (v1beta1 references), else
        the group's preferred version; the plural is the resource of that kind (API
        discovery: ``/apis`` and ``/apis/<group>/<version>``,
        https://kubernetes.io/docs/concepts/overview/kubernetes-api/#discovery-api). Found
        resources are remembered for the process's life (CRDs are installed before use).

        Raises
        ------
        NotServedError
            When the group or the kind is not served.
        kubernetes.client.ApiException
            When discovery fails.
        """
        key = (ref.group, ref.version, ref.kind)
        found = self._referenced.get(key)
        if found is not None:
            return found
        groups = ApisApi(self.client).get_api_versions().groups or []
        group = next((g for g in groups if g.name == ref.group), None)
        if group is None:
            raise NotServedError(f"API group {ref.group} is not served")
        served = [str(v.version) for v in group.versions or []]
        preferred = str(group.preferred_version.version) if group.preferred_version else ""
        versions = [v for v in dict.fromkeys([ref.version, preferred, *served]) if v in served]
        for version in versions:
            listed = CustomObjectsApi(self.client).get_api_resources(ref.group, version)
            for r in listed.resources or []:
                if r.kind == ref.kind and "/" not in r.name:
                    found = Resource(ref.group, version, r.name, ref.kind, bool(r.namespaced))
                    with self._referenced_lock:
                        self._referenced[key] = found
                    return found
        raise NotServedError(f"{ref.kind}.{ref.group} is not served")

    def get_referenced(self, namespace: str, ref: ObjectRef) -> dict[str, Any] | None:
        """Return the object ``ref`` names in ``namespace``, or None when it does not exist.

        Raises
        ------
        NotServedError
            When its kind is not served (`referenced_resource`).
        kubernetes.client.ApiException
            Any failure but 404 (403: the operator may not read that kind).
        """
        return self.get(self.referenced_resource(ref), namespace, ref.name)

    def patch_referenced(self, namespace: str, ref: ObjectRef, patch: Mapping[str, Any]) -> Write:
        """Merge-patch the object ``ref`` names; answer the write (`Kube.patch`).

        Written with the object as stored, gone, or a conflict (409: the resourceVersion is
        stale).

        The caller puts the ``metadata.resourceVersion`` it read into ``patch`` (`Kube.patch`).

        Raises
        ------
        NotServedError
            When its kind is not served.
        kubernetes.client.ApiException
            403 when the operator may not patch that kind; 422 when the schema or a webhook
            refuses; any other failure but 404 and 409.
        """
        return self.patch(self.referenced_resource(ref), namespace, ref.name, patch)
