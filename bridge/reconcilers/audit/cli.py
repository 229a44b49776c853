"""``ipam-bridge audit``: the operator's drift comparison, read-only, from a kubeconfig.

Prints the findings of every pool (`bridge.reconcilers.audit.survey.survey`) as a table or
JSON for a person or a CI job; writes nothing (no repair, no Event, no status).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from kubernetes.client import ApiException

from backends.errors import BackendError
from bridge import capi
from bridge.cluster_id import resolve_cluster_id
from bridge.metrics import Metrics
from bridge.models import IPPool
from bridge.objects.client import ObjectClient
from bridge.reconcilers.audit.compare import (
    Finding,
    FindingKind,
    counts,
    owner_summary,
    pool_label,
)
from bridge.reconcilers.audit.survey import SurveyDeps, survey
from bridge.reconcilers.backend_clients import BackendCache, PoolClients
from bridge.reconcilers.context import ServedVersions
from bridge.reconcilers.errors import PoolError
from bridge.reconcilers.pool_backends import valid
from bridge.runtime.gateway import access_denied, api_client, api_status_message
from bridge.settings import Settings

__all__ = ["EXIT_DRIFT", "EXIT_ERROR", "EXIT_IN_SYNC", "format_table", "run_cli"]

#: Exit codes of ``ipam-bridge audit``.
EXIT_IN_SYNC, EXIT_DRIFT, EXIT_ERROR = 0, 1, 2

_COLUMNS = ("POOL", "CLAIM", "ADDRESS", "IPAM HOSTNAME", "FINDING")


def format_table(findings: Sequence[Finding]) -> str:
    """Return the findings as a plain-text table (pool, claim, address, IPAM hostname, finding)."""
    rows = [_COLUMNS] + [
        (f.pool, f.claim or "-", f.address, f.hostname or "-", f.finding.value) for f in findings
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


@dataclass
class _Connection:
    """What ``ipam-bridge audit`` works with: the API client, the survey's dependencies."""

    kube: ObjectClient
    survey: SurveyDeps
    backends: BackendCache

    def close(self) -> None:
        """Close the IPAM clients, then the Kubernetes connections."""
        self.backends.close()
        self.kube.close()


@dataclass
class _Outcome:
    """What ``ipam-bridge audit`` found: the findings, each pool audited, each pool failed."""

    findings: list[Finding] = field(default_factory=list)
    pools: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    cluster_id: str = ""

    @property
    def code(self) -> int:
        return EXIT_ERROR if self.errors else EXIT_DRIFT if self.findings else EXIT_IN_SYNC


