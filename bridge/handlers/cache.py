"""Feed the operator's cache (`bridge.objects.cache`) from the watches kopf runs.

kopf watches pools and Clusters. `cache_event` puts every one kopf sees (its initial
listing, additions, changes) into the cache and drops deleted ones: the first step of the
handlers of pools (`bridge.handlers.pools.pool_event`) and Clusters
(`bridge.handlers.claims.cluster_event`), so a reconcile they queue reads the cache as the
event shows it. A listing after a watch restart relists their part of the cache
(`Relists`). The cache's initial list comes from the start-up handler
(`bridge.objects.cache.prime`). Claims and our IPAddresses are watched by informers of
their own (`bridge.runtime.informer`, `bridge.handlers.claims.ClaimEvents`), which list
again on every watch restart themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Final, cast

import kopf

from bridge import capi
from bridge.objects.cache import Cache, Part, relist
from bridge.objects.keys import claim_key, cluster_key, cluster_token, pool_key, pool_token
from bridge.operator import Operator
from bridge.reconcilers import control_plane as endpoints
from bridge.runtime.cache import ObjectCache, Relisted

__all__ = ["KOPF_PARTS", "Relists", "cache_event", "queue_relisted"]

log = logging.getLogger(__name__)

#: A listing event this many seconds after the previous one of its resource, or after a
#: watch event of it, starts a new listing (kopf lists again when a watch restarts).
LISTING_GAP_SECONDS: Final = 5.0
#: Seconds between attempts of a relist that failed (the API server still unreachable).
RETRY_SECONDS: Final = 2.0
#: The parts of the cache fed by kopf's watches (claims and IPAddresses: by informers).
KOPF_PARTS: Final[tuple[Part, ...]] = ("pools", "clusters")


async def cache_event(
    type: str | None, body: kopf.Body, resource: kopf.Resource, memo: kopf.Memo, **_: Any
) -> None:
    """Put a pool or Cluster as seen into the cache; drop it when deleted.

    The handlers of pools and Clusters (`bridge.handlers.pools.pool_event`,
    `bridge.handlers.claims.cluster_event`) call it first, so what they queue or wake reads
    the cache as the event shows it.
    """
    op: Operator | None = memo.get("bridge")
    if op is None:
        return
    key: Hashable = op.cache.key_of(body)
    _relists(op).seen(resource.plural, type)
    part: ObjectCache
    if resource.plural == "clusters":
        part = op.cache.clusters
        if type != "DELETED":
            _relists(op).unpaused(part.get(key), body)
    else:
        part, key = op.cache.pools, op.cache.pool_key_of(body)
    part.apply(key, body, deleted=type == "DELETED")


class Relists:
    """Tell kopf's listings after a watch restart from its first, and relist the cache then.

    kopf lists a resource when its watch starts and again whenever the watch must restart
    from scratch (410 Gone, a failed resume), delivering the listed objects as events of
    type None (``kopf/_cogs/clients/watching.py``, ``continuous_watch``), but it never
    tells of objects that went away meanwhile. A listing of pools or Clusters that is not
    its first makes both parts suspect (lookups read the API meanwhile), then relists them
    (`bridge.objects.cache.relist`) and queues what changed (`queue_relisted`). Claims and
    IPAddresses relist on their own (their informers), except when a Cluster turns
    unpaused (`unpaused`).

    Parameters
    ----------
    op:
        The operator (its cache, its Kubernetes client, its queue).
    clock:
        Monotonic seconds.
    """

    def __init__(self, op: Operator, clock: Callable[[], float] = time.monotonic) -> None:
        self._op = op
        self._clock = clock
        self._listing: dict[str, float] = {}  # resource -> when its last listing event came
        self._watched: set[str] = set()  # resources with a watch event since their listing
        self._task: asyncio.Task[None] | None = None
        self._pending: list[Part] = []  # parts to relist, in order

    def seen(self, resource: str, type: str | None) -> None:
        """Record one event of ``resource`` (``type`` None: a listing); relist on a new listing."""
        if type is not None:
            self._watched.add(resource)
            return
        now = self._clock()
        last = self._listing.get(resource)
        self._listing[resource] = now
        fresh = resource in self._watched or (last is not None and now - last > LISTING_GAP_SECONDS)
        self._watched.discard(resource)
        if last is None or not fresh:
            return  # the first listing (primed at start-up), or the same listing going on
        log.info("%s listed again by its watch: relisting the cache", resource)
        self.request(KOPF_PARTS)

    def unpaused(self, before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> None:
        """Relist claims when a Cluster turns unpaused (``before``: as cached, None: new).

        Its claims, parked maybe for hours, are woken by this event; the claims' watch is
        another stream, which may lag behind this one (it reconnects on its own after an
        outage): until the claims are relisted, the woken claims read themselves from the
        API, so none is allocated from a stale entry of a claim deleted meanwhile.
        """
        was = before is not None and capi.is_paused(
            (before.get("metadata") or {}).get("annotations"), before.get("spec")
        )
        now = capi.is_paused((after.get("metadata") or {}).get("annotations"), after.get("spec"))
        if was and not now:
            self.request(("claims",))

    def request(self, parts: tuple[Part, ...]) -> None:
        """Make ``parts`` suspect at once and relist them (in the background, retried)."""
        for part in parts:
            self._op.cache.part(part).suspect()
            if part not in self._pending:
                self._pending.append(part)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._relist_all(), name="ipam-bridge relist")

    async def _relist_all(self) -> None:
        op = self._op
        pending = self._pending
        while pending:
            part = pending[0]
            try:
                result = await asyncio.to_thread(
                    relist,
                    op.cache,
                    op.kube,
                    part,
                    version=op.versions.address,
                    namespaces=op.settings.namespaces,
                )
            except Exception as exc:  # the API server still unreachable: try again
                log.warning("relist of %s failed (%s): trying again", part, type(exc).__name__)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            pending.pop(0)
            if result is not None:
                count = queue_relisted(op, part, result)
                log.info(
                    "%s relisted: %d gone, %d changed, %d queued",
                    part,
                    len(result.gone),
                    len(result.changed),
                    count,
                )


_RELISTS: weakref.WeakKeyDictionary[Cache, Relists] = weakref.WeakKeyDictionary()


def _relists(op: Operator) -> Relists:
    found = _RELISTS.get(op.cache)
    if found is None:
        found = _RELISTS[op.cache] = Relists(op)
    return found


def _meta(body: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or ""), meta


def queue_relisted(op: Operator, part: Part, result: Relisted) -> int:
    """Queue the keys a relist found gone or changed; return how many were queued or woken.

    Claims: the claim. IPAddresses: the claim of ``spec.claimRef``. Pools: the pool, and
    its waiting claims are woken. Clusters: the claims waiting on it are woken when it is
    gone or not paused, and the Cluster is queued when it asks for a control-plane
    endpoint (as `bridge.handlers.claims.cluster_event`).
    """
    count = 0
    for gone, (key, body) in [(True, item) for item in result.gone] + [
        (False, item) for item in result.changed
    ]:
        namespace, name, meta = _meta(body)
        if part == "claims":
            op.queue.add(claim_key(namespace, name))
        elif part == "addresses":
            ref = (body.get("spec") or {}).get("claimRef") or {}
            op.queue.add(claim_key(namespace, str(ref.get("name") or name)))
        elif part == "pools":
            kind = str(cast(tuple[str, ...], key)[0])
            pool_namespace = capi.pool_namespace(kind, namespace)
            op.queue.add(pool_key(pool_namespace, kind, name))
            op.queue.wake(pool_token(pool_namespace, kind, name))
        else:
            if gone or not capi.is_paused(meta.get("annotations"), body.get("spec")):
                op.queue.wake(cluster_token(namespace, name))
            if endpoints.wants_endpoint(meta.get("annotations")):
                op.queue.add(cluster_key(namespace, name))
        count += 1
    return count
