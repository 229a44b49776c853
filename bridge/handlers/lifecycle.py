"""Start-up, clean-up, login and probe handlers: the `bridge.operator.Operator`, kopf's settings."""

from __future__ import annotations

import asyncio
import datetime
import gc
import logging
import time
from collections.abc import Iterable
from typing import Any

import kopf
from kubernetes.client import ApiException

from bridge.capi import CLUSTER_GROUP, GROUP, SUPPORTED_VERSIONS
from bridge.cluster_id import ClusterIdError, resolve_cluster_id
from bridge.handlers.claims import AddressEvents, ClaimEvents, ClusterEvents
from bridge.handlers.pools import PoolEvents
from bridge.handlers.resync import purge_forever, resync_forever
from bridge.metrics import Metrics, PortUnavailableError
from bridge.objects.cache import PARTS, Cache, informers
from bridge.objects.client import ObjectClient
from bridge.operator import Operator
from bridge.reconcilers.audit import audit_forever
from bridge.reconcilers.context import ServedVersions
from bridge.runtime.events import POSTING_THREADS
from bridge.runtime.fence import Fence
from bridge.runtime.gateway import NotServedError, access_denied, api_client
from bridge.runtime.informer import Informer
from bridge.runtime.kubeconfig import kopf_connection_info
from bridge.runtime.leader import (
    LEASE_NAME,
    STOP_DRAIN_SECONDS,
    STOP_JOIN_SECONDS,
    ElectionLock,
    Leadership,
    OperatorStop,
    Timings,
    election_client,
    holder_identity,
    lease_fence,
    lease_namespace,
    stop_tasks,
)
from bridge.runtime.workqueue import WorkQueue
from bridge.settings import Settings

__all__ = [
    "cleanup",
    "configure",
    "election_lock",
    "login",
    "probe",
    "serve_metrics",
    "start_informers",
    "start_work",
    "startup",
]

log = logging.getLogger(__name__)

#: kopf's own bookkeeping names: private to ipam-bridge, never a contract name. kopf has no
#: resource handler here, so it writes none of them on claims or pools; they are set so
#: that nothing kopf might ever write collides with another controller's names (were it the
#: contract's ``ReleaseAddress``, kopf would strip it from other providers' claims).
KOPF_FINALIZER = "ipam-bridge.io/kopf-finalizer"
KOPF_ANNOTATION_PREFIX = "kopf.ipam-bridge.io"


def configure(settings: kopf.OperatorSettings, bridge: Settings) -> None:
    """Apply our settings to kopf's ``OperatorSettings`` (in place).

    Parameters
    ----------
    settings:
        kopf's settings of the running operator (the start-up handler's ``settings``).
    bridge:
        Our settings (``IPAM_BRIDGE_*``).
    """
    settings.persistence.finalizer = KOPF_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=KOPF_ANNOTATION_PREFIX
    )
    # kopf watches no resource (no resource handler): every watch is an informer's
    # (`bridge.runtime.informer`), and kopf needs no scan of CRDs or namespaces either.
    settings.scanning.disabled = True
    settings.execution.max_workers = 2
    # kopf turns no log line into an Event; we post our own.
    settings.posting.level = logging.INFO


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo | None:
    """Log kopf in exactly as the kubernetes client connects (`kubeconfig.kopf_connection_info`).

    Service account in a pod, else the kubeconfig (certificates, tokens, exec plugins): the
    kubernetes package resolves it, kopf gets the result.
    """
    return kopf_connection_info()


