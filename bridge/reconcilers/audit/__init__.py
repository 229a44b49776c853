"""Drift audit: each pool's IPAddresses against the pool's entries in the IPAM.

The IPAM is shared with people and other tools: an entry that "looks unused" gets deleted,
renamed, or its address handed to a printer; a failed run leaves an entry behind. The audit
compares, pool by pool, what Kubernetes says (the pool's IPAddresses and their claims) with
what the IPAM holds (`backends.base.IPAMBackend.entries`: one list request per subnet), in
memory, and names three findings (`FindingKind`):

- **missing**: an IPAddress whose entry is gone from the IPAM (no entry at its address, and
  its hostname registered nowhere else in the pool). The operator registers it again at the
  same address under the claim's hostname when that address is free (Normal Event
  ``AddressRestored`` on the claim); a held address makes it a conflict.
- **conflict**: the IPAddress's address is registered under another hostname (a renamed
  entry, another tool's entry, a quarantined one), or the claim's hostname holds another
  address. Warning Event ``AddressConflict`` on the claim naming both; never "fixed" by
  taking an address from anyone.
- **orphan**: an entry whose owner says this cluster's ipam-bridge made it
  (`backends.base.Allocation.owner`, or the previous release's description ``ipam-bridge
  <namespace>/<claim>``) for a claim that does not exist, and that is not quarantined by
  us (a grace period, `backends.base.quarantined_until`). Warning Event ``OrphanEntry`` on
  the pool; never deleted by the audit.

Owners: one IPAM serves many management clusters. Entries whose owner is another management
cluster (its cluster id is not this one's, `bridge.cluster_id`) are never findings here (never
orphans, never repaired, never a claim's hostname "registered elsewhere"); each pool's entries
are counted per owner (`owner_counts`) in its ``InSync`` message and ``ipam-bridge audit``. A
repair registers the entry with this cluster's owner and never takes another owner's entry.

Not findings: entries of other tools and people at addresses no IPAddress claims (simply
used addresses), our reserved entries (`backends.phpipam.RESERVED_HOSTNAMES`: gateway,
network and broadcast reservations), quarantined entries, IPAddresses and claims being
deleted (their release decides), IPAddresses registered at another IPAM location than the
pool's current one (`bridge.reconcilers.pool_backends.location_of`; only a ``subnets`` list
that grew at its end counts as the same location).

One job per module:

- `compare <bridge.reconcilers.audit.compare>`: the comparison, pure (typed values in,
  `Finding` list out);
- `survey <bridge.reconcilers.audit.survey>`: the reads (one ``entries()`` per pool, one
  IPAddress list and one claim list per namespace) and the comparison, read-only; what it
  uses is a `SurveyDeps`;
- `service <bridge.reconcilers.audit.service>`: the leader's `Auditor` (repairs, Events, the
  pool's ``InSync`` condition, the metric ``ipam_bridge_drift{pool,kind,finding}``) and
  `audit_forever`, which runs it every ``IPAM_BRIDGE_AUDIT_SECONDS``; what they use is an
  `AuditDeps`, built by the composition root (`bridge.operator.Operator.audit`);
- `cli <bridge.reconcilers.audit.cli>`: ``ipam-bridge audit``, which connects with the
  current kubeconfig and builds its own `SurveyDeps`.

Races with claims being allocated or released at the same time are ruled out by the order
of the reads and by checks before anything is reported or written: the entries are listed
before the IPAddresses, and the IPAddresses before the claims (an allocation registers the
entry before it creates the IPAddress; a release marks the claim deleted before it frees the
entry), orphans are confirmed by a second list of the entries (a claim goes only after its
entry), and a repair re-reads the claim and its IPAddress and looks the hostname up first.
See ``docs/architecture.md`` for where the audit sits in the operator.
"""

from __future__ import annotations

from bridge.reconcilers.audit.cli import EXIT_DRIFT, EXIT_ERROR, EXIT_IN_SYNC, format_table, run_cli
from bridge.reconcilers.audit.compare import (
    Finding,
    FindingKind,
    compare,
    counts,
    orphan_namespaces,
    owner_counts,
    owner_summary,
    pool_label,
)
from bridge.reconcilers.audit.service import (
    IN_SYNC,
    AuditApi,
    AuditDeps,
    Auditor,
    PoolAudit,
    audit_forever,
    in_sync_condition,
)
from bridge.reconcilers.audit.survey import (
    PoolBackends,
    Survey,
    SurveyApi,
    SurveyDeps,
    survey,
    typed_addresses,
    typed_claims,
)

__all__ = [
    "EXIT_DRIFT",
    "EXIT_ERROR",
    "EXIT_IN_SYNC",
    "IN_SYNC",
    "AuditApi",
    "AuditDeps",
    "Auditor",
    "Finding",
    "FindingKind",
    "PoolAudit",
    "PoolBackends",
    "Survey",
    "SurveyApi",
    "SurveyDeps",
    "audit_forever",
    "compare",
    "counts",
    "format_table",
    "in_sync_condition",
    "orphan_namespaces",
    "owner_counts",
    "owner_summary",
    "pool_label",
    "run_cli",
    "survey",
    "typed_addresses",
    "typed_claims",
]
