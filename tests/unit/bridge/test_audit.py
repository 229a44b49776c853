"""bridge.reconcilers.audit: the drift comparison (pure) and the leader's decisions, with fakes."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import copy
import importlib.util
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from fakes import DELETED_AT, FakeKube, claim, ours, phpipam_pool, pool_condition

from backends.base import Allocation, EntryOwner, IPAMBackend, may_adopt, owner_text
from backends.errors import (
    AddressUnavailableError,
    BackendError,
    BackendUnavailableError,
    EntryOwnedError,
)
from backends.phpipam import RESERVED_GATEWAY_HOSTNAME
from bridge import capi
from bridge.capi import Reason
from bridge.metrics import Metrics
from bridge.models import Condition, IPPool, wire
from bridge.objects.cache import Cache
from bridge.reconcilers import audit
from bridge.reconcilers.audit import (
    IN_SYNC,
    AuditDeps,
    Auditor,
    Finding,
    FindingKind,
    in_sync_condition,
    typed_addresses,
    typed_claims,
)
from bridge.reconcilers.context import ServedVersions
from bridge.reconcilers.pool_backends import Pool, location_of, parse_pool
from bridge.runtime.events import EventRecorder
from bridge.runtime.gateway import Outcome
from bridge.runtime.gateway import Write as KubeWrite

NS = "ns"
KIND = "PHPIPAMIPPool"
READY = pool_condition()


def ipam_entry(
    address: str,
    hostname: str,
    description: str = "",
    *,
    quarantined_until: float | None = None,
    owner: EntryOwner | None = None,
) -> Allocation:
    return Allocation(
        address=address,
        prefix=24,
        gateway="10.0.0.1",
        hostname=hostname,
        ref=f"ref-{address}",
        subnet="10.0.0.0/24",
        description=description,
        quarantined_until=quarantined_until,
        owner=owner,
    )


def ip_address(
    name: str,
    address: str,
    *,
    namespace: str = NS,
    pool: str = "pool",
    kind: str = KIND,
    hostname: str | None = "default",
    location: str | None = None,
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if hostname is not None:
        annotations[capi.HOSTNAME_ANNOTATION] = (
            f"{name}.{namespace}" if hostname == "default" else hostname
        )
    if location is not None:
        annotations[capi.LOCATION_ANNOTATION] = location
    return {
        "apiVersion": f"{capi.GROUP}/v1beta2",
        "kind": "IPAddress",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": annotations,
            "finalizers": [capi.ADDRESS_FINALIZER],
        },
        "spec": {
            "address": address,
            "prefix": 24,
            "claimRef": {"name": name},
            "poolRef": {"apiGroup": capi.GROUP, "kind": kind, "name": pool},
        },
    }


def compare(
    pool: Pool,
    entries: Sequence[Allocation],
    addresses: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    **options: Any,
) -> list[Finding]:
    """`audit.compare` of objects as the API returns them (typed at the edge, as the survey)."""
    return audit.compare(pool, entries, typed_addresses(addresses), typed_claims(claims), **options)


def the_pool(**spec: Any) -> Pool:
    body = phpipam_pool(status=READY, **spec)
    if "subnets" in spec:
        del body["spec"]["subnet"]
    return parse_pool(body)


# -- the comparison ---------------------------------------------------------------------------


def test_in_sync_ignores_other_tools_reserved_rows_and_quarantined_entries() -> None:
    pool = the_pool()
    entries = [
        ipam_entry("10.0.0.2", "m1.ns", "ipam-bridge ns/m1 cluster c1"),
        ipam_entry("10.0.0.1", RESERVED_GATEWAY_HOSTNAME, "ipam-bridge: the subnet's gateway"),
        ipam_entry("10.0.0.9", "printer.example.com", "the 3rd floor printer"),
        ipam_entry("10.0.0.10", "", ""),
        ipam_entry(
            "10.0.0.3",
            "quarantined.gone.ns",
            "ipam-bridge quarantined until 2026-11-24T05:00:00Z: ipam-bridge ns/gone",
            quarantined_until=1.0,
        ),
    ]
    assert compare(pool, entries, [ip_address("m1", "10.0.0.2")], [ours(name="m1")]) == []


def test_a_missing_entry_is_named_with_the_hostname_to_register() -> None:
    [finding] = compare(the_pool(), [], [ip_address("m1", "10.0.0.2")], [ours(name="m1")])
    assert finding.finding == FindingKind.MISSING
    assert (finding.pool, finding.kind, finding.claim) == ("ns/pool", KIND, "ns/m1")
    assert (finding.address, finding.hostname, finding.ip_address) == ("10.0.0.2", "m1.ns", "m1")
    assert "10.0.0.2" in finding.message and "'m1.ns'" in finding.message


def test_a_renamed_entry_is_a_conflict_naming_both_hostnames() -> None:
    entries = [ipam_entry("10.0.0.2", "printer", "ipam-bridge ns/m1")]
    [finding] = compare(the_pool(), entries, [ip_address("m1", "10.0.0.2")], [ours(name="m1")])
    assert finding.finding == FindingKind.CONFLICT
    assert finding.hostname == "printer" and finding.expected == "m1.ns"
    assert "'printer'" in finding.message and "'m1.ns'" in finding.message
    assert "nothing was changed" in finding.message


def test_an_address_held_by_a_quarantined_entry_is_a_conflict() -> None:
    entries = [
        ipam_entry(
            "10.0.0.2",
            "quarantined.old.ns",
            "ipam-bridge quarantined until x",
            quarantined_until=5.0,
        )
    ]
    [finding] = compare(the_pool(), entries, [ip_address("m1", "10.0.0.2")], [ours(name="m1")])
    assert finding.finding == FindingKind.CONFLICT
    assert "quarantined" in finding.message


def test_a_hostname_holding_another_address_is_a_conflict_never_missing() -> None:
    moved = [ipam_entry("10.0.0.7", "m1.ns", "ipam-bridge ns/m1")]
    [instead] = compare(the_pool(), moved, [ip_address("m1", "10.0.0.2")], [ours(name="m1")])
    assert instead.finding == FindingKind.CONFLICT
    assert "registered at 10.0.0.7 instead of 10.0.0.2" in instead.message
    both = [*moved, ipam_entry("10.0.0.2", "M1.ns.", "ipam-bridge ns/m1")]  # case, dot
    [twice] = compare(the_pool(), both, [ip_address("m1", "10.0.0.2")], [ours(name="m1")])
    assert "registered at 10.0.0.7 as well" in twice.message


def test_an_entry_of_a_claim_that_no_longer_exists_is_an_orphan() -> None:
    entries = [
        ipam_entry("10.0.0.5", "gone.ns", "ipam-bridge ns/gone cluster c1"),
        ipam_entry("10.0.0.6", "alive.ns", "ipam-bridge ns/alive"),  # claim exists, no IPAddress
        ipam_entry("10.0.0.7", "x.other", "ipam-bridge other/x"),  # namespace not listed
    ]
    findings = compare(the_pool(), entries, [], [ours(name="alive")], claim_namespaces={NS})
    assert [(f.finding, f.claim, f.address, f.hostname) for f in findings] == [
        (FindingKind.ORPHAN, "ns/gone", "10.0.0.5", "gone.ns")
    ]
    # Every namespace listed (None): the other namespace's entry is an orphan too.
    assert len(compare(the_pool(), entries, [], [ours(name="alive")])) == 2


def test_a_cut_description_takes_the_claim_name_from_the_hostname() -> None:
    long_name = "md-0-" + "x" * 50
    cut = f"ipam-bridge ns/{long_name}"[:64]
    entries = [ipam_entry("10.0.0.5", f"{long_name}.ns", cut)]
    assert compare(the_pool(), entries, [], [ours(name=long_name)]) == []
    [orphan] = compare(the_pool(), entries, [], [])
    assert orphan.claim == f"ns/{long_name}"
    # Renamed and cut: the cut name is a prefix; a claim starting with it is not an orphan.
    renamed = [ipam_entry("10.0.0.5", "printer", cut)]
    assert compare(the_pool(), renamed, [], [ours(name=long_name)]) == []


def test_addresses_of_other_pools_deleting_claims_or_other_locations_are_not_audited() -> None:
    pool = the_pool()
    elsewhere = json.dumps({"endpoint": "https://old.example.com", "appId": "capi"})
    addresses = [
        ip_address("other", "10.0.0.2", pool="another"),
        ip_address("going", "10.0.0.3"),
        ip_address("moved", "10.0.0.4", location=elsewhere),
        ip_address("here", "10.0.0.5", location=location_of(pool)),
        ip_address("noclaim", "10.0.0.6"),
    ]
    claims = [
        ours(name="other", pool="another"),
        ours(name="going", deleting=True),
        ours(name="moved"),
        ours(name="here"),
    ]
    findings = compare(pool, [], addresses, claims)
    assert [f.claim for f in findings] == ["ns/here"]


def test_a_subnets_list_grown_at_its_end_is_the_same_location() -> None:
    before = the_pool(subnets=[{"subnet": "10.0.0.0/24"}])
    after = the_pool(subnets=[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.1.0/24"}])
    recorded = ip_address("m1", "10.0.0.2", location=location_of(before))
    assert len(compare(after, [], [recorded], [ours(name="m1")])) == 1
    reordered = the_pool(subnets=[{"subnet": "10.0.1.0/24"}, {"subnet": "10.0.0.0/24"}])
    assert compare(reordered, [], [recorded], [ours(name="m1")]) == []


def test_without_a_hostname_annotation_the_claims_hostname_with_the_suffix_is_expected() -> None:
    pool = the_pool(hostnameSuffix="nodes.example.com")
    entries = [ipam_entry("10.0.0.2", "m1.ns.nodes.example.com", "ipam-bridge ns/m1")]
    address = ip_address("m1", "10.0.0.2", hostname=None)
    assert compare(pool, entries, [address], [ours(name="m1")]) == []


def test_infoblox_names_under_the_pools_zone_and_ipv6_text_compare_equal() -> None:
    body = {
        "apiVersion": f"{capi.GROUP}/v1alpha1",
        "kind": "InfobloxIPPool",
        "metadata": {"name": "ib", "namespace": NS, "uid": "u", "generation": 1},
        "spec": {
            "endpoint": "https://gm.example.com",
            "subnet": "2001:db8::/64",
            "dnsZone": "nodes.example.com",
            "credentialsRef": {"name": "creds"},
        },
    }
    pool = parse_pool(body)
    entries = [ipam_entry("2001:db8::5", "m1.ns.nodes.example.com", "ipam-bridge ns/m1")]
    address = ip_address("m1", "2001:0db8:0000::0005", pool="ib", kind="InfobloxIPPool")
    assert (
        compare(pool, entries, [address], [ours(name="m1", pool="ib", kind="InfobloxIPPool")]) == []
    )


def test_in_sync_condition_counts_each_finding_and_keeps_its_transition_time() -> None:
    found = [
        Finding("ns/pool", KIND, "ns/a", "10.0.0.2", "x", FindingKind.CONFLICT, "m"),
        Finding("ns/pool", KIND, "ns/b", "10.0.0.3", "y", FindingKind.ORPHAN, "m"),
        Finding("ns/pool", KIND, "ns/c", "10.0.0.4", "z", FindingKind.ORPHAN, "m"),
    ]
    condition = in_sync_condition(found, observed_generation=3, now="T1")
    assert condition["type"] == IN_SYNC and condition["status"] == "False"
    assert condition["reason"] == Reason.DRIFT_FOUND
    assert condition["message"].startswith("0 missing, 1 conflict, 2 orphan")
    assert condition["observedGeneration"] == 3
    again = in_sync_condition(found[:1], previous=[condition], now="T2")
    assert again["lastTransitionTime"] == "T1"
    fixed = in_sync_condition([], previous=[condition], now="T3")
    assert (fixed["status"], fixed["reason"], fixed["lastTransitionTime"]) == (
        "True",
        Reason.NO_DRIFT,
        "T3",
    )


def test_the_table_has_the_five_columns() -> None:
    finding = Finding("ns/pool", KIND, "ns/a", "10.0.0.2", "printer", FindingKind.CONFLICT, "m")
    lines = audit.format_table([finding]).splitlines()
    assert lines[0].split() == ["POOL", "CLAIM", "ADDRESS", "IPAM", "HOSTNAME", "FINDING"]
    assert lines[1].split() == ["ns/pool", "ns/a", "10.0.0.2", "printer", "conflict"]


# -- the leader's audit ---------------------------------------------------------------------


class AuditKube(FakeKube):
    """`FakeKube` plus the guarded condition write (409 on a stale resourceVersion)."""

    def __init__(self) -> None:
        super().__init__()
        self.conflicts = 0  # answer 409 to this many condition writes

    def list_ip_addresses(self, version: str, namespace: str | None) -> list[dict[str, Any]]:
        self._read(("list_ip_addresses", str(namespace)))
        return [
            copy.deepcopy(b)
            for (ns, _), b in self.addresses.items()
            if namespace is None or ns == namespace
        ]

    def patch_pool_conditions(self, pool: IPPool, conditions: Sequence[Condition]) -> KubeWrite:
        meta = pool.as_object()["metadata"]
        written = [wire(c) for c in conditions]
        stored = self.pools[(meta.get("namespace", ""), pool.kind, meta["name"])]
        if self.conflicts or meta["resourceVersion"] != stored["metadata"]["resourceVersion"]:
            self.conflicts = max(self.conflicts - 1, 0)
            stored["metadata"]["resourceVersion"] = self._rv()
            return KubeWrite(Outcome.CONFLICT)
        target = f"{meta.get('namespace', '')}/{meta['name']}"
        self._record("pool.conditions", target, written)
        stored.setdefault("status", {})["conditions"] = copy.deepcopy(written)
        stored["metadata"]["resourceVersion"] = self._rv()
        return KubeWrite(Outcome.WRITTEN, copy.deepcopy(stored))


class AuditIPAM:
    """An IPAM backend over a list of entries, recording every call."""

    def __init__(self, entries: Sequence[Allocation] = ()) -> None:
        self.entries_ = list(entries)
        self.calls: list[tuple[str, ...]] = []
        self.error: BackendError | None = None
        self.on_entries: list[list[Allocation]] = []  # what later entries() calls return
        self.closed = False

    def entries(self) -> list[Allocation]:
        self.calls.append(("entries",))
        if self.error is not None:
            raise self.error
        if self.on_entries:
            self.entries_ = self.on_entries.pop(0)
        return list(self.entries_)

    def find(self, hostname: str) -> Allocation | None:
        self.calls.append(("find", hostname))
        return next(
            (e for e in self.entries_ if e.hostname == hostname and e.quarantined_until is None),
            None,
        )

    def allocate(
        self,
        hostname: str,
        owner: EntryOwner,
        address: str | None = None,
        *,
        adopt: str | None = None,
    ) -> Allocation:
        description = owner_text(owner)
        self.calls.append(("allocate", hostname, description, str(address)))
        taken = next(
            (e for e in self.entries_ if e.hostname == hostname and not may_adopt(e, owner, adopt)),
            None,
        )
        if taken is not None and taken.owner is not None:
            raise EntryOwnedError(
                "taken", hostname=hostname, address=taken.address, owner=taken.owner
            )
        holder = next((e for e in self.entries_ if e.address == address), None)
        if holder is not None:
            raise AddressUnavailableError(
                f"{address} is held by {holder.hostname}",
                address=str(address),
                holder=holder.hostname,
            )
        new = ipam_entry(str(address), hostname, description, owner=owner)
        self.entries_.append(new)
        return new

    def release(
        self,
        hostname: str,
        owner: EntryOwner,
        quarantine_until: float | None = None,
        *,
        address: str | None = None,
    ) -> bool:
        self.calls.append(("release", hostname))
        before = len(self.entries_)
        self.entries_ = [e for e in self.entries_ if e.hostname != hostname]
        return len(self.entries_) < before

    def close(self) -> None:
        self.closed = True

    def writes(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] in ("allocate", "release")]


class AuditClients:
    """The pools' IPAM clients: one `AuditIPAM` for every pool, each pool asked recorded."""

    def __init__(self, ipam: AuditIPAM) -> None:
        self.ipam = ipam
        self.asked: list[tuple[str, str, str]] = []

    def backend_for(self, pool: Pool, *, reuse: bool = False) -> IPAMBackend:
        self.asked.append(pool.key)
        return cast(IPAMBackend, self.ipam)


