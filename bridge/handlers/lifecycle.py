"""Start-up, clean-up, login and probe handlers: the operator context and kopf's settings."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import Any

import kopf

from bridge.capi import GROUP, SUPPORTED_VERSIONS
from bridge.context import Context, ExhaustionGate
from bridge.handlers.pools import refresh_pools_forever
from bridge.kube import Kube, NotServedError, api_client, in_cluster, load_configuration
from bridge.settings import Settings

__all__ = ["cleanup", "configure", "login", "probe", "startup"]

log = logging.getLogger(__name__)

#: Prefix of kopf's bookkeeping annotations on the objects it handles. Claims are CAPI's
#: objects whose status schema would prune kopf's usual ``status.kopf``, so progress and
#: the last handled state live in annotations.
ANNOTATION_PREFIX = "ipam-bridge.ipam.cluster.x-k8s.io"


def configure(settings: kopf.OperatorSettings, bridge: Settings) -> None:
    """Apply our settings to kopf's ``OperatorSettings`` (in place).

    Parameters
    ----------
    settings:
        kopf's settings of the running operator (the start-up handler's ``settings``).
    bridge:
        Our settings (``IPAM_BRIDGE_*``): worker count.
    """
    from bridge.capi import CLAIM_FINALIZER

    # kopf's own finalizer is the contract's claim finalizer: kopf adds it before the
    # create handler runs and removes it only after the delete handler succeeded.
    settings.persistence.finalizer = CLAIM_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    # One ClusterKopfPeering (shipped in deploy/) serves both cluster-wide and
    # namespace-scoped runs; with namespaced peering kopf would wait for a KopfPeering
    # object in every watched namespace.
    settings.peering.clusterwide = True
    # Sync handlers run in this many threads: claims of different objects in parallel.
    settings.execution.max_workers = bridge.workers
    # kopf no longer turns log lines into Events; we post our own (kopf.info/warn).
    settings.posting.level = logging.INFO
    # Reconnect quickly after an API server hiccup.
    settings.watching.reconnect_backoff = 1.0
    settings.networking.error_backoffs = [1, 2, 5, 10]
    # Retries of a failing handler are paced by the delays our handlers give.
    settings.queueing.error_delays = [1, 2, 5, 10, 30]


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Log kopf in like `bridge.kube` does: service account in a pod, else the kubeconfig.

    The kubernetes package resolves exec plugins and tokens; kopf gets the result.
    """
    if in_cluster():
        return kopf.login_with_service_account(**kwargs)
    configuration = load_configuration()
    token = None
    auth = (configuration.api_key or {}).get("authorization") or ""
    if auth:
        token = auth.removeprefix("Bearer ").strip()
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme="Bearer" if token else None,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        default_namespace=None,
    )


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Read settings, connect, detect the served CAPI version, start the pool refresher.

    Also serves ``/metrics`` (prometheus-client) on ``IPAM_BRIDGE_METRICS_PORT`` unless it
    is 0; the `Context` (with its own metrics registry) goes to ``memo.bridge``.

    Raises
    ------
    kopf.PermanentError
        When the CAPI IPAM CRDs are not served (the operator stops with that message).
    OSError
        When the metrics port cannot be bound.
    """
    bridge = Settings()
    configure(settings, bridge)
    kube = Kube(api_client(pool_size=bridge.workers))
    try:
        version = await asyncio.to_thread(
            kube.preferred_version, GROUP, "ipaddresses", SUPPORTED_VERSIONS
        )
    except NotServedError as exc:
        raise kopf.PermanentError(str(exc)) from exc
    log.info("serving CAPI IPAM %s (IPAddressClaim/IPAddress)", version)
    ctx = Context(
        settings=bridge,
        kube=kube,
        address_version=version,
        gate=ExhaustionGate(bridge.requeue_exhausted_seconds),
    )
    if bridge.metrics_port:
        port = ctx.metrics.serve(bridge.metrics_port, bridge.metrics_address)
        log.info("serving metrics on :%d/metrics", port)
    memo.bridge = ctx
    memo.refresher = asyncio.create_task(refresh_pools_forever(ctx))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the pool refresher and close backends and connections."""
    refresher = memo.get("refresher")
    if refresher is not None:
        refresher.cancel()
        await asyncio.gather(refresher, return_exceptions=True)
    ctx = memo.get("bridge")
    if ctx is not None:
        await asyncio.to_thread(ctx.close)


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
        kopf's operator memo; ``memo.bridge`` is the `Context` once start-up is done.

    Returns
    -------
    dict
        ``started`` (bool: start-up done), and once started: ``capiVersion`` (the served
        IPAddress version), ``pools`` (pools whose usage is known), ``backends`` (backend
        clients cached), ``claimsPending`` (claims waiting for an address),
        ``lastBackendSuccess`` (ISO 8601 UTC time of the last successful backend
        operation, or None) and ``secondsSinceBackendSuccess`` (float seconds, or None).
    """
    ctx: Context | None = memo.get("bridge")
    if ctx is None:
        return {"started": False}
    last = ctx.metrics.last_success
    return {
        "started": True,
        "capiVersion": ctx.address_version,
        "pools": len(ctx.metrics.pools()),
        "backends": len(ctx.backends),
        "claimsPending": len(ctx.metrics.pending_claims()),
        "lastBackendSuccess": None
        if last is None
        else datetime.datetime.fromtimestamp(last, datetime.UTC).isoformat(),
        "secondsSinceBackendSuccess": None if last is None else round(time.time() - last, 3),
    }
