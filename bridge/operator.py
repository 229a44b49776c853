"""The running operator: its shared services, built once at start-up, and each reconciler's.

`Operator` is the composition root: the start-up handler (`bridge.handlers.lifecycle`)
builds it from the settings, the Kubernetes client and the served versions; it makes the
dependencies of each reconciler (`Operator.claims`, `Operator.pools`, `Operator.clusters`)
and of the drift audit (`Operator.audit`), and routes work-queue keys to them
(`Operator.reconcile`). Reconcilers and the audit never see it: each gets only what it
uses. kopf's handlers find it in ``memo.bridge``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

from backends.flowcontrol import FlowControl
from bridge.capi import CLUSTER_GROUP, GROUP
from bridge.metrics import Metrics
from bridge.objects.cache import Cache
from bridge.objects.client import ObjectClient
from bridge.objects.keys import ClaimKey, ClusterKey, EndpointToken, PoolKey, endpoint_token
from bridge.reconcilers.audit import AuditDeps
from bridge.reconcilers.backend_clients import BackendCache, PoolClients
from bridge.reconcilers.claims import ClaimDeps, reconcile_claim
from bridge.reconcilers.context import (
    NamespaceLocks,
    Notices,
    Queue,
    ServedVersions,
)
from bridge.reconcilers.control_plane import ClusterDeps, reconcile_cluster
from bridge.reconcilers.pools import PoolDeps, reconcile_pool
from bridge.runtime import logcontext
from bridge.runtime.events import EventRecorder
from bridge.runtime.fence import Fence
from bridge.runtime.holds import PendingHolds
from bridge.runtime.waits import HoldOff, Places
from bridge.runtime.workqueue import Result
from bridge.settings import Settings

__all__ = ["NoQueue", "Operator", "OperatorQueue"]

log = logging.getLogger(__name__)


class OperatorQueue(Queue, Protocol):
    """The work queue as the operator sees it (`WorkQueue`): a `Queue` with its health."""

    def add(
        self,
        key: Hashable,
        after: float = 0.0,
        *,
        background: bool = False,
        unless: Callable[[], bool] | None = None,
        first: bool = False,
    ) -> None:
        """Queue ``key`` after ``after`` seconds (``background``: behind every due key).

        ``unless``: not queued if it answers True, asked now or after the key's running pass.
        ``first``: before every key due now.
        """

    def sizes(self) -> dict[str, int]:
        """Return the sizes of the queue's structures, by name."""

    def stalled(self) -> float:
        """Return for how many seconds due keys waited with no progress (0: none)."""

    def is_parked(self, key: Hashable) -> bool:
        """Return True while ``key`` is parked under a wake token."""


class NoQueue:
    """An `OperatorQueue` that drops every key (no work queue runs)."""

    def add(
        self,
        key: Hashable,
        after: float = 0.0,
        *,
        background: bool = False,
        unless: Callable[[], bool] | None = None,
        first: bool = False,
    ) -> None:
        """Drop ``key``."""

    def wake(self, token: Hashable, count: int | None = None) -> int:
        """Wake nothing; return 0."""
        return 0

    def parked(self, token: Hashable) -> frozenset[Hashable]:
        """Return no key."""
        return frozenset()

    def is_parked(self, key: Hashable) -> bool:
        """Return False: nothing is parked."""
        return False

    def sizes(self) -> dict[str, int]:
        """Return no size."""
        return {}

    def stalled(self) -> float:
        """Return 0.0: nothing is due."""
        return 0.0