class World:
    def __init__(self, entries: Sequence[Allocation] = ()) -> None:
        self.kube = AuditKube()
        self.ipam = AuditIPAM(entries)
        self.deps = AuditDeps(
            kube=self.kube,
            clients=AuditClients(self.ipam),
            events=EventRecorder(self.kube, background=False),
            metrics=Metrics(),
            versions=ServedVersions("v1beta2"),
            namespaces=(),
            interval=300.0,
            holding=contextlib.nullcontext,
        )
        self.kube.add_pool(phpipam_pool(status=READY))
        self.auditor = Auditor(self.deps)

    def bind(self, name: str, address: str, **claim_fields: Any) -> None:
        self.kube.add_claim(ours(name=name, **claim_fields))
        self.kube.add_address(ip_address(name, address))

    def run(self) -> list[audit.PoolAudit]:
        return self.auditor.run_round()

    def condition(self) -> dict[str, Any]:
        conditions = self.kube.pools[(NS, KIND, "pool")]["status"]["conditions"]
        return next(c for c in conditions if c["type"] == IN_SYNC)

    def metric(self, finding: str) -> float:
        value = self.deps.metrics.registry.get_sample_value(
            "ipam_bridge_drift", {"pool": "ns/pool", "kind": KIND, "finding": finding}
        )
        return -1.0 if value is None else value


