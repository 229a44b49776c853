"""Fakes of the Kubernetes gateway, an IPAM backend and the work queue for service tests.

`FakeKube` implements the `bridge.runtime.gateway.Kube` methods the services call, over in-memory
objects, with the API server's behaviour that matters to them: finalizer patches guarded by
``resourceVersion`` (409 on a stale one), an object being deleted goes when its last finalizer
does, status merge patches return what was stored (optionally pruning ``status.v1beta2`` as a
CAPI < 1.9 schema does), creates of an existing name answer "exists". Every write is recorded
in `FakeKube.writes` (and every read in `FakeKube.reads`); `FakeKube.timeline` interleaves
writes with the calls of any `FakeBackend` given the same list.

`FakeBackend` implements `backends.base.IPAMBackend` over a small subnet; `install_backend`
makes `bridge.reconcilers.backend_clients.PoolClients.backend_for` build it, one client per
pool location.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from kubernetes.client import ApiException

from backends.base import (
    QUARANTINE_PREFIX,
    Allocation,
    EntryOwner,
    SubnetInfo,
    may_adopt,
    quarantine_mark,
)
from backends.errors import (
    AddressUnavailableError,
    BackendError,
    EntryOwnedError,
    SubnetExhaustedError,
)
from bridge.capi import (
    ADDRESS_FINALIZER,
    CLAIM_FINALIZER,
    GLOBAL_POOL_KINDS,
    GROUP,
    POOL_KINDS,
    Claim,
)
from bridge.models import IPPool
from bridge.reconcilers import backend_clients
from bridge.reconcilers.pool_backends import Pool, location_of
from bridge.runtime.gateway import Outcome
from bridge.runtime.gateway import Write as KubeWrite

DELETED_AT = "2026-01-01T00:00:00Z"


class Write(NamedTuple):
    """One recorded API write: ``op``, the object (``ns/name`` or ``ns/Kind/name``), detail."""

    op: str
    target: str
    detail: Any = None


def _merge(into: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """Apply a JSON merge patch (RFC 7386) to ``into``."""
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


class FakeKube:
    """In-memory objects behind the `bridge.runtime.gateway.Kube` methods the services use.

    Objects are stored as given (use the ``add_*`` helpers); reads return deep copies, so
    a service can never change the store except through a write method.

    Attributes
    ----------
    writes:
        Every write, in order (`Write`). Ops: ``claim.finalizer``, ``claim.status``,
        ``address.create``, ``address.finalizer``, ``address.delete``, ``pool.finalizer``,
        ``pool.status``, ``secret.finalizer``, ``event``, ``claim.create``,
        ``cluster.patch``. Finalizer details are
        ``(finalizer, present)``; an event's is ``(type, reason, message)``.
    reads:
        Every read: ``(method, target)``.
    timeline:
        Reads (``("read", method, target)``), writes (``("kube", op, target)``) and backend
        calls, in order.
    prune_v1beta2:
        When True, `patch_claim_status` stores no ``status.v1beta2`` (a CAPI < 1.9 schema).
    """

    def __init__(self, timeline: list[tuple[str, ...]] | None = None) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.addresses: dict[tuple[str, str], dict[str, Any]] = {}
        self.pools: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.clusters: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[Write] = []
        self.reads: list[tuple[str, str]] = []
        self.timeline: list[tuple[str, ...]] = timeline if timeline is not None else []
        self.prune_v1beta2 = False
        self.event_error: ApiException | None = None
        #: Called with the namespace once a `list_pools` has listed (races in tests).
        self.on_list_pools: Callable[[str], None] | None = None
        #: Secret ``(namespace, name)`` -> how many finalizer writes answer 409 Conflict.
        self.secret_conflicts: dict[tuple[str, str], int] = {}
        self._version = 100

    # -- helpers for tests ----------------------------------------------------------------

    def _rv(self) -> str:
        self._version += 1
        return str(self._version)

    def _read(self, read: tuple[str, str]) -> None:
        self.reads.append(read)
        self.timeline.append(("read", *read))

    def _record(self, op: str, target: str, detail: Any = None) -> None:
        self.writes.append(Write(op, target, detail))
        self.timeline.append(("kube", op, target))

    def add_claim(self, body: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(dict(body))
        meta = stored.setdefault("metadata", {})
        meta.setdefault("resourceVersion", self._rv())
        meta.setdefault("generation", 1)
        self.claims[(meta["namespace"], meta["name"])] = stored
        return stored

    def add_address(self, body: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(dict(body))
        meta = stored.setdefault("metadata", {})
        meta.setdefault("resourceVersion", self._rv())
        self.addresses[(meta["namespace"], meta["name"])] = stored
        return stored

    def add_pool(self, body: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(dict(body))
        meta = stored.setdefault("metadata", {})
        meta.setdefault("resourceVersion", self._rv())
        meta.setdefault("generation", 1)
        self.pools[(meta.get("namespace", ""), stored["kind"], meta["name"])] = stored
        return stored

    def add_cluster(self, namespace: str, name: str, **body: Any) -> None:
        self.clusters[(namespace, name)] = {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"namespace": namespace, "name": name, **body.pop("metadata", {})},
            **body,
        }

    def add_secret(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, str],
        *,
        finalizers: tuple[str, ...] = (),
        deleting: bool = False,
    ) -> None:
        self.secrets[(namespace, name)] = {
            "data": dict(data),
            "finalizers": list(finalizers),
            "deleting": deleting,
        }

    def secret_finalizers(self, namespace: str, name: str) -> list[str]:
        return list(self.secrets[(namespace, name)]["finalizers"])

    def ops(self) -> list[str]:
        """Return the ops of the recorded writes, in order."""
        return [write.op for write in self.writes]

    def of(self, op: str) -> list[Write]:
        """Return the recorded writes of one op."""
        return [write for write in self.writes if write.op == op]

    @property
    def events(self) -> list[tuple[str, str, str]]:
        """``(type, reason, message)`` of every Event posted."""
        return [write.detail for write in self.of("event")]

    def read(self, method: str) -> list[str]:
        """Return the targets of the recorded reads of one method."""
        return [target for name, target in self.reads if name == method]

    # -- reads ------------------------------------------------------------------------------

    def get_claim(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        self._read(("get_claim", f"{namespace}/{name}"))
        found = self.claims.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def list_claims(self, version: str, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        self._read(("list_claims", ",".join(namespaces)))
        return [
            copy.deepcopy(body)
            for (ns, _), body in self.claims.items()
            if not namespaces or ns in namespaces
        ]

    def get_ip_address(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        self._read(("get_ip_address", f"{namespace}/{name}"))
        found = self.addresses.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def list_ip_addresses(self, version: str, namespace: str | None) -> list[dict[str, Any]]:
        self._read(("list_ip_addresses", namespace or "*"))
        return [
            copy.deepcopy(b)
            for (ns, _), b in self.addresses.items()
            if namespace is None or ns == namespace
        ]

    def get_pool(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        self._read(("get_pool", f"{namespace}/{kind}/{name}"))
        found = self.pools.get((namespace, kind, name))
        return copy.deepcopy(found) if found is not None else None

    def list_pools(self, kind: str, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        assert kind in POOL_KINDS
        self._read(("list_pools", f"{','.join(namespaces)}/{kind}"))
        items = [
            copy.deepcopy(body)
            for (ns, k, _), body in self.pools.items()
            if k == kind and (not namespaces or ns in namespaces or kind in GLOBAL_POOL_KINDS)
        ]
        if self.on_list_pools is not None:
            for namespace in namespaces:
                self.on_list_pools(namespace)  # after the listing: the caller's view is stale
        return items

    def get_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._read(("get_cluster", f"{namespace}/{name}"))
        found = self.clusters.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def read_cluster(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        self._read(("read_cluster", f"{namespace}/{name}"))
        found = self.clusters.get((namespace, name))
        if found is None:
            return None
        found.setdefault("metadata", {}).setdefault("resourceVersion", self._rv())
        return copy.deepcopy(found)

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        self._read(("read_secret", f"{namespace}/{name}"))
        found = self.secrets.get((namespace, name))
        return dict(found["data"]) if found is not None else None

    # -- writes -----------------------------------------------------------------------------

    def _set_finalizers(
        self,
        store: dict[Any, dict[str, Any]],
        key: Any,
        obj: Mapping[str, Any],
        finalizer: str,
        present: bool,
        op: str,
        target: str,
    ) -> KubeWrite:
        """Add or remove a finalizer as `gateway.Kube.set_finalizer` does, over ``store``."""
        meta = obj.get("metadata") or {}
        current = list(meta.get("finalizers") or [])
        wanted = [f for f in current if f != finalizer] + ([finalizer] if present else [])
        if wanted == current:
            return KubeWrite(Outcome.UNCHANGED)
        stored = store.get(key)
        if stored is None:
            return KubeWrite(Outcome.GONE)
        if meta.get("resourceVersion") != stored["metadata"].get("resourceVersion"):
            return KubeWrite(Outcome.CONFLICT)
        self._record(op, target, (finalizer, present))
        stored["metadata"]["finalizers"] = wanted
        stored["metadata"]["resourceVersion"] = self._rv()
        if not wanted and stored["metadata"].get("deletionTimestamp"):
            del store[key]
        return KubeWrite(Outcome.WRITTEN, copy.deepcopy(stored))

    def set_claim_finalizer(self, claim: Claim, finalizer: str, present: bool) -> KubeWrite:
        obj = claim.as_object()
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        return self._set_finalizers(
            self.claims, key, obj, finalizer, present, "claim.finalizer", "/".join(key)
        )

    def create_claim(self, version: str, body: Mapping[str, Any]) -> KubeWrite:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self.claims:
            return KubeWrite(Outcome.CONFLICT)
        self._record("claim.create", "/".join(key), copy.deepcopy(dict(body)))
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["uid"] = f"uid-claim-{meta['name']}"
        return KubeWrite(Outcome.WRITTEN, copy.deepcopy(self.add_claim(stored)))

    def patch_cluster(
        self, version: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> KubeWrite:
        """Merge-patch a Cluster; a stale ``metadata.resourceVersion`` in it is a conflict."""
        stored = self.clusters.get((namespace, name))
        if stored is None:
            return KubeWrite(Outcome.GONE)
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != stored["metadata"].get("resourceVersion"):
            return KubeWrite(Outcome.CONFLICT)
        self._record("cluster.patch", f"{namespace}/{name}", copy.deepcopy(dict(patch)))
        _merge(stored, {k: v for k, v in patch.items() if k != "metadata"})
        stored["metadata"]["resourceVersion"] = self._rv()
        return KubeWrite(Outcome.WRITTEN, copy.deepcopy(stored))

    def patch_claim_status(
        self,
        version: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> KubeWrite:
        stored = self.claims.get((namespace, name))
        if stored is None:
            return KubeWrite(Outcome.GONE)
        if resource_version is not None and resource_version != stored["metadata"].get(
            "resourceVersion"
        ):
            return KubeWrite(Outcome.CONFLICT)
        self._record("claim.status", f"{namespace}/{name}", copy.deepcopy(dict(status)))
        current = stored.setdefault("status", {})
        _merge(current, status)
        if self.prune_v1beta2:
            current.pop("v1beta2", None)
        stored["metadata"]["resourceVersion"] = self._rv()
        return KubeWrite(Outcome.WRITTEN, copy.deepcopy(stored))

    def create_ip_address(self, version: str, body: Mapping[str, Any]) -> KubeWrite:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self.addresses:
            return KubeWrite(Outcome.CONFLICT, copy.deepcopy(self.addresses[key]))
        self._record("address.create", "/".join(key), copy.deepcopy(dict(body)))
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["resourceVersion"] = self._rv()
        stored["metadata"]["uid"] = f"uid-address-{meta['name']}"
        self.addresses[key] = stored
        return KubeWrite(Outcome.WRITTEN, copy.deepcopy(stored))

    def delete_ip_address(
        self, version: str, namespace: str, name: str, current: Any = None
    ) -> KubeWrite:
        stored = self.addresses.get((namespace, name))
        if stored is None:
            return KubeWrite(Outcome.GONE)
        finalizers = list(stored["metadata"].get("finalizers") or [])
        if ADDRESS_FINALIZER in finalizers:
            self._record("address.finalizer", f"{namespace}/{name}", (ADDRESS_FINALIZER, False))
            finalizers.remove(ADDRESS_FINALIZER)
            stored["metadata"]["finalizers"] = finalizers
        self._record("address.delete", f"{namespace}/{name}")
        if finalizers:  # someone else's finalizer holds it
            stored["metadata"]["deletionTimestamp"] = DELETED_AT
        else:
            del self.addresses[(namespace, name)]
        return KubeWrite(Outcome.WRITTEN)

    def set_pool_finalizer(self, pool: IPPool, finalizer: str, present: bool) -> KubeWrite:
        key = (pool.metadata.namespace, pool.kind, pool.name)
        return self._set_finalizers(
            self.pools, key, pool.as_object(), finalizer, present, "pool.finalizer", "/".join(key)
        )

    def annotate_pool(self, pool: IPPool, key: str, value: str | None) -> KubeWrite:
        namespace, name = pool.metadata.namespace, pool.name
        stored = self.pools.get((namespace, pool.kind, name))
        if stored is None:
            return KubeWrite(Outcome.GONE)
        annotations = stored["metadata"].setdefault("annotations", {})
        if annotations.get(key) == value:
            return KubeWrite(Outcome.UNCHANGED)
        self._record("pool.annotate", f"{namespace}/{name}", (key, value))
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value
        stored["metadata"]["resourceVersion"] = self._rv()
        return KubeWrite(Outcome.WRITTEN, copy.deepcopy(stored))

    def patch_pool_status(
        self,
        namespace: str,
        kind: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> KubeWrite:
        stored = self.pools.get((namespace, kind, name))
        if stored is None:
            return KubeWrite(Outcome.GONE)
        if resource_version is not None and resource_version != stored["metadata"].get(
            "resourceVersion"
        ):
            return KubeWrite(Outcome.CONFLICT)
        self._record("pool.status", f"{namespace}/{kind}/{name}", copy.deepcopy(dict(status)))
        _merge(stored.setdefault("status", {}), status)
        stored["metadata"]["resourceVersion"] = self._rv()
        return KubeWrite(Outcome.WRITTEN, copy.deepcopy(stored))

    def set_secret_finalizer(
        self, namespace: str, name: str, finalizer: str, present: bool
    ) -> KubeWrite:
        """Change a Secret's finalizers as `gateway.Kube.set_secret_finalizer` does.

        While ``secret_conflicts`` counts a Secret, each write it needs answers
        `Outcome.CONFLICT` (the Secret changed between the read and the write) and the count
        drops by one.
        """
        secret = self.secrets.get((namespace, name))
        if secret is None:
            return KubeWrite(Outcome.GONE)
        current = secret["finalizers"]
        if present and secret["deleting"] and finalizer not in current:
            return KubeWrite(Outcome.UNCHANGED)  # the API refuses new finalizers when deleting
        wanted = [f for f in current if f != finalizer] + ([finalizer] if present else [])
        if wanted == current:
            return KubeWrite(Outcome.UNCHANGED)
        if self.secret_conflicts.get((namespace, name), 0) > 0:
            self.secret_conflicts[(namespace, name)] -= 1
            return KubeWrite(Outcome.CONFLICT)
        self._record("secret.finalizer", f"{namespace}/{name}", (finalizer, present))
        secret["finalizers"] = wanted
        return KubeWrite(Outcome.WRITTEN)

    def post_event(self, obj: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
        if self.event_error is not None:
            raise self.event_error
        meta = obj.get("metadata") or {}
        self._record(
            "event", f"{meta.get('namespace')}/{meta.get('name')}", (type, reason, message)
        )

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Record the Event as `post_event` does (``events`` lists it)."""
        if self.event_error is not None:
            raise self.event_error
        involved = event["involvedObject"]
        self._record(
            "event",
            f"{involved.get('namespace')}/{involved.get('name')}",
            (event["type"], event["reason"], event["message"]),
        )

    def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Record a repeat of an Event as ``event.patch`` (not in ``events``)."""
        if self.event_error is not None:
            raise self.event_error
        self._record("event.patch", f"{namespace}/{name}", dict(patch))

    def close(self) -> None:
        pass


# -- the IPAM ---------------------------------------------------------------------------------


@dataclass
class FakeIPAM:
    """What the fake IPAM holds, shared by every `FakeBackend` client of it.

    ``cidr``/``gateway`` are the first subnet; ``more`` the following ones (``(cidr,
    gateway)``), in the pool's order. A claim gets the first free address of the first subnet
    with one; the gateway of each subnet is never handed out.
    """

    cidr: str = "10.0.0.0/29"
    gateway: str | None = "10.0.0.1"
    more: list[tuple[str, str | None]] = field(default_factory=list)
    #: hostname -> address.
    entries: dict[str, str] = field(default_factory=dict)
    #: hostname -> the owner its entry names (absent: none, as a person's reservation).
    owners: dict[str, EntryOwner] = field(default_factory=dict)
    #: address -> (quarantined hostname, until), entries released with a grace period.
    quarantined: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: address -> the owner a quarantined entry names (absent: none).
    quarantined_owners: dict[str, EntryOwner] = field(default_factory=dict)
    #: Hostnames whose owner an ``allocate`` wrote on an existing entry, in order.
    stamped: list[str] = field(default_factory=list)
    #: ``(operation, hostname, location)`` of every call, in order.
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    #: Raised by the next calls (and kept) when set.
    error: BackendError | None = None
    timeline: list[tuple[str, ...]] | None = None

    @property
    def subnets(self) -> list[tuple[str, str | None]]:
        """``(cidr, gateway)`` of every subnet, in order."""
        return [(self.cidr, self.gateway), *self.more]


class FakeBackend:
    """An `backends.base.IPAMBackend` client of a `FakeIPAM`, at one location.

    Parameters
    ----------
    ipam:
        The shared IPAM state.
    location:
        `pool_backends.location_of` of the pool the client was built for (recorded with each
        call).
    """

    def __init__(self, ipam: FakeIPAM | None = None, location: str = "") -> None:
        self.ipam = ipam if ipam is not None else FakeIPAM()
        self.location = location
        self.closed = False

    def _call(self, operation: str, hostname: str) -> None:
        self.ipam.calls.append((operation, hostname, self.location))
        if self.ipam.timeline is not None:
            self.ipam.timeline.append(("backend", operation, hostname))
        if self.ipam.error is not None:
            raise self.ipam.error

    def _subnet_of(self, address: str) -> tuple[str, str | None] | None:
        ip = ipaddress.ip_address(address)
        for cidr, gateway in self.ipam.subnets:
            if ip in ipaddress.ip_network(cidr):
                return cidr, gateway
        return None

    def _allocation(self, hostname: str) -> Allocation:
        address = self.ipam.entries[hostname]
        cidr, gateway = self._subnet_of(address) or (self.ipam.cidr, self.ipam.gateway)
        return Allocation(
            address=address,
            prefix=ipaddress.ip_network(cidr).prefixlen,
            gateway=gateway,
            hostname=hostname,
            ref=f"ref-{address}",
            subnet=cidr,
            owner=self.ipam.owners.get(hostname),
        )

    def _taken(self) -> set[str]:
        gateways = {g for _, g in self.ipam.subnets if g}
        return set(self.ipam.entries.values()) | set(self.ipam.quarantined) | gateways

    def describe_subnets(self) -> list[SubnetInfo]:
        self._call("describe_subnets", "")
        infos = []
        taken = self._taken()
        for cidr, gateway in self.ipam.subnets:
            network = ipaddress.ip_network(cidr)
            hosts = [str(a) for a in network.hosts()]
            used = sum(1 for a in hosts if a in taken)
            infos.append(
                SubnetInfo(
                    cidr=cidr,
                    prefix=network.prefixlen,
                    gateway=gateway,
                    total=len(hosts),
                    used=used,
                    free=max(len(hosts) - used, 0),
                )
            )
        return infos

    def find(self, hostname: str) -> Allocation | None:
        self._call("find", hostname)
        return self._allocation(hostname) if hostname in self.ipam.entries else None

    def allocate(
        self,
        hostname: str,
        owner: EntryOwner,
        address: str | None = None,
        *,
        adopt: str | None = None,
    ) -> Allocation:
        self._call("allocate", hostname)
        existing = self.ipam.entries.get(hostname)
        if existing is not None and not may_adopt(self._allocation(hostname), owner, adopt):
            holder = self.ipam.owners[hostname]
            raise EntryOwnedError(
                f"{hostname} belongs to {holder}", hostname=hostname, address=existing, owner=holder
            )
        if existing is not None and (address is None or existing == address):
            found = self._allocation(hostname)
            if found.owner != owner:
                self.ipam.owners[hostname] = owner
                self.ipam.stamped.append(hostname)
            return self._allocation(hostname)
        return self._register(hostname, owner, address)

    def _register(self, hostname: str, owner: EntryOwner, address: str | None) -> Allocation:
        """Register ``address`` (or the first free one) under ``hostname`` for ``owner``."""
        taken = self._taken()
        if address is not None:
            if self._subnet_of(address) is None:
                raise AddressUnavailableError(
                    f"{address} lies outside the subnets of the pool", address=address
                )
            if address in taken:
                holder = next((h for h, a in self.ipam.entries.items() if a == address), None)
                if holder is None and address in self.ipam.quarantined:
                    holder = self.ipam.quarantined[address][0]
                raise AddressUnavailableError(
                    f"{address} is already registered", address=address, holder=holder
                )
            self.ipam.entries[hostname] = address
            self.ipam.owners[hostname] = owner
            return self._allocation(hostname)
        for cidr, _ in self.ipam.subnets:
            free = [str(a) for a in ipaddress.ip_network(cidr).hosts() if str(a) not in taken]
            if free:
                self.ipam.entries[hostname] = free[0]
                self.ipam.owners[hostname] = owner
                return self._allocation(hostname)
        raise SubnetExhaustedError("no subnet of the pool has a free address")

    def release(
        self,
        hostname: str,
        owner: EntryOwner,
        quarantine_until: float | None = None,
        *,
        address: str | None = None,
    ) -> bool:
        self._call("release", hostname)
        if hostname not in self.ipam.entries:
            return False
        if not may_adopt(self._allocation(hostname), owner, address):
            return False  # another cluster's or claim's entry: left alone
        held = self.ipam.entries.pop(hostname)
        stamped = self.ipam.owners.pop(hostname, None)
        if quarantine_until is not None:
            self.ipam.quarantined[held] = (QUARANTINE_PREFIX + hostname, quarantine_until)
            if stamped is not None:
                self.ipam.quarantined_owners[held] = stamped
        return True

    def purge_quarantined(self, now: float, cluster_id: str) -> list[str]:
        self._call("purge_quarantined", "")
        owners = self.ipam.quarantined_owners
        due = sorted(
            a
            for a, (_, until) in self.ipam.quarantined.items()
            if until <= now and (a not in owners or owners[a].cluster_id in ("", cluster_id))
        )
        for address in due:
            del self.ipam.quarantined[address]
            owners.pop(address, None)
        return due

    def entries(self) -> list[Allocation]:
        self._call("entries", "")
        found = [self._allocation(h) for h in self.ipam.entries]
        for address, (hostname, until) in self.ipam.quarantined.items():
            cidr, gateway = self._subnet_of(address) or (self.ipam.cidr, self.ipam.gateway)
            found.append(
                Allocation(
                    address=address,
                    prefix=ipaddress.ip_network(cidr).prefixlen,
                    gateway=gateway,
                    hostname=hostname,
                    ref=f"ref-{address}",
                    subnet=cidr,
                    description=quarantine_mark(until),
                    quarantined_until=until,
                    owner=self.ipam.quarantined_owners.get(address),
                )
            )
        return found

    def close(self) -> None:
        self.closed = True


def install_backend(monkeypatch: pytest.MonkeyPatch, ipam: FakeIPAM) -> list[FakeBackend]:
    """Make `bridge.reconcilers.backend_clients.PoolClients.backend_for` build them.

    Returns the list of clients built, in order (each knows the location it was built for).
    """
    built: list[FakeBackend] = []

    def build(pool: Pool, secret: Mapping[str, str], ca_pem: str | None, **_: Any) -> FakeBackend:
        built.append(FakeBackend(ipam, location_of(pool)))
        return built[-1]

    monkeypatch.setattr(backend_clients, "build_backend", build)
    return built


# -- the work queue ---------------------------------------------------------------------------


class FakeQueue:
    """Records `add` and `wake` (the `workqueue.WorkQueue` methods the services call)."""

    def __init__(self) -> None:
        self.added: list[tuple[Any, float]] = []
        self.woken: list[Any] = []
        self.parked_keys: dict[Any, set[Any]] = {}

    def add(
        self,
        key: Any,
        after: float = 0.0,
        *,
        background: bool = False,
        unless: Callable[[], bool] | None = None,
        first: bool = False,
    ) -> None:
        # As `WorkQueue.add` for a key that is not being processed: ``unless`` asked now.
        if unless is None or not unless():
            self.added.append((key, after))

    def wake(self, token: Any, count: int | None = None) -> int:
        self.woken.append(token if count is None else (token, count))
        return 0

    def parked(self, token: Any) -> frozenset[Any]:
        return frozenset(self.parked_keys.get(token, ()))

    def is_parked(self, key: Any) -> bool:
        return any(key in keys for keys in self.parked_keys.values())

    def sizes(self) -> dict[str, int]:
        return {}

    def stalled(self) -> float:
        return 0.0


# -- object builders --------------------------------------------------------------------------


def phpipam_pool(
    name: str = "pool",
    namespace: str = "ns",
    *,
    secret: str = "creds",
    generation: int = 1,
    deleting: bool = False,
    finalizers: tuple[str, ...] = (),
    status: Mapping[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "PHPIPAMIPPool",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "generation": generation,
            "finalizers": list(finalizers),
        },
        "spec": {
            "endpoint": "https://ipam.example.com",
            "appId": "capi",
            "subnet": "10.0.0.0/29",
            "credentialsRef": {"name": secret},
            **spec,
        },
    }
    if deleting:
        body["metadata"]["deletionTimestamp"] = DELETED_AT
    if status is not None:
        body["status"] = copy.deepcopy(dict(status))
    return body


def claim(
    name: str = "c1",
    namespace: str = "ns",
    *,
    pool: str = "pool",
    kind: str = "PHPIPAMIPPool",
    group: str = GROUP,
    version: str = "v1beta2",
    cluster: str | None = None,
    finalizers: tuple[str, ...] = (),
    deleting: bool = False,
    address_ref: str | None = None,
    annotations: Mapping[str, str] | None = None,
    status: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return an IPAddressClaim body (``ours`` by default: a PHPIPAMIPPool of our group)."""
    spec: dict[str, Any] = {"poolRef": {"apiGroup": group, "kind": kind, "name": pool}}
    if cluster:
        spec["clusterName"] = cluster
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "IPAddressClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "generation": 1,
            "finalizers": list(finalizers),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }
    if deleting:
        body["metadata"]["deletionTimestamp"] = DELETED_AT
    body["status"] = copy.deepcopy(dict(status or {}))
    if address_ref:
        body["status"]["addressRef"] = {"name": address_ref}
    return body


def ours(**kwargs: Any) -> dict[str, Any]:
    """Return `claim` carrying the contract's ``ReleaseAddress`` finalizer."""
    return claim(finalizers=(CLAIM_FINALIZER,), **kwargs)


def pool_condition(
    status: str = "True", reason: str = "PoolReady", message: str = "ok", *, generation: int = 1
) -> dict[str, Any]:
    """Return a pool ``status`` whose Ready condition is ``status`` for ``generation``."""
    return {
        "observedGeneration": generation,
        "conditions": [
            {
                "type": "Ready",
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": DELETED_AT,
                "observedGeneration": generation,
            }
        ],
    }


def local_kubeconfig(path: Path) -> Path:
    """Write a valid kubeconfig at ``path`` naming a server at 127.0.0.1 (nothing answers).

    For tests that run ``ipam-bridge run`` with ``kopf.run`` replaced: the configuration
    check before kopf loads it, no request is made.
    """
    path.write_text(
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- name: local\n"
        "  cluster: {server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}\n"
        "users:\n"
        "- name: test\n"
        "  user: {token: not-a-real-token}\n"
        "contexts:\n"
        "- name: local\n"
        "  context: {cluster: local, user: test}\n"
        "current-context: local\n"
    )
    return path