def start_work(op: Operator, queue: WorkQueue) -> list[asyncio.Task[None]]:
    """Start the work of the replica that handles objects: queue, resync, purge, drift audit.

    The queue accepts keys from now on (`WorkQueue.lead`); the resync task first queues
    what the stores hold (`bridge.handlers.resync.replay`). They run as tasks on kopf's
    loop until cancelled (the clean-up, or a lost leadership).
    """
    queue.lead()
    return [
        asyncio.create_task(queue.run(), name="ipam-bridge work queue"),
        asyncio.create_task(resync_forever(op), name="ipam-bridge resync"),
        asyncio.create_task(purge_forever(op), name="ipam-bridge quarantine purge"),
        # Its own thread, not the work queue's workers (IPAM_BRIDGE_AUDIT_SECONDS; 0 = off).
        asyncio.create_task(audit_forever(op.audit), name="ipam-bridge drift audit"),
    ]


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Read settings, connect, detect the served CAPI versions, start the work queue.

    Serves ``/metrics`` first (`serve_metrics`), then starts the informers
    (`start_informers`) and puts the `bridge.operator.Operator` in ``memo.bridge``. The work
    queue and the periodic tasks (`start_work`) run on kopf's loop until the clean-up; with
    ``IPAM_BRIDGE_LEADER_ELECTION``, only once this replica wins the leader Lease
    (`bridge.runtime.leader.Leadership`, in ``memo.leadership``): until then the informers
    fill their stores and queue nothing, and losing it stops the operator through
    ``memo.operator_stop`` (`bridge.runtime.leader.OperatorStop`): the process exits 1.
    Every Kubernetes and IPAM write checks the replica's `bridge.runtime.fence.Fence` first.

    The management cluster's identity (``IPAM_BRIDGE_CLUSTER_ID``, else the uid of namespace
    ``kube-system``: `bridge.cluster_id.resolve_cluster_id`) is resolved once, before
    anything is handled, into the settings every reconciler reads (``settings.cluster_id``).

    Raises
    ------
    kopf.PermanentError
        When the CAPI IPAM CRDs are not served, when the API server refuses the operator's
        identity (401/403: its message is shown), when the cluster identity cannot be read
        (the message names ``IPAM_BRIDGE_CLUSTER_ID``), or when the metrics port cannot be
        bound (the operator stops with that message and a non-zero exit code).
    kopf.TemporaryError
        When the API server did not answer the read of the cluster identity (tried again).
    """
    bridge = Settings()
    configure(settings, bridge)
    metrics = serve_metrics(memo, bridge)
    # Loading the kubeconfig may run an exec plugin: never on the event loop.
    lock = await asyncio.to_thread(election_lock, bridge) if bridge.leader_election else None
    fence = Fence.open() if lock is None else lease_fence(lock)
    cache = Cache()
    # One kept connection per thread calling the API at once (the workers, 7 watches per
    # watched namespace, the Event posters): with fewer, urllib3 opens new ones (TLS each).
    connections = bridge.workers + 7 * max(1, len(bridge.namespaces)) + POSTING_THREADS
    kube = ObjectClient(
        await asyncio.to_thread(
            api_client,
            pool_size=connections,
            timeout=bridge.kube_timeout,
            fence=fence.check,
            write_timeout=fence.bound,
        ),
        expectations=cache.expectations,
    )
    versions = await _served_versions(kube, bridge)
    bridge = bridge.model_copy(update={"cluster_id": await _cluster_id(kube, bridge)})
    queue = WorkQueue(
        lambda key: op.reconcile(key),  # op is made next, before the queue runs
        workers=bridge.workers,
        error_delay=bridge.error_backoff_seconds,
        max_error_delay=bridge.error_backoff_max_seconds,
        standby=True,  # nothing queued before `start_work`: a standby keeps no key
    )
    op = Operator(
        settings=bridge,
        kube=kube,
        versions=versions,
        queue=queue,
        background_events=True,
        cache=cache,
        flow=bridge.flow_control(fence=fence.check),
        fence=fence,
        metrics=metrics,
    )
    memo.informers = await start_informers(op)
    memo.bridge = op
    if lock is None:
        op.metrics.leader.set(1)
        memo.tasks = start_work(op, queue)
        return
    stop: OperatorStop | None = memo.get("operator_stop")
    memo.leadership = Leadership(
        lock,
        start_work=lambda: start_work(op, queue),
        metrics=op.metrics,
        stop_operator=stop,
        arm_exit=None if stop is None else stop.arm,
        fence=fence,
        kube=op.kube,
        drained=op.events.close,
    )
    memo.leadership.start()


def serve_metrics(memo: kopf.Memo, bridge: Settings) -> Metrics:
    """Return the operator's metrics, served on ``IPAM_BRIDGE_METRICS_PORT`` unless it is 0.

    Served first, before any API request: a replica shows ``ipam_bridge_leader 0`` from its
    start, while it lists or stands by (the alert and the dashboard count the leaders from
    it). Kept in ``memo.metrics``, so that a start-up handler tried again serves them once.

    Raises
    ------
    kopf.PermanentError
        When the port cannot be bound (its message names the address, port and setting).
    """
    metrics: Metrics | None = memo.get("metrics")
    if metrics is not None:
        return metrics
    metrics = Metrics()
    if bridge.metrics_port:
        try:
            port = metrics.serve(bridge.metrics_port, bridge.metrics_address)
        except PortUnavailableError as exc:
            raise kopf.PermanentError(str(exc)) from exc
        log.info("serving metrics on :%d/metrics", port)
    memo.metrics = metrics
    return metrics


async def start_informers(op: Operator) -> list[Informer]:
    """Start the informers of every part of the cache, claims last; return them.

    The first lists of IPAddresses, pools and Clusters are tried before the claims'
    informers start (a claim's first reconcile reads them from the cache); a first list
    that failed is tried again in the background (`bridge.runtime.informer.Informer`).
    Their sinks are `bridge.handlers.claims` and `bridge.handlers.pools`; their idle seconds
    are exported (`bridge.metrics.Metrics.watched`). What start-up made is then frozen
    (`gc.freeze`).
    """
    made = informers(
        op.cache,
        op.kube,
        version=op.versions.address,
        cluster_version=op.versions.cluster,
        namespaces=op.settings.namespaces,
        sinks={
            "addresses": AddressEvents(op),
            "pools": PoolEvents(op),
            "clusters": ClusterEvents(op),
            "claims": ClaimEvents(op),
        },
        stall=op.settings.watch_stall_seconds,
    )
    started: list[Informer] = []
    for stage in ([i for part in PARTS[:-1] for i in made[part]], made["claims"]):
        for informer in stage:
            resource, _, namespace = informer.name.partition(" in ")
            op.metrics.watched(resource, namespace, informer.quiet)
            informer.start()
        started += stage
        for informer in stage:
            await asyncio.to_thread(informer.wait_tried)
    # What start-up made (modules, clients, the first lists) lives as long as the process:
    # out of the collector's generations, a full collection no longer walks it (about 0.2 ms
    # of CPU per claim; https://docs.python.org/3/library/gc.html#gc.freeze).
    gc.freeze()
    return started


async def _served_versions(kube: ObjectClient, bridge: Settings) -> ServedVersions:
    """Detect the served IPAddress and Cluster versions; check that claims may be listed.

    IPAddressClaim/IPAddress are required; Cluster is v1beta2 on CAPI >= 1.11, else v1beta1,
    and None when not served (control-plane endpoints are then off).

    Raises
    ------
    kopf.PermanentError
        When the CAPI IPAM CRDs are not served, or the API server refuses the operator.
    """
    try:
        version = await asyncio.to_thread(
            kube.preferred_version, GROUP, "ipaddresses", SUPPORTED_VERSIONS
        )
        # Discovery is open to every identity; listing claims is not: a refused identity
        # stops here, with the API server's message, instead of kopf retrying its watches.
        await asyncio.to_thread(kube.list_claims, version, bridge.namespaces, limit=1)
    except NotServedError as exc:
        raise kopf.PermanentError(str(exc)) from exc
    except ApiException as exc:
        if (denied := access_denied(exc)) is not None:
            raise kopf.PermanentError(f"the API server refused: {denied}") from exc
        raise
    log.info("serving CAPI IPAM %s (IPAddressClaim/IPAddress)", version)
    try:
        cluster_version: str | None = await asyncio.to_thread(
            kube.preferred_version, CLUSTER_GROUP, "clusters", SUPPORTED_VERSIONS
        )
        log.info("CAPI Cluster %s: control-plane endpoints on", cluster_version)
    except NotServedError:
        cluster_version = None
        log.warning("CAPI Clusters are not served: control-plane endpoints off")
    return ServedVersions(version, cluster_version)


async def _cluster_id(kube: ObjectClient, bridge: Settings) -> str:
    """Resolve this management cluster's identity (`bridge.cluster_id.resolve_cluster_id`).

    Raises
    ------
    kopf.PermanentError
        When it cannot be read (refused, namespace missing): the operator stops, its last
        line naming ``IPAM_BRIDGE_CLUSTER_ID`` and the fix.
    kopf.TemporaryError
        When the API server did not answer (5xx, 429): kopf runs the start-up again in 5 s.
    """
    try:
        cluster_id = await asyncio.to_thread(resolve_cluster_id, bridge, kube.core)
    except ClusterIdError as exc:
        if exc.transient:
            raise kopf.TemporaryError(str(exc), delay=5) from exc
        raise kopf.PermanentError(str(exc)) from exc
    source = "IPAM_BRIDGE_CLUSTER_ID" if bridge.cluster_id.strip() else "uid of kube-system"
    log.info(
        "management cluster identity %s (%s): the owner of its IPAM entries", cluster_id, source
    )
    return cluster_id


def election_lock(bridge: Settings) -> ElectionLock:
    """Return this replica's candidate for the Lease (a new holder identity); blocking.

    Loads the client configuration (files, a kubeconfig's exec plugin).
    """
    return ElectionLock(
        LEASE_NAME,
        lease_namespace(bridge),
        holder_identity(),
        client=election_client(),
        timings=Timings.of(bridge),
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the work (in-flight reconciles finish), its threads, the informers; close.

    With leader election (`bridge.runtime.leader.Leadership.close`): the work ends within
    `STOP_DRAIN_SECONDS`, then the fence is revoked, what still runs is waited for
    `STOP_JOIN_SECONDS` more, and the Lease is given up (unless it was lost). Without it,
    the work is waited for as long, the fence open.
    """
    leadership: Leadership | None = memo.get("leadership")
    if leadership is not None:
        await leadership.close()
    tasks = list(memo.get("tasks") or [])
    for task in tasks:
        task.cancel()
    if await stop_tasks(tasks, STOP_DRAIN_SECONDS + STOP_JOIN_SECONDS):
        log.warning(
            "the work did not end within %g s of the stop", STOP_DRAIN_SECONDS + STOP_JOIN_SECONDS
        )
    for informer in memo.get("informers") or []:
        await asyncio.to_thread(informer.stop)
    op = memo.get("bridge")
    if op is not None:
        await asyncio.to_thread(op.close)
    elif (metrics := memo.get("metrics")) is not None:  # start-up did not finish
        await asyncio.to_thread(metrics.close)


@kopf.on.probe(id="bridge")
def probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Report cheap facts for kopf's liveness endpoint; never calls a backend or the API.

    kopf serves the result as ``{"bridge": {...}}`` on the ``--liveness`` endpoint
    (``IPAM_BRIDGE_HEALTH_PORT``) and caches it for 10 seconds (kopf's health reporter). A
    backend that is down must not make Kubernetes restart the pod, so only in-memory state
    is read.

    Parameters
    ----------
    memo:
        kopf's operator memo; ``memo.bridge`` is the `bridge.operator.Operator` once
        start-up is done.

    Returns
    -------
    dict
        ``started`` (bool: start-up done), and once started: ``capiVersion`` (the served
        IPAddress version), ``pools`` (pools whose usage is known), ``backends`` (backend
        clients cached), ``claimsPending`` (claims waiting for an address),
        ``lastBackendSuccess`` (ISO 8601 UTC time of the last successful backend
        operation, or None), ``secondsSinceBackendSuccess`` (float seconds, or None) and
        ``queueStalledSeconds`` (`bridge.runtime.workqueue.WorkQueue.stalled`) and
        ``watchIdleSeconds`` (the longest `bridge.runtime.informer.Informer.quiet` of the
        informers in ``memo.informers``).

    Raises
    ------
    RuntimeError
        When due keys have waited more than ``IPAM_BRIDGE_STALL_SECONDS`` with no reconcile
        started or finished, or when a watch had no event, bookmark or list for twice
        ``IPAM_BRIDGE_WATCH_STALL_SECONDS`` (dead, and not even a list gets through): kopf
        then answers the liveness probe with HTTP 500 and the kubelet restarts the pod.
    """
    op: Operator | None = memo.get("bridge")
    if op is None:
        return {"started": False}
    idle = _dead_watches(memo.get("informers") or [], 2 * op.settings.watch_stall_seconds)
    stalled = op.queue.stalled()
    limit = op.settings.stall_seconds
    if limit and stalled > limit:
        raise RuntimeError(
            f"the work queue made no progress for {stalled:.0f}s while keys are due"
            " (hung workers or a blocked event loop)"
        )
    last = op.metrics.last_success
    return {
        "started": True,
        "capiVersion": op.versions.address,
        "pools": len(op.metrics.pools()),
        "backends": len(op.backends),
        "claimsPending": len(op.metrics.pending_claims()),
        "lastBackendSuccess": None
        if last is None
        else datetime.datetime.fromtimestamp(last, datetime.UTC).isoformat(),
        "secondsSinceBackendSuccess": None if last is None else round(time.time() - last, 3),
        "queueStalledSeconds": round(stalled, 3),
        "watchIdleSeconds": round(idle, 3),
    }


def _dead_watches(informers: Iterable[Informer], limit: float) -> float:
    """Return the longest idle seconds of ``informers`` (0.0 for none).

    Raises
    ------
    RuntimeError
        When one was idle (no event, bookmark or list) for more than ``limit`` seconds.
    """
    quiet = {informer.name: informer.quiet() for informer in informers}
    dead = sorted(name for name, seconds in quiet.items() if seconds > limit)
    if dead:
        raise RuntimeError(
            f"no event, bookmark or list for more than {limit:.0f}s on the watch of"
            f" {', '.join(dead)} (the API server does not answer)"
        )
    return max(quiet.values(), default=0.0)