@pytest.fixture
def world() -> World:
    return World()


def test_a_missing_entry_is_registered_again_at_the_same_address(world: World) -> None:
    world.bind("m1", "10.0.0.5", cluster="c1")
    [result] = world.run()
    assert result.findings == [] and [f.address for f in result.restored] == ["10.0.0.5"]
    assert world.ipam.writes() == [("allocate", "m1.ns", "ipam-bridge ns/m1", "10.0.0.5")]
    [event] = world.kube.events
    assert event[:2] == ("Normal", Reason.ADDRESS_RESTORED) and "10.0.0.5" in event[2]
    assert world.kube.of("event")[0].target == "ns/m1"  # on the claim
    assert world.condition()["status"] == "True"
    assert world.metric("missing") == 0.0
    restored = world.deps.metrics.registry.get_sample_value(
        "ipam_bridge_drift_restored_total", {"pool": "ns/pool", "kind": KIND}
    )
    assert restored == 1.0
    # The next round finds it in sync and writes nothing.
    world.kube.writes.clear()
    world.run()
    assert world.kube.writes == [] and len(world.ipam.writes()) == 1


def test_a_missing_entry_whose_address_is_taken_is_a_conflict_and_takes_nothing(
    world: World,
) -> None:
    world.bind("m1", "10.0.0.5")
    world.ipam.on_entries = [[]]
    # Someone registers the address between the list and the repair.
    original = world.ipam.find

    def find_then_printer(hostname: str) -> Allocation | None:
        world.ipam.entries_.append(ipam_entry("10.0.0.5", "printer", "a printer"))
        return original(hostname)

    world.ipam.find = find_then_printer  # type: ignore[method-assign]
    [result] = world.run()
    [conflict] = result.findings
    assert conflict.finding == FindingKind.CONFLICT and conflict.hostname == "printer"
    assert [c[0] for c in world.ipam.writes()] == ["allocate"]  # refused, nothing taken
    assert [e[:2] for e in world.kube.events] == [("Warning", Reason.ADDRESS_CONFLICT)]
    assert "'printer'" in world.kube.events[0][2]
    assert world.condition()["status"] == "False"
    assert world.condition()["message"].startswith("0 missing, 1 conflict, 0 orphan")
    assert world.metric("conflict") == 1.0