@dataclass
class Operator:
    """The operator's services, and the dependencies of each reconciler made from them.

    Attributes
    ----------
    settings:
        The operator settings, ``cluster_id`` resolved (the start-up's
        `bridge.cluster_id.resolve_cluster_id`): every reconciler and the audit name this
        management cluster as the owner of the IPAM entries they write.
    kube:
        The Kubernetes objects (`bridge.objects.client.ObjectClient`, or a test's fake).
    versions:
        The served CAPI versions.
    queue:
        Where keys go (the `WorkQueue`; `NoQueue` in one-off tools).
    background_events:
        True: Events are posted by background threads (`EventRecorder`); False: in the
        caller's thread, an error other than a refusal raised (tests).
    flow:
        The flow control per IPAM server (`backends.flowcontrol.FlowControl`, built by
        `Settings.flow_control`), shared by every backend client and every claim: circuit
        breaker, one concurrency limit, login budget. Its hooks feed `metrics` and, when a
        place frees, ``places``.
    places:
        The claims parked for a place at an IPAM server, woken one per free place
        (`bridge.runtime.waits.Places`; made, not an argument).
    exhausted:
        The pools found with no free address, not asked again for a first-free address for
        ``requeue_exhausted_seconds`` or until one is freed (`bridge.runtime.waits.HoldOff`;
        made, not an argument).
    fence:
        This replica's write fence (`bridge.runtime.fence.Fence`; open without leader
        election): IPAM writes' timeouts are cut to its time left (`PoolClients.fence`).
    clients:
        The pools' backend clients (made from ``flow``, ``backends`` and ``fence``).
    claims, pools, clusters:
        What each reconciler uses (made from the above; not arguments).
    audit:
        What the drift audit uses (`bridge.reconcilers.audit.AuditDeps`; made from the
        above, its interval ``settings.audit_seconds``; not an argument).
    """

    settings: Settings
    kube: ObjectClient
    versions: ServedVersions
    queue: OperatorQueue = field(default_factory=NoQueue)
    background_events: bool = False
    metrics: Metrics = field(default_factory=Metrics)
    flow: FlowControl = field(default_factory=FlowControl)
    backends: BackendCache = field(default_factory=BackendCache)
    notices: Notices = field(default_factory=Notices)
    cache: Cache = field(default_factory=Cache)
    holds: PendingHolds = field(default_factory=PendingHolds)
    locks: NamespaceLocks = field(default_factory=NamespaceLocks)
    places: Places = field(init=False, repr=False)
    exhausted: HoldOff = field(init=False, repr=False)
    fence: Fence = field(default_factory=Fence.open)
    events: EventRecorder = field(init=False, repr=False)
    clients: PoolClients = field(init=False, repr=False)
    claims: ClaimDeps = field(init=False, repr=False)
    pools: PoolDeps = field(init=False, repr=False)
    clusters: ClusterDeps = field(init=False, repr=False)
    audit: AuditDeps = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.places = Places(self.queue, self._room)
        self.exhausted = HoldOff(self.settings.requeue_exhausted_seconds, self.flow.clock)
        self.flow.on_state = self.metrics.endpoint_changed
        self.flow.on_request = self.metrics.request_made
        self.flow.on_limit = self.metrics.endpoint_limit
        self.flow.on_free = lambda endpoint: self.places.freed(endpoint_token(endpoint))
        self.events = events = EventRecorder(
            self.kube, background=self.background_events, on_drop=self.metrics.event_dropped
        )
        self.clients = clients = PoolClients(
            self.settings, self.kube, self.flow, self.backends, self.fence
        )
        self.claims = ClaimDeps(
            settings=self.settings,
            kube=self.kube,
            versions=self.versions,
            cache=self.cache,
            queue=self.queue,
            events=events,
            metrics=self.metrics,
            clients=clients,
            flow=self.flow,
            places=self.places,
            exhausted=self.exhausted,
            holds=self.holds,
        )
        self.pools = PoolDeps(
            settings=self.settings,
            kube=self.kube,
            versions=self.versions,
            cache=self.cache,
            queue=self.queue,
            events=events,
            metrics=self.metrics,
            clients=clients,
            exhausted=self.exhausted,
            holds=self.holds,
            locks=self.locks,
        )
        self.clusters = ClusterDeps(
            kube=self.kube,
            versions=self.versions,
            events=events,
            notices=self.notices,
            targets=self.kube,
        )
        self.audit = AuditDeps(
            kube=self.kube,
            clients=clients,
            events=events,
            metrics=self.metrics,
            versions=self.versions,
            namespaces=self.settings.namespaces,
            interval=self.settings.audit_seconds,
            holding=self.backends.holding,
            cache=self.cache,
            cluster_id=self.settings.cluster_id,
        )

    def reconcile(self, key: Hashable) -> Result:
        """Run the reconciler of a work-queue key; the backend clients it takes are held.

        `ClaimKey` to `bridge.reconcilers.claims.reconcile_claim`, `PoolKey` to
        `bridge.reconcilers.pools.reconcile_pool`, `ClusterKey` to
        `bridge.reconcilers.control_plane.reconcile_cluster`. The clients are held until it
        returns (`bridge.reconcilers.backend_clients.BackendCache.holding`): none is closed
        under it.

        Raises
        ------
        ValueError
            For a key of no known kind (a bug).
        """
        with self.backends.holding():
            return self._route(key)

    def _route(self, key: Hashable) -> Result:
        """Run the reconciler of ``key`` under its log context (`reconcile`)."""
        match key:
            case ClaimKey(namespace, name):
                api_version = f"{GROUP}/{self.versions.address}"
                with logcontext.about(api_version, "IPAddressClaim", namespace, name):
                    return reconcile_claim(self.claims, namespace, name)
            case PoolKey(namespace, kind, name):
                with logcontext.about(f"{GROUP}/v1alpha1", kind, namespace, name):
                    return reconcile_pool(self.pools, namespace, kind, name)
            case ClusterKey(namespace, name):
                api_version = f"{CLUSTER_GROUP}/{self.versions.cluster}"
                with logcontext.about(api_version, "Cluster", namespace, name):
                    return reconcile_cluster(self.clusters, namespace, name)
        raise ValueError(f"unknown work-queue key {key!r}")

    def _room(self, token: Hashable) -> int:
        """Return the free places under a wake token (an IPAM server's; 0 for any other)."""
        return self.flow.room(token.endpoint) if isinstance(token, EndpointToken) else 0

    def sizes(self) -> dict[str, int]:
        """Return the sizes of the in-memory structures that grow with objects, by name.

        For the soak benchmark (``python -m benchmarks --only soak``): the cache's parts
        (objects) and expectations, the work queue's (`OperatorQueue.sizes`), the backend cache's
        (`BackendCache.sizes`), namespace locks, the flow control's
        (`backends.flowcontrol.FlowControl.sizes`), the woken-for-a-place claims and
        the pools held off as exhausted (`bridge.runtime.waits`), notices and the claims counted as
        pending by the metrics.
        """
        sizes = self.cache.sizes()
        sizes |= {f"queue.{k}": v for k, v in self.queue.sizes().items()}
        sizes |= {f"backends.{k}": v for k, v in self.backends.sizes().items()}
        sizes |= {f"flow.{k}": v for k, v in self.flow.sizes().items()}
        sizes |= {f"places.{k}": v for k, v in self.places.sizes().items()}
        sizes["exhausted"] = len(self.exhausted)
        sizes["namespace_locks"] = len(self.locks)
        sizes["notices"] = len(self.notices)
        sizes["metrics.pending"] = len(self.metrics.pending_claims())
        return sizes

    def close(self) -> None:
        """Post the queued Events; close backends, metrics endpoint, Kubernetes connections."""
        self.events.close()
        self.backends.close()
        self.metrics.close()
        self.kube.close()
