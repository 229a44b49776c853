"""The leader's drift audit: survey each pool, repair what it may, report the rest.

`Auditor` audits every Ready pool (`bridge.reconcilers.audit.survey.survey`), registers
missing entries again at their address when it is free, posts Events for new findings, sets
the metric ``ipam_bridge_drift{pool,kind,finding}`` and writes the pool's ``InSync``
condition. `audit_forever` runs it every ``IPAM_BRIDGE_AUDIT_SECONDS`` in a thread of its
own, never in the claim work queue's worker slots. A backend error during an audit is
logged and retried at the next round, never a finding.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from kubernetes.client import ApiException

from backends.base import Allocation, EntryOwner, IPAMBackend, may_adopt
from backends.errors import AddressUnavailableError, BackendError, EntryOwnedError
from bridge import capi
from bridge.capi import Claim, Reason
from bridge.metrics import Metrics
from bridge.models import Condition, IPPool, wire
from bridge.reconcilers.audit.compare import (
    Finding,
    FindingKind,
    counts,
    normal_address,
    owner_summary,
)
from bridge.reconcilers.audit.survey import (
    CachedObjects,
    PoolBackends,
    Survey,
    SurveyApi,
    SurveyCache,
    SurveyDeps,
    survey,
)
from bridge.reconcilers.context import ServedVersions
from bridge.reconcilers.errors import PoolError
from bridge.reconcilers.pool_backends import BACKEND_NAMES, Pool, parse_pool
from bridge.runtime.events import EventSink
from bridge.runtime.gateway import Outcome, Write

__all__ = [
    "IN_SYNC",
    "AuditApi",
    "AuditDeps",
    "Auditor",
    "PoolAudit",
    "audit_forever",
    "in_sync_condition",
]

log = logging.getLogger(__name__)

#: The pool condition type the audit writes.
IN_SYNC = "InSync"

#: How often the ``InSync`` write is tried against concurrent status writes (409).
_CONDITION_ATTEMPTS = 5

#: What `Auditor._restore` did with a missing entry: registered it again.
_RESTORED: Literal["restored"] = "restored"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _metric_pool(pool: Pool) -> str:
    """Return the ``pool`` label of the metrics: ``<namespace>/<name>`` as elsewhere."""
    return f"{pool.namespace}/{pool.name}"


def in_sync_condition(
    findings: Sequence[Finding],
    *,
    observed_generation: int | None = None,
    previous: Sequence[Mapping[str, Any]] = (),
    now: str | None = None,
    owners: Mapping[str, int] | None = None,
    cluster_id: str = "",
) -> dict[str, Any]:
    """Return the pool's metav1 ``InSync`` condition after an audit.

    True (reason ``NoDrift``) without findings, else False (reason ``DriftFound``) with the
    count of each finding in the message. When the pool's subnets hold entries of other
    owners (``owners``, `bridge.reconcilers.audit.compare.owner_counts`: another management
    cluster's, or the previous release's), the message ends with the count per owner
    (`bridge.reconcilers.audit.compare.owner_summary`); another cluster's entries are never
    findings here. ``lastTransitionTime`` (``now``, else the current UTC time) is kept from
    ``previous`` while the status stays the same. Restored entries are not mentioned (their
    Events and ``ipam_bridge_drift_restored_total`` tell them): the condition changes only
    with the drift and the other owners' counts.
    """
    if findings:
        n = counts(findings)
        message = (
            f"{n[FindingKind.MISSING]} missing, {n[FindingKind.CONFLICT]} conflict, "
            f"{n[FindingKind.ORPHAN]} orphan: see the Events of the pool and its claims, or "
            "run `ipam-bridge audit`"
        )
        reason = Reason.DRIFT_FOUND
    else:
        message = "the pool's IPAddresses match its IPAM entries"
        reason = Reason.NO_DRIFT
    if owners and any(count for owner, count in owners.items() if owner != cluster_id):
        message += f"; {owner_summary(dict(owners), cluster_id)}"
    status = "False" if findings else "True"
    transition = now or _now()
    for old in previous:
        if old.get("type") == IN_SYNC and old.get("status") == status:
            transition = str(old.get("lastTransitionTime") or transition)
    condition: dict[str, Any] = {
        "type": IN_SYNC,
        "status": status,
        "reason": str(reason),
        "message": message,
        "lastTransitionTime": transition,
    }
    if observed_generation is not None:
        condition["observedGeneration"] = observed_generation
    return condition


class AuditApi(SurveyApi, Protocol):
    """The Kubernetes reads and writes of the leader's audit (`bridge.objects.client`).

    The survey's lists (`SurveyApi`), the pools, the re-reads before a repair, and the
    pool's ``InSync`` condition write.
    """

    def list_pools(self, kind: str, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Return the pools of ``kind`` in ``namespaces`` (empty: all namespaces)."""

    def get_pool(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """Return a pool, or None."""

    def get_claim(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a claim, or None."""

    def get_ip_address(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return an IPAddress, or None."""

    def get_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a CAPI Cluster, or None."""

    def patch_pool_conditions(self, pool: IPPool, conditions: Sequence[Condition]) -> Write:
        """Write a pool's ``status.conditions`` whole, guarded by the resourceVersion read.

        Answers `Outcome.CONFLICT` when the pool changed since it was read.
        """


@dataclass
class AuditDeps:
    """What the leader's audit uses (`Auditor`, `audit_forever`).

    Attributes
    ----------
    kube:
        The Kubernetes reads and writes (pools, claims, IPAddresses, Clusters; ``InSync``).
    clients:
        The pools' IPAM clients.
    events:
        Where Events about claims and pools are told.
    metrics:
        The Prometheus metrics (``ipam_bridge_drift``, ``ipam_bridge_drift_restored_total``,
        the IPAM calls).
    versions:
        The served CAPI versions (``versions.address``: the claims' and IPAddresses').
    namespaces:
        The namespaces the operator works in (``IPAM_BRIDGE_NAMESPACE``; empty: all).
    interval:
        Seconds between two rounds of `audit_forever` (``IPAM_BRIDGE_AUDIT_SECONDS``; 0: off).
    holding:
        Makes a block hold the IPAM clients it takes, so that none is closed under a round
        (`bridge.reconcilers.backend_clients.BackendCache.holding`).
    cache:
        The operator's informer cache (`bridge.objects.cache.Cache`): the surveys read the
        claims and IPAddresses there while it is synced (`SurveyDeps.cache`); None: they
        list the API.
    cluster_id:
        This management cluster's identity (`bridge.cluster_id.resolve_cluster_id`): the
        owner a repair writes; other clusters' entries are counted, never judged.
    """

    kube: AuditApi
    clients: PoolBackends
    events: EventSink
    metrics: Metrics
    versions: ServedVersions
    namespaces: tuple[str, ...]
    interval: float
    holding: Callable[[], AbstractContextManager[None]]
    cache: SurveyCache | None = None
    cluster_id: str = ""

    def reads(self) -> SurveyDeps:
        """Return the survey's part of these (`SurveyDeps`): reads, clients, metrics, scope."""
        return SurveyDeps(
            kube=self.kube,
            clients=self.clients,
            metrics=self.metrics,
            versions=self.versions,
            namespaces=self.namespaces,
            cache=self.cache,
            cluster_id=self.cluster_id,
        )


@dataclass
class PoolAudit:
    """The outcome of one audit of a pool by the operator.

    Attributes
    ----------
    pool:
        The pool.
    findings:
        What is still wrong after the repairs (the condition and the metric show these).
    restored:
        Missing entries registered again at their address.
    """

    pool: Pool
    findings: list[Finding]
    restored: list[Finding] = field(default_factory=list)


def _conflict_from(finding: Finding, message: str, hostname: str) -> Finding:
    """Return a missing finding turned into a conflict with ``hostname`` holding the address."""
    return Finding(
        pool=finding.pool,
        kind=finding.kind,
        claim=finding.claim,
        address=finding.address,
        hostname=hostname,
        finding=FindingKind.CONFLICT,
        message=message,
        ip_address=finding.ip_address,
        expected=finding.expected,
    )


def _auditable(pool: Pool) -> bool:
    """Return True when a pool is audited: not being deleted, Ready for its generation."""
    if pool.deleting:
        return False
    return pool.ready[0] == "True" and pool.observed_generation == pool.generation


class Auditor:
    """The drift audit of the leader: compares, repairs what it may, reports the rest.

    Keeps, in memory, the findings of each pool's last audit, so that a Warning Event is
    posted when a finding appears, not at every round (after a restart they are posted once
    more). Thread-safe for one round at a time (`audit_forever` runs one thread).

    Races with claims being allocated or released at the same time are ruled out by the
    order of the survey's reads (`bridge.reconcilers.audit.survey.survey`) and by checks
    before anything is written: a repair re-reads the claim and its IPAddress and looks the
    hostname up first, and undoes itself when the claim's release started meanwhile.

    Parameters
    ----------
    deps:
        What the audit uses (Kubernetes, IPAM clients, Events, metrics, namespaces).
    """

    def __init__(self, deps: AuditDeps) -> None:
        self.deps = deps
        self._reads = deps.reads()
        self._seen: dict[tuple[str, str, str], frozenset[tuple[str, str, str, str]]] = {}
        self._stop = threading.Event()
        self._cached: CachedObjects | None = None

    def stop(self) -> None:
        """Make a running round stop before its next pool or repair (leadership lost)."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        """True once `stop` was called."""
        return self._stop.is_set()

    # -- a round ------------------------------------------------------------------------

    def run_round(self) -> list[PoolAudit]:
        """Audit every pool that is Ready (current generation) and not being deleted.

        Pool by pool; a pool whose audit fails (IPAM unreachable, Secret missing, API
        error) is logged and left as it was (condition, metric), to be audited at the next
        round: an error is never a finding.

        The pools' IPAddresses are read from the informer cache while it is synced (one
        `CachedObjects` per round, dropped at its end), and one pool is surveyed at a time:
        a round holds one pool's objects at most.

        Returns
        -------
        list of PoolAudit
            The pools audited.
        """
        cache = self.deps.cache
        self._cached = CachedObjects(cache) if cache is not None else None
        try:
            return self._round()
        finally:
            self._cached = None

    def _round(self) -> list[PoolAudit]:
        """Audit the pools of `run_round`; return those audited."""
        done: list[PoolAudit] = []
        present: set[tuple[str, str, str]] = set()
        for kind in capi.POOL_KINDS:
            try:
                bodies = self.deps.kube.list_pools(kind, self.deps.namespaces)
            except ApiException as exc:
                log.warning("drift audit: cannot list %s: %s %s", kind, exc.status, exc.reason)
                return done
            for body in bodies:
                if self.stopped:
                    return done
                try:
                    pool = parse_pool(body, kind)
                except PoolError:
                    continue
                present.add(pool.key)
                if not _auditable(pool):
                    continue
                result = self._audit_logged(pool)
                if result is not None:
                    done.append(result)
        for key in set(self._seen) - present:
            del self._seen[key]
        return done

    def _audit_logged(self, pool: Pool) -> PoolAudit | None:
        """Return `audit_pool`'s outcome, or None after logging why the pool was skipped."""
        try:
            return self.audit_pool(pool)
        except BackendError as exc:
            log.warning(
                "drift audit of %s skipped: %s (trying again at the next round)",
                pool.display,
                exc.message,
            )
        except PoolError as exc:
            log.warning("drift audit of %s skipped: %s", pool.display, exc.message)
        except ApiException as exc:
            log.warning(
                "drift audit of %s skipped: API error %s %s", pool.display, exc.status, exc.reason
            )
        except Exception:
            log.exception("drift audit of %s failed (trying again at the next round)", pool.display)
        return None

    def audit_pool(self, pool: Pool) -> PoolAudit:
        """Audit one pool: survey, repair missing entries, post Events, write status, metric.

        Parameters
        ----------
        pool:
            The pool as read.

        Raises
        ------
        PoolError, backends.errors.BackendError, kubernetes.client.ApiException
            From `survey` (nothing is written then). Errors of single repairs are logged and
            leave that finding as it was.
        """
        backend = self.deps.clients.backend_for(pool)
        seen = survey(self._reads, pool, backend, cached=self._cached)
        findings: list[Finding] = []
        restored: list[Finding] = []
        for finding in seen.findings:
            if finding.finding != FindingKind.MISSING or self.stopped:
                findings.append(finding)
                continue
            outcome = self._restore(pool, backend, finding)
            if outcome == _RESTORED:
                restored.append(finding)
            elif isinstance(outcome, Finding):
                findings.append(outcome)
        self._report(pool, seen, findings)
        return PoolAudit(pool, findings, restored)

    # -- repair -------------------------------------------------------------------------

    def _restore(
        self, pool: Pool, backend: IPAMBackend, finding: Finding
    ) -> Finding | Literal["restored"] | None:
        """Register a missing entry again at its address under the claim's hostname.

        Returns ``"restored"``, None when the finding does not hold any more (the claim or
        its IPAddress changed, or the entry is back), the finding itself while the claim is
        paused, or a conflict (the address or the hostname is held).
        """
        checked = self._still_missing(finding)
        if checked is None:
            return None
        if self._paused(checked):
            message = finding.message + "; not registered again while paused"
            return Finding(**{**asdict(finding), "message": message})
        registered = self._register_again(pool, backend, finding, checked)
        if not isinstance(registered, Allocation):
            return registered
        address = normal_address(registered.address) or registered.address
        if address != finding.address:
            return _conflict_from(
                finding,
                f"'{finding.expected}' (claim {finding.claim}) is registered at "
                f"{registered.address} instead of {finding.address}; nothing was changed",
                finding.expected,
            )
        body = self._undo_if_released(pool, backend, finding)
        if body is None:
            return None
        self._restored(pool, finding, body)
        return _RESTORED

    def _still_missing(self, finding: Finding) -> Claim | None:
        """Read the claim and its IPAddress again; return the claim while the finding holds."""
        kube, version = self.deps.kube, self.deps.versions.address
        namespace, name = finding.claim.split("/", 1)
        body = kube.get_claim(version, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        address = kube.get_ip_address(version, namespace, finding.ip_address)
        if (
            address is None
            or (address.get("metadata") or {}).get("deletionTimestamp")
            or normal_address((address.get("spec") or {}).get("address")) != finding.address
        ):
            return None
        try:
            return Claim.from_body(body)
        except ValueError:
            return None

    def _register_again(
        self, pool: Pool, backend: IPAMBackend, finding: Finding, claim: Claim
    ) -> Allocation | Finding | None:
        """Look the hostname up, then register it at the finding's address.

        Returns the new entry; None when it is registered there already (an allocation in
        flight); the finding itself when the IPAM failed or the auditor was stopped; a
        conflict when the hostname or the address is held (the hostname by another owner:
        `backends.errors.EntryOwnedError`, never taken over).
        """
        metrics, hostname = self.deps.metrics, finding.expected
        backend_name = BACKEND_NAMES[pool.kind]
        owner = EntryOwner(self.deps.cluster_id, claim.key)
        try:
            found = metrics.call(backend_name, "find", lambda: backend.find(hostname))
            # Another owner's entry under the hostname: the allocate below refuses it.
            if found is not None and may_adopt(found, owner, finding.address):
                if (normal_address(found.address) or found.address) == finding.address:
                    return None  # registered meanwhile (an allocation in flight)
                return _conflict_from(
                    finding,
                    f"'{hostname}' (claim {finding.claim}) is registered at {found.address} "
                    f"instead of {finding.address}; nothing was changed",
                    hostname,
                )
            if self.stopped:
                return finding
            return metrics.call(
                backend_name,
                "allocate",
                lambda: backend.allocate(hostname, owner, address=finding.address),
            )
        except AddressUnavailableError as exc:
            return _held(finding, exc)
        except EntryOwnedError as exc:
            return _conflict_from(
                finding,
                f"'{hostname}' (claim {finding.claim}) is registered at {exc.address} for claim "
                f"{exc.owner}; nothing was changed",
                hostname,
            )
        except BackendError as exc:
            log.warning(
                "drift audit of %s: %s not registered again: %s (trying at the next round)",
                pool.display,
                finding.address,
                exc.message,
            )
            return finding

    def _undo_if_released(
        self, pool: Pool, backend: IPAMBackend, finding: Finding
    ) -> dict[str, Any] | None:
        """Return the claim as read after a repair; release the entry if the claim is going.

        A release that started meanwhile must not find the entry back: it is released again
        (a failure is logged) and None is returned.
        """
        namespace, name = finding.claim.split("/", 1)
        after = self.deps.kube.get_claim(self.deps.versions.address, namespace, name)
        if after is not None and not (after.get("metadata") or {}).get("deletionTimestamp"):
            return after
        owner = EntryOwner(self.deps.cluster_id, finding.claim)
        try:
            backend.release(finding.expected, owner, address=finding.address)
        except BackendError as exc:
            log.warning(
                "drift audit of %s: could not undo %s of released claim %s: %s",
                pool.display,
                finding.address,
                finding.claim,
                exc.message,
            )
        return None

    def _restored(self, pool: Pool, finding: Finding, claim: Mapping[str, Any]) -> None:
        """Tell of a repair: a log line, a Normal Event on the claim, the restored counter."""
        message = (
            f"{finding.address} was gone from the IPAM ({pool.display}); registered again as "
            f"'{finding.expected}' at the same address"
        )
        log.info("drift audit: claim %s: %s", finding.claim, message)
        self.deps.events.post(claim, "Normal", Reason.ADDRESS_RESTORED, message)
        self.deps.metrics.drift_restored.labels(_metric_pool(pool), pool.kind).inc()

    def _paused(self, claim: Claim) -> bool:
        """Return True when the claim or its Cluster is paused (no IPAM write then)."""
        if capi.PAUSED_ANNOTATION in claim.annotations:
            return True
        if not claim.cluster_name:
            return False
        cluster = self.deps.kube.get_cluster(claim.namespace, claim.cluster_name)
        if cluster is None:
            return False
        annotations = (cluster.get("metadata") or {}).get("annotations")
        return capi.is_paused(annotations, cluster.get("spec"))

    # -- reporting ------------------------------------------------------------------------

    def _report(
        self,
        pool: Pool,
        seen: Survey,
        findings: Sequence[Finding],
    ) -> None:
        """Post Events for new findings, set the metric, write ``InSync`` where it changed."""
        deps = self.deps
        before = self._seen.get(pool.key, frozenset())
        for finding in findings:
            if finding.key in before:
                continue
            if finding.finding == FindingKind.ORPHAN:
                deps.events.post(pool.as_object(), "Warning", Reason.ORPHAN_ENTRY, finding.message)
            else:
                namespace, name = finding.claim.split("/", 1)
                claim = seen.claims.get((namespace, name))
                reason = (
                    Reason.ADDRESS_MISSING
                    if finding.finding == FindingKind.MISSING
                    else Reason.ADDRESS_CONFLICT
                )
                deps.events.post(claim or pool.as_object(), "Warning", reason, finding.message)
            log.warning("drift audit of %s: %s: %s", pool.display, finding.finding, finding.message)
        self._seen[pool.key] = frozenset(f.key for f in findings)
        for kind, count in counts(findings).items():
            deps.metrics.drift.labels(_metric_pool(pool), pool.kind, kind.value).set(count)
        self._write_condition(pool, findings, seen.owners)

    def _write_condition(
        self, pool: Pool, findings: Sequence[Finding], owners: Mapping[str, int]
    ) -> None:
        """Write the pool's ``InSync`` condition when it changed, keeping every other one.

        Read, merged and written with the pool's resourceVersion: a concurrent status write
        (the pool check's Ready) makes the API answer 409 and this reads again, so neither
        writer ever drops the other's condition.
        """
        kube = self.deps.kube
        for _ in range(_CONDITION_ATTEMPTS):
            body = kube.get_pool(pool.namespace, pool.kind, pool.name)
            if body is None:
                return
            current = IPPool.from_body(body, pool.kind)
            conditions = current.status.conditions
            old = current.status.condition(IN_SYNC)
            new = Condition.model_validate(
                in_sync_condition(
                    findings,
                    observed_generation=current.generation or None,
                    previous=[wire(c) for c in conditions],
                    owners=owners,
                    cluster_id=self.deps.cluster_id,
                )
            )
            if old is not None and (old.status, old.reason, old.message) == (
                new.status,
                new.reason,
                new.message,
            ):
                return
            merged = [c for c in conditions if c.type != IN_SYNC] + [new]
            if kube.patch_pool_conditions(current, merged).outcome is not Outcome.CONFLICT:
                return
        log.info("drift audit of %s: InSync not written (the pool kept changing)", pool.display)


def _held(finding: Finding, exc: AddressUnavailableError) -> Finding:
    """Return the conflict of a missing entry whose address the IPAM refused to give again."""
    holder = exc.holder or ""
    why = f"it is held as '{holder}'" if holder else exc.message
    namespace = finding.claim.split("/", 1)[0]
    return _conflict_from(
        finding,
        f"{finding.address} (IPAddress {namespace}/{finding.ip_address} of claim "
        f"{finding.claim}) is gone from the IPAM and cannot be registered again as "
        f"'{finding.expected}': {why}; nothing was changed",
        holder or finding.expected,
    )


async def audit_forever(deps: AuditDeps) -> None:
    """Audit every pool every ``IPAM_BRIDGE_AUDIT_SECONDS`` until cancelled (0: never).

    Runs on the leader (`bridge.handlers.lifecycle.start_work`). Each round runs in a
    thread of its own (one, named ``ipam-bridge-audit``), never in the work queue's worker
    threads, so an audit never delays claim handling. The first round starts one interval
    after the start. Cancelling (clean-up, lost leadership) stops a running round before
    its next pool or repair, and the task ends once the round's thread has (a clean stop waits
    for it before the Lease is released: `bridge.runtime.leader.Leadership.close`).

    Parameters
    ----------
    deps:
        What the audit uses; ``deps.interval`` is the time between rounds (seconds).
    """
    interval = deps.interval
    if not interval:
        return
    auditor = Auditor(deps)
    executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="ipam-bridge-audit"
    )
    loop = asyncio.get_running_loop()
    try:
        while True:
            await asyncio.sleep(interval)
            try:
                audited = await loop.run_in_executor(executor, _held_round, deps, auditor)
            except Exception:
                log.exception("drift audit round failed; trying again at the next round")
                continue
            log.debug("drift audit: %d pools audited", len(audited))
    finally:
        auditor.stop()
        await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)


def _held_round(deps: AuditDeps, auditor: Auditor) -> list[PoolAudit]:
    """Run one audit round holding the backend clients it takes (`AuditDeps.holding`)."""
    with deps.holding():
        return auditor.run_round()