def test_a_renamed_entry_is_reported_once_and_nothing_is_written_to_the_ipam() -> None:
    world = World([ipam_entry("10.0.0.5", "printer", "ipam-bridge ns/m1")])
    world.bind("m1", "10.0.0.5")
    world.run()
    assert world.ipam.writes() == []
    assert [e[:2] for e in world.kube.events] == [("Warning", Reason.ADDRESS_CONFLICT)]
    assert world.kube.of("event")[0].target == "ns/m1"
    assert world.metric("conflict") == 1.0 and world.metric("missing") == 0.0
    first = world.condition()
    world.kube.writes.clear()
    world.run()  # the same drift: no new Event, no status write
    assert world.kube.writes == []
    assert world.condition() == first


def test_an_orphan_is_reported_on_the_pool_and_never_deleted() -> None:
    orphan = ipam_entry("10.0.0.6", "gone.ns", "ipam-bridge ns/gone cluster c1")
    world = World([orphan])
    [result] = world.run()
    assert [f.finding for f in result.findings] == [FindingKind.ORPHAN]
    assert world.ipam.writes() == []
    assert world.ipam.calls.count(("entries",)) == 2  # the orphan was confirmed
    assert [e[:2] for e in world.kube.events] == [("Warning", Reason.ORPHAN_ENTRY)]
    assert world.kube.of("event")[0].target == "ns/pool"
    assert world.metric("orphan") == 1.0