def run_cli(
    namespace: str | None = None,
    output: str = "table",
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``ipam-bridge audit``: the operator's comparison, read-only, from a kubeconfig.

    Reads the current kubeconfig (``$KUBECONFIG``, else ``~/.kube/config``, else the
    in-cluster service account); lists our pools (of ``namespace`` only, when given: Global
    pools are then compared for that namespace's IPAddresses and claims), and compares each
    one with its IPAM (`survey`). Nothing is written: no repair, no Event, no status. The
    identity needs ``list`` on the pools, IPAddresses and IPAddressClaims and ``get`` on the
    pools' Secrets (the IPAM credentials), and ``get`` on namespace ``kube-system`` unless
    ``IPAM_BRIDGE_CLUSTER_ID`` names this management cluster (`bridge.cluster_id`): entries
    of other management clusters are counted per owner, never reported.

    Parameters
    ----------
    namespace:
        Audit only the pools of this namespace (None: all namespaces).
    output:
        ``table`` (columns pool, claim, address, IPAM hostname, finding; then a summary and,
        per pool, its entries by owner) or ``json`` (``inSync``, ``clusterId``, ``pools``
        with ``owners``: entries per owner cluster id, ``""`` the previous release;
        ``findings`` with messages, ``errors``).
    out, err:
        Where the result and the error lines go (default stdout, stderr).

    Returns
    -------
    int
        `EXIT_IN_SYNC` (0) when every pool was audited and nothing was found,
        `EXIT_DRIFT` (1) when something was found, `EXIT_ERROR` (2) when the audit is
        incomplete: no kubeconfig, the API refused, CAPI's CRDs not served, or a pool whose
        IPAM (or Secret) could not be read (its message is printed; findings of the other
        pools are still shown).
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        connection = _connect(namespace)
    except Exception as exc:  # any set-up failure (kubeconfig, API, settings): exit 2
        print(f"ipam-bridge audit: {_cli_error(exc)}", file=err)
        return EXIT_ERROR
    try:
        outcome = _audit_pools(connection, err)
    finally:
        connection.close()
    if outcome is None:
        return EXIT_ERROR
    if output == "json":
        _print_json(outcome, out)
    else:
        _print_table(outcome, out)
    if outcome.errors:
        print(f"incomplete: {len(outcome.errors)} pool(s) could not be audited", file=err)
    return outcome.code


def _audit_pools(connection: _Connection, err: TextIO) -> _Outcome | None:
    """Survey every pool not being deleted; None when a pool kind cannot be listed."""
    outcome = _Outcome(cluster_id=connection.survey.cluster_id)
    for kind in capi.POOL_KINDS:
        try:
            bodies = connection.kube.list_pools(kind, connection.survey.namespaces)
        except ApiException as exc:
            print(f"ipam-bridge audit: cannot list {kind}: {_cli_error(exc)}", file=err)
            return None
        for body in bodies:
            pool = IPPool.from_body(body, kind)
            name = "/".join(p for p in (pool.metadata.namespace, pool.name) if p)
            try:
                if valid(pool).deleting:
                    continue
                seen = survey(connection.survey, pool)
            except (PoolError, BackendError, ApiException) as exc:
                message = _cli_error(exc)
                outcome.errors.append({"pool": name, "kind": kind, "error": message})
                print(f"ipam-bridge audit: {kind} {name}: {message}", file=err)
                continue
            outcome.findings.extend(seen.findings)
            outcome.pools.append(
                {
                    "pool": pool_label(pool),
                    "kind": pool.kind,
                    "entries": seen.entries,
                    "ipAddresses": seen.addresses,
                    "findings": len(seen.findings),
                    "owners": seen.owners,
                }
            )
    return outcome


def _print_json(outcome: _Outcome, out: TextIO) -> None:
    document = {
        "inSync": outcome.code == EXIT_IN_SYNC,
        "clusterId": outcome.cluster_id,
        "pools": outcome.pools,
        "findings": [f.as_dict() for f in outcome.findings],
        "errors": outcome.errors,
    }
    print(json.dumps(document, indent=2), file=out)


def _print_table(outcome: _Outcome, out: TextIO) -> None:
    findings, pools = outcome.findings, outcome.pools
    if findings:
        print(format_table(findings), file=out)
        n = counts(findings)
        print(
            f"\n{len(findings)} finding(s) in {len({(f.kind, f.pool) for f in findings})} of "
            f"{len(pools)} pool(s): {n[FindingKind.MISSING]} missing, "
            f"{n[FindingKind.CONFLICT]} conflict, {n[FindingKind.ORPHAN]} orphan",
            file=out,
        )
        for finding in findings:
            print(f"- {finding.finding}: {finding.message}", file=out)
    elif not outcome.errors:
        print(
            f"in sync: {len(pools)} pool(s) audited, "
            f"{sum(p['ipAddresses'] for p in pools)} IPAddresses, "
            f"{sum(p['entries'] for p in pools)} IPAM entries",
            file=out,
        )
    if pools:
        print(f"\nthis management cluster: {outcome.cluster_id}", file=out)
    for pool in pools:
        owners = owner_summary(pool["owners"], outcome.cluster_id)
        print(f"{pool['kind']} {pool['pool']}: {owners}", file=out)


def _connect(namespace: str | None) -> _Connection:
    """Connect with the current kubeconfig; return what `survey` uses (read-only, no queue)."""
    settings = Settings().model_copy(update={"namespace": namespace or ""})
    kube = ObjectClient(api_client(timeout=settings.kube_timeout))
    try:
        version = kube.preferred_version(capi.GROUP, "ipaddresses", capi.SUPPORTED_VERSIONS)
    except BaseException:
        kube.close()
        raise
    backends = BackendCache()
    clients = PoolClients(settings, kube, settings.flow_control(), backends)
    try:
        cluster_id = resolve_cluster_id(settings, kube.core)
    except BaseException:
        kube.close()
        raise
    deps = SurveyDeps(
        kube=kube,
        clients=clients,
        metrics=Metrics(),
        versions=ServedVersions(version),
        namespaces=settings.namespaces,
        cluster_id=cluster_id,
    )
    return _Connection(kube, deps, backends)


def _cli_error(exc: BaseException) -> str:
    """Return one line for a person about a failure of ``ipam-bridge audit``."""
    if isinstance(exc, ApiException):
        denied = access_denied(exc)
        if denied is not None:
            return f"the API server refused: {denied}"
        return f"API error {exc.status}: {api_status_message(exc)}"
    if isinstance(exc, BackendError | PoolError):
        return exc.message
    return str(exc) or type(exc).__name__