def test_an_orphan_whose_entry_went_meanwhile_is_not_reported() -> None:
    # A claim released between the first list and the claims list: its entry is gone after.
    world = World([ipam_entry("10.0.0.6", "gone.ns", "ipam-bridge ns/gone")])
    world.ipam.on_entries = [list(world.ipam.entries_), []]
    [result] = world.run()
    assert result.findings == [] and world.kube.events == []
    assert world.condition()["status"] == "True"


def test_an_ipam_error_is_no_finding_and_changes_nothing(world: World) -> None:
    world.bind("m1", "10.0.0.5")
    world.ipam.error = BackendUnavailableError("phpIPAM answered 503")
    assert world.run() == []
    assert world.kube.writes == [] and world.ipam.writes() == []
    assert world.metric("missing") == -1.0  # never set
    world.ipam.error = None
    assert len(world.run()) == 1  # retried at the next round


def test_the_in_sync_condition_keeps_ready_and_survives_a_concurrent_write(world: World) -> None:
    world.kube.conflicts = 1
    world.run()
    conditions = world.kube.pools[(NS, KIND, "pool")]["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["Ready", IN_SYNC]
    assert conditions[0] == READY["conditions"][0]
    assert len(world.kube.of("pool.conditions")) == 1


def test_pools_not_ready_or_being_deleted_are_not_audited(world: World) -> None:
    world.kube.add_pool(
        phpipam_pool("broken", status=pool_condition("False", "AuthenticationFailed"))
    )
    world.kube.add_pool(phpipam_pool("new"))
    world.kube.add_pool(phpipam_pool("going", status=READY, deleting=True))
    world.kube.add_pool(phpipam_pool("changed", generation=2, status=READY))
    assert [r.pool.name for r in world.run()] == ["pool"]


def test_a_claim_being_deleted_or_an_entry_back_meanwhile_is_not_repaired(world: World) -> None:
    world.bind("m1", "10.0.0.5")
    world.bind("m2", "10.0.0.6")
    original = world.kube.get_claim

    def get_claim(version: str, namespace: str, name: str) -> dict[str, Any] | None:
        if name == "m1":  # its deletion started after the lists
            world.kube.claims[(NS, "m1")]["metadata"]["deletionTimestamp"] = DELETED_AT
        return original(version, namespace, name)

    world.kube.get_claim = get_claim  # type: ignore[method-assign]
    world.ipam.on_entries = [[]]
    original_find = world.ipam.find

    def find(hostname: str) -> Allocation | None:
        if hostname == "m2.ns":  # allocated meanwhile at the same address
            world.ipam.entries_.append(ipam_entry("10.0.0.6", "m2.ns", "ipam-bridge ns/m2"))
        return original_find(hostname)

    world.ipam.find = find  # type: ignore[method-assign]
    [result] = world.run()
    assert result.findings == [] and result.restored == []
    assert world.ipam.writes() == [] and world.kube.events == []


def test_a_paused_claim_is_reported_missing_not_registered(world: World) -> None:
    world.kube.add_cluster(NS, "c1", spec={"paused": True})
    world.bind("m1", "10.0.0.5", cluster="c1")
    [result] = world.run()
    assert [f.finding for f in result.findings] == [FindingKind.MISSING]
    assert "paused" in result.findings[0].message
    assert world.ipam.writes() == []
    assert [e[:2] for e in world.kube.events] == [("Warning", Reason.ADDRESS_MISSING)]
    assert world.metric("missing") == 1.0


def test_a_repair_of_a_claim_released_meanwhile_is_undone(world: World) -> None:
    world.bind("m1", "10.0.0.5")
    original = world.ipam.allocate

    def allocate(hostname: str, owner: EntryOwner, address: str | None = None) -> Allocation:
        done = original(hostname, owner, address)
        del world.kube.claims[(NS, "m1")]  # released and gone meanwhile
        return done

    world.ipam.allocate = allocate  # type: ignore[method-assign]
    [result] = world.run()
    assert [c[0] for c in world.ipam.writes()] == ["allocate", "release"]
    assert world.ipam.entries_ == [] and result.restored == [] and world.kube.events == []


def test_the_audit_lists_once_per_pool_not_per_claim(world: World) -> None:
    for i in range(20):
        world.bind(f"m{i}", f"10.0.0.{i + 10}")
        world.ipam.entries_.append(
            ipam_entry(f"10.0.0.{i + 10}", f"m{i}.ns", f"ipam-bridge ns/m{i}")
        )
    world.run()
    assert world.ipam.calls == [("entries",)]
    reads = [name for name, _ in world.kube.reads]
    assert reads.count("list_ip_addresses") == 1 and reads.count("list_claims") == 1
    assert "get_claim" not in reads and "get_ip_address" not in reads


def test_a_stopped_auditor_audits_nothing_more(world: World) -> None:
    world.auditor.stop()
    assert world.run() == []


def test_the_audit_loop_is_off_with_zero_seconds(world: World) -> None:
    world.deps.interval = 0
    asyncio.run(asyncio.wait_for(audit.audit_forever(world.deps), 1.0))


def test_foreign_claims_do_not_hide_orphans_of_their_names_elsewhere() -> None:
    # A claim named like the orphan's but in another namespace does not make it live.
    world = World([ipam_entry("10.0.0.6", "gone.ns", "ipam-bridge ns/gone")])
    world.kube.add_claim(claim(name="gone", namespace="elsewhere"))
    [result] = world.run()
    assert [f.claim for f in result.findings] == ["ns/gone"]


def test_run_cli_reports_a_set_up_failure_with_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    out, err = io.StringIO(), io.StringIO()
    assert audit.run_cli(out=out, err=err) == audit.EXIT_ERROR
    assert err.getvalue().startswith("ipam-bridge audit: ") and out.getvalue() == ""


def test_a_global_pool_is_audited_across_namespaces_with_one_list_each() -> None:
    world = World(
        [
            ipam_entry("10.0.0.5", "m1.a", "ipam-bridge a/m1"),
            ipam_entry("10.0.0.9", "gone.c", "ipam-bridge c/gone"),
        ],
    )
    del world.kube.pools[(NS, KIND, "pool")]
    body = phpipam_pool("shared", status=READY)
    body["kind"] = "GlobalPHPIPAMIPPool"
    del body["metadata"]["namespace"]
    body["spec"]["credentialsRef"]["namespace"] = NS
    world.kube.add_pool(body)
    for namespace, name, address in (("a", "m1", "10.0.0.5"), ("b", "m2", "10.0.0.6")):
        world.kube.add_claim(
            ours(name=name, namespace=namespace, pool="shared", kind="GlobalPHPIPAMIPPool")
        )
        world.kube.add_address(
            ip_address(
                name, address, namespace=namespace, pool="shared", kind="GlobalPHPIPAMIPPool"
            )
        )
    [result] = world.run()
    assert [(f.finding, f.claim) for f in result.restored] == [(FindingKind.MISSING, "b/m2")]
    assert [(f.finding, f.claim, f.pool) for f in result.findings] == [
        (FindingKind.ORPHAN, "c/gone", "shared")
    ]
    reads = [target for name, target in world.kube.reads if name.startswith("list_")]
    assert reads.count("None") == 1 and reads.count("") >= 1  # cluster-wide lists
    conditions = world.kube.pools[("", "GlobalPHPIPAMIPPool", "shared")]["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["Ready", IN_SYNC]


def test_findings_as_json_use_camel_case_keys() -> None:
    finding = Finding(
        "ns/pool", KIND, "ns/a", "10.0.0.2", "x", FindingKind.MISSING, "m", "a", "a.ns"
    )
    assert finding.as_dict() == {
        "pool": "ns/pool",
        "kind": KIND,
        "claim": "ns/a",
        "address": "10.0.0.2",
        "hostname": "x",
        "finding": "missing",
        "message": "m",
        "ipAddress": "a",
        "expectedHostname": "a.ns",
    }


def test_a_deleted_pool_drops_its_drift_series(world: World) -> None:
    world.bind("m1", "10.0.0.5")
    world.ipam.error = None
    world.run()
    assert world.metric("missing") == 0.0
    world.deps.metrics.forget_pool("ns/pool", KIND)
    assert world.metric("missing") == -1.0


def test_entries_of_many_namespaces_cost_one_claim_list_of_all() -> None:
    entries = [ipam_entry(f"10.0.0.{10 + i}", f"c.ns{i}", f"ipam-bridge ns{i}/c") for i in range(6)]
    world = World(entries)
    world.kube.add_claim(ours(name="c", namespace="ns3"))
    [result] = world.run()
    assert sorted(f.claim for f in result.findings) == [f"ns{i}/c" for i in range(6) if i != 3]
    assert world.kube.read("list_claims") == [""]  # all namespaces, once


def test_the_comparison_module_does_no_io() -> None:
    # compare.py is pure: it imports neither the Kubernetes client, the operator's context,
    # the backends' clients nor the survey, service or CLI of the audit.
    spec = importlib.util.find_spec("bridge.reconcilers.audit.compare")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    forbidden = (
        "kubernetes",
        "requests",
        "bridge.reconcilers.context",
        "bridge.reconcilers.pools",
        "bridge.runtime",
        "bridge.reconcilers.audit.",
    )
    assert not [m for m in imported if m.startswith(forbidden)], imported


# -- where the survey reads, and what it keeps ----------------------------------------------


def _cached(world: World) -> Cache:
    """Return an informer cache holding the world's claims and IPAddresses, synced."""
    cache = Cache()
    cache.claims.fill([(k, b) for k, b in world.kube.claims.items()])
    cache.addresses.fill([(k, b) for k, b in world.kube.addresses.items()])
    return cache


def _drifted(cache: bool) -> World:
    """Return a world with every kind of drift, its audit reading ``cache`` or the API."""
    entries = [
        ipam_entry("10.0.0.6", "m2.ns", "ipam-bridge ns/m2"),
        ipam_entry("10.0.0.7", "printer", "a printer"),
        ipam_entry("10.0.0.9", "gone.ns", "ipam-bridge ns/gone"),
    ]
    world = World(entries)
    world.ipam.on_entries = [list(entries), list(entries)]
    world.bind("m1", "10.0.0.5")  # missing: registered again
    world.bind("m2", "10.0.0.6")  # in sync
    world.bind("m3", "10.0.0.7")  # conflict with the printer
    world.kube.add_claim(ours(name="o1", pool="other"))
    world.kube.add_address(ip_address("o1", "10.0.0.8", pool="other"))
    if cache:
        world.deps.cache = _cached(world)
        world.auditor = Auditor(world.deps)
    return world


def test_the_leaders_audit_lists_nothing_while_the_cache_is_synced() -> None:
    listed, cached = _drifted(cache=False), _drifted(cache=True)
    [by_list], [by_cache] = listed.run(), cached.run()
    assert by_cache.findings == by_list.findings and by_cache.restored == by_list.restored
    assert [f.finding for f in by_cache.findings] == [FindingKind.CONFLICT, FindingKind.ORPHAN]
    assert [f.claim for f in by_cache.restored] == ["ns/m1"]
    assert cached.kube.events == listed.kube.events
    assert cached.ipam.writes() == listed.ipam.writes()
    assert cached.kube.read("list_claims") == cached.kube.read("list_ip_addresses") == []
    assert listed.kube.read("list_claims") and listed.kube.read("list_ip_addresses")


@pytest.mark.parametrize("cache", [False, True], ids=["api", "cache"])
def test_an_entry_of_a_claim_now_another_providers_is_no_orphan(cache: bool) -> None:
    # The claim was recreated with another provider's pool: the cache never holds it.
    world = World([ipam_entry("10.0.0.6", "gone.ns", "ipam-bridge ns/gone")])
    world.ipam.on_entries = [list(world.ipam.entries_), list(world.ipam.entries_)]
    if cache:
        world.deps.cache = _cached(world)
        world.auditor = Auditor(world.deps)
    world.kube.add_claim(claim(name="gone", group="ipam.example.com", kind="OtherPool"))
    [result] = world.run()
    assert result.findings == [] and world.kube.events == []
    assert world.kube.read("get_claim") == (["ns/gone"] if cache else [])


def test_an_unsynced_or_suspect_cache_is_not_read() -> None:
    world = _drifted(cache=True)
    assert world.deps.cache is not None
    cast(Cache, world.deps.cache).addresses.suspect()
    [result] = world.run()
    assert [f.finding for f in result.findings] == [FindingKind.CONFLICT, FindingKind.ORPHAN]
    assert world.kube.read("list_ip_addresses") == ["ns"] and world.kube.read("list_claims")


@pytest.mark.parametrize("cache", [False, True], ids=["api", "cache"])
def test_a_survey_types_only_the_pools_addresses_and_the_claims_they_name(
    cache: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = _drifted(cache)
    for i in range(20):  # another pool's objects in the same namespace
        world.kube.add_claim(ours(name=f"x{i}", pool="other"))
        world.kube.add_address(ip_address(f"x{i}", f"10.0.1.{i}", pool="other"))
    if cache:
        world.deps.cache = _cached(world)
        world.auditor = Auditor(world.deps)
    typed: dict[str, list[str]] = {"addresses": [], "claims": []}

    def spy(name: str, real: Any) -> Any:  # records the names of the objects given to the typing
        def typing(bodies: Any) -> Any:
            given = list(bodies)
            typed[name] += sorted(b["metadata"]["name"] for b in given)
            return real(given)

        return typing

    survey_module = importlib.import_module("bridge.reconcilers.audit.survey")
    monkeypatch.setattr(
        survey_module, "typed_addresses", spy("addresses", survey_module.typed_addresses)
    )
    monkeypatch.setattr(survey_module, "typed_claims", spy("claims", survey_module.typed_claims))
    [result] = world.run()
    assert typed["addresses"] == ["m1", "m2", "m3"]
    # The IPAddresses' claims, and the claims the entries name (m2; "gone" does not exist).
    assert typed["claims"] == ["m1", "m2", "m3"]
    assert [f.finding for f in result.findings] == [FindingKind.CONFLICT, FindingKind.ORPHAN]


# -- owners: one IPAM, many management clusters --------------------------------------------

HERE, THERE = "3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f", "a-second-cluster"


def test_another_clusters_entries_are_never_orphans_nor_a_hostname_elsewhere() -> None:
    entries = [
        # Same names in both clusters (no hostnameSuffix): ns/gone exists only over there.
        ipam_entry("10.0.0.5", "gone.ns", "x", owner=EntryOwner(THERE, "ns/gone")),
        ipam_entry("10.0.0.7", "m1.ns", "x", owner=EntryOwner(THERE, "ns/m1")),
        ipam_entry("10.0.0.2", "m1.ns", "x", owner=EntryOwner(HERE, "ns/m1")),
        ipam_entry("10.0.0.6", "old.ns", "x", owner=EntryOwner(HERE, "ns/old")),
        ipam_entry("10.0.0.8", "prev.ns", "ipam-bridge ns/prev", owner=EntryOwner("", "ns/prev")),
    ]
    addresses = [ip_address("m1", "10.0.0.2")]

    findings = compare(the_pool(), entries, addresses, [ours(name="m1")], cluster_id=HERE)

    assert [(f.finding, f.claim) for f in findings] == [
        (FindingKind.ORPHAN, "ns/old"),  # this cluster's
        (FindingKind.ORPHAN, "ns/prev"),  # the previous release's: this cluster's too
    ]
    assert audit.owner_counts(entries, HERE) == {HERE: 2, THERE: 2, "": 1}
    # Seen from the other cluster, the roles swap.
    there = compare(the_pool(), entries, [], [], cluster_id=THERE)
    assert sorted(f.claim for f in there) == ["ns/gone", "ns/m1", "ns/prev"]


def test_in_sync_names_the_entries_of_other_owners() -> None:
    owners = {HERE: 4, THERE: 3, "": 1}
    condition = audit.in_sync_condition([], owners=owners, cluster_id=HERE)
    assert condition["status"] == "True"
    assert condition["message"] == (
        "the pool's IPAddresses match its IPAM entries; entries by owner: 4 of this cluster, "
        f"1 of the previous release, 3 of cluster {THERE}"
    )
    alone = audit.in_sync_condition([], owners={HERE: 4}, cluster_id=HERE)
    assert alone["message"] == "the pool's IPAddresses match its IPAM entries"


def test_a_repair_writes_this_clusters_owner_and_never_takes_another_owners_entry() -> None:
    world = World()
    world.deps.cluster_id = HERE
    world.auditor = Auditor(world.deps)
    world.bind("m1", "10.0.0.5")
    [result] = world.run()
    assert [f.address for f in result.restored] == ["10.0.0.5"]
    assert world.ipam.entries_[0].owner == EntryOwner(HERE, "ns/m1")
    assert world.ipam.writes() == [("allocate", "m1.ns", f"ipam-bridge {HERE} ns/m1", "10.0.0.5")]

    # The same hostname (no hostnameSuffix) holds another cluster's entry: a conflict naming
    # that owner; nothing is registered or changed.
    theirs = ipam_entry("10.0.0.9", "m1.ns", "x", owner=EntryOwner(THERE, "ns/m1"))
    world = World([theirs])
    world.deps.cluster_id = HERE
    world.auditor = Auditor(world.deps)
    world.bind("m1", "10.0.0.5")
    [result] = world.run()
    [conflict] = result.findings
    assert conflict.finding == FindingKind.CONFLICT and result.restored == []
    assert f"claim ns/m1 of management cluster {THERE}" in conflict.message
    assert world.ipam.entries_ == [theirs]  # untouched
