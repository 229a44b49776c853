"""One IPAM, two management clusters (issue 36): every entry names its owner; no address twice.

Two emulated API servers, each with the real operator running (clusters ``a`` and ``b``,
shared by the tests of this module: each test works in namespaces of its own), and ONE mock
IPAM per backend, phpIPAM and Infoblox, on 127.0.0.1. The two clusters use the same
namespace, pool and claim names and no ``hostnameSuffix``, as a platform team that forgot it:

- 0 addresses held by two claims: the second cluster's claims wait, Ready=False
  ``HostnameTaken``, with a Warning Event naming the owner and the fix;
- the first cluster's releases leave the second's entries alone;
- inside one cluster, a hostname met across pools (claim ``m1`` of namespace ``prod`` on a
  pool with suffix ``lab``; claim ``m1.prod`` of namespace ``lab`` on a pool without one) is
  refused the same way;
- ``clusterctl move`` from one cluster to the other (as clusterctl v1.14 does it:
  `moving.clusterctl_move`) keeps every address, creates and deletes no IPAM entry; the target
  writes itself as the owner and releases the entries later;
- entries of the previous release (``ipam-bridge <ns>/<claim>``, no cluster id) are kept, and
  their owner is upgraded on the next write.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from integration_env import CREDENTIALS, INFOBLOX_SEED, PHPIPAM_SEED
from moving import PHPIPAM_MOVE as MOVE
from moving import cluster_id, clusterctl_move

from backends.base import EntryOwner, parse_owner
from bridge.capi import GROUP
from mock_infoblox.server import MockInfobloxServer
from mock_infoblox.store import InfobloxStore
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

SUBNET = "10.20.0.0/24"
CLUSTERS = "cluster.x-k8s.io/v1beta2"
PHPIPAM_SUBNET_ID = 7

#: ``{hostname: (address, the IPAM's id of the entry, owner)}`` of the IPAM's entries.
Entries = dict[str, tuple[str, str, EntryOwner | None]]


def _phpipam_owner(values: dict[str, Any]) -> EntryOwner | None:
    """Return the owner a phpIPAM row names: its ``note``, else ``owner``, else description."""
    for column in ("note", "owner", "description"):
        owner = parse_owner(str(values.get(column) or ""))
        if owner is not None:
            return owner
    return None


@dataclass
class Ipam:
    """One mock IPAM as the tests see it, whichever backend it is."""

    kind: str
    server: Any

    def pool(self, sandbox: Sandbox, namespace: str, name: str = "pool", **spec: Any) -> None:
        """Create a pool of this IPAM's kind on `SUBNET` in ``namespace`` and wait until Ready."""
        sandbox.namespace(namespace)
        if self.kind == "PHPIPAMIPPool":
            sandbox.phpipam_pool(
                namespace,
                name,
                endpoint=self.server.url,
                subnet_id=PHPIPAM_SUBNET_ID,
                credentials=CREDENTIALS,
                **spec,
            )
        else:
            sandbox.infoblox_pool(
                namespace, name, endpoint=self.server.url, subnet=SUBNET, credentials=CREDENTIALS
            )
        sandbox.wait_pool_ready(namespace, name, self.kind)

    def entries(self) -> Entries:
        """Return every entry of `SUBNET` registered under a hostname (the gateway's aside)."""
        if self.kind == "PHPIPAMIPPool":
            return {
                str(a.hostname): (str(a.ip), str(a.id), _phpipam_owner(a.values))
                for a in self.server.store.subnet_addresses(PHPIPAM_SUBNET_ID)
                if a.hostname and not a.is_gateway
            }
        found: Entries = {}
        for host in self.server.store.records(type_name="record:host"):
            for address in host.get("ipv4addrs") or []:
                found[str(host["name"])] = (
                    str(address["ipv4addr"]),
                    str(host["_ref"]).partition(":")[0],
                    parse_owner(host.get("comment")),
                )
        return found

    def as_previous_release(self, hostname: str, claim: str) -> None:
        """Rewrite an entry as the previous release wrote it: ``ipam-bridge <claim>``, no id."""
        text = f"ipam-bridge {claim}"
        if self.kind == "PHPIPAMIPPool":
            address = self.entries()[hostname][0]
            self.server.store.edit_address(
                address,
                {"description": text, "note": "", "owner": ""},
                subnet_id=PHPIPAM_SUBNET_ID,
            )
        else:
            self.server.store.edit_record(
                {"type": "record:host", "name": hostname}, {"comment": text, "extattrs": {}}
            )


@pytest.fixture(scope="module")
def phpipam_ipam() -> Iterator[Ipam]:
    with MockPhpipamServer(Store(copy.deepcopy(PHPIPAM_SEED))) as server:
        yield Ipam("PHPIPAMIPPool", server)


@pytest.fixture(scope="module")
def infoblox_ipam() -> Iterator[Ipam]:
    with MockInfobloxServer(InfobloxStore.from_seed(copy.deepcopy(INFOBLOX_SEED))) as server:
        yield Ipam("InfobloxIPPool", server)


@pytest.fixture(params=["phpipam", "infoblox"])
def ipam(request: pytest.FixtureRequest) -> Ipam:
    """Each mock IPAM in turn (the one of its backend, shared by the module)."""
    found: Ipam = request.getfixturevalue(f"{request.param}_ipam")
    return found


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[Sandbox, Sandbox]]:
    """Two management clusters (emulated API servers), each with its own operator."""
    with Sandbox() as a, Sandbox() as b:
        assert cluster_id(a) != cluster_id(b)  # no configuration: two identities
        yield a, b


def held(**sandboxes: Sandbox) -> dict[str, str]:
    """Return ``{"<cluster>/<ns>/<claim>": address}`` of every IPAddress; fail on one held twice.

    ``sandboxes`` are the clusters by label (``a=..., b=...``).
    """
    seen: dict[str, str] = {}
    for label, sandbox in sandboxes.items():
        for address in sandbox.addresses():
            meta, spec = address["metadata"], address["spec"]
            key = f"{label}/{meta['namespace']}/{spec['claimRef']['name']}"
            assert spec["address"] not in seen.values(), f"{spec['address']} is held twice"
            seen[key] = spec["address"]
    return seen


def taken_events(sandbox: Sandbox, namespace: str, claim: str) -> list[dict[str, Any]]:
    """Return the Warning ``HostnameTaken`` Events about a claim."""
    return [
        e
        for e in sandbox.events(namespace)
        if e.get("reason") == "HostnameTaken"
        and e.get("type") == "Warning"
        and e["involvedObject"]["name"] == claim
    ]


def message_of(claim: dict[str, Any]) -> str:
    """Return the message of a (v1beta2) claim's Ready condition."""
    for condition in (claim.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return str(condition.get("message") or "")
    return ""


def wait_bound(sandbox: Sandbox, namespace: str, names: list[str]) -> dict[str, str]:
    """Wait until the claims ``names`` are bound; return ``{claim: address}``."""
    bound = sandbox.wait_claims_bound(namespace, len(names), timeout=30)
    assert sorted(c["metadata"]["name"] for c in bound) == sorted(names)
    return {
        a["spec"]["claimRef"]["name"]: a["spec"]["address"] for a in sandbox.addresses(namespace)
    }


# -- two clusters, the same names, no suffix ---------------------------------------------------


def test_two_clusters_with_the_same_names_never_share_an_address(
    clusters: tuple[Sandbox, Sandbox], ipam: Ipam
) -> None:
    a, b = clusters
    ns = f"same-{ipam.kind.lower()[:3]}"
    names = ["m0", "m1"]
    for sandbox in (a, b):
        ipam.pool(sandbox, ns)
    for name in names:
        a.claim(ns, name, "pool", kind=ipam.kind)
    first = wait_bound(a, ns, names)
    owner_a, owner_b = cluster_id(a), cluster_id(b)
    entries = ipam.entries()
    for name in names:
        assert entries[f"{name}.{ns}"][0] == first[name]
        assert entries[f"{name}.{ns}"][2] == EntryOwner(owner_a, f"{ns}/{name}")

    # The second cluster: the same claims are refused, with the reason, the owner and the fix.
    for name in names:
        b.claim(ns, name, "pool", kind=ipam.kind)
    for name in names:
        refused = b.wait_claim_reason(ns, name, "HostnameTaken", timeout=30)
        message = message_of(refused)
        for part in (f"{name}.{ns}", first[name], owner_a, f"{ns}/{name}", "hostnameSuffix"):
            assert part in message, (part, message)
        wait_for(lambda n=name: taken_events(b, ns, n), timeout=10, message="the Event")
    assert b.addresses(ns) == []
    held(a=a, b=b)  # 0 addresses held by two claims
    assert ipam.entries() == entries  # nothing of the first cluster's changed

    # The first cluster's claims go: its releases free its own entries only; the second's
    # waiting claims then get addresses of their own (they look again every 2 s here).
    for name in names:
        a.delete_claim(ns, name)
    second = wait_bound(b, ns, names)
    held(a=a, b=b)
    entries = ipam.entries()
    for name in names:
        assert entries[f"{name}.{ns}"][:1] == (second[name],)
        assert entries[f"{name}.{ns}"][2] == EntryOwner(owner_b, f"{ns}/{name}")

    # Now the first cluster asks again, is refused, and lets go: the second's entries stay.
    for name in names:
        a.claim(ns, name, "pool", kind=ipam.kind)
    for name in names:
        a.wait_claim_reason(ns, name, "HostnameTaken", timeout=30)
        a.delete_claim(ns, name)
    wait_for(lambda: a.claims(ns) == [], timeout=30, message="the first cluster's claims gone")
    assert ipam.entries() == entries  # the release by hostname left them alone
    mine = {k: v for k, v in held(b=b).items() if k.startswith(f"b/{ns}/")}
    assert mine == {f"b/{ns}/{name}": second[name] for name in names}

    for name in names:
        b.delete_claim(ns, name)
    b.wait_gone(ns, timeout=30)
    assert not [h for h in ipam.entries() if h.endswith(f".{ns}")]


def test_a_hostname_met_across_pools_of_one_cluster_is_refused(
    clusters: tuple[Sandbox, Sandbox], phpipam_ipam: Ipam
) -> None:
    a, _ = clusters
    phpipam_ipam.pool(a, "prod", "suffixed", hostnameSuffix="lab")
    phpipam_ipam.pool(a, "lab", "plain")
    a.claim("prod", "m1", "suffixed")  # m1.prod.lab
    (first,) = wait_bound(a, "prod", ["m1"]).values()
    a.claim("lab", "m1.prod", "plain")  # m1.prod + (no suffix) = m1.prod.lab as well
    refused = a.wait_claim_reason("lab", "m1.prod", "HostnameTaken", timeout=30)
    message = message_of(refused)
    assert "m1.prod.lab" in message and first in message and "claim prod/m1 " in message
    assert a.addresses("lab") == []
    owner = phpipam_ipam.entries()["m1.prod.lab"][2]
    assert owner == EntryOwner(cluster_id(a), "prod/m1")
    for namespace, name in (("lab", "m1.prod"), ("prod", "m1")):
        a.delete_claim(namespace, name)
    for namespace in ("lab", "prod"):
        a.wait_gone(namespace, timeout=30)
    assert "m1.prod.lab" not in phpipam_ipam.entries()


# -- clusterctl move ---------------------------------------------------------------------------


def test_clusterctl_move_to_the_other_cluster_keeps_every_address(
    clusters: tuple[Sandbox, Sandbox], ipam: Ipam
) -> None:
    a, b = clusters
    ns = f"move-{ipam.kind.lower()[:3]}"
    names = ["n0", "n1"]
    ipam.pool(a, ns)
    a.create(
        {"apiVersion": CLUSTERS, "kind": "Cluster", "metadata": {"name": "c1", "namespace": ns}}
    )
    for name in names:
        a.claim(ns, name, "pool", kind=ipam.kind, cluster="c1")
    before = wait_bound(a, ns, names)
    entries = ipam.entries()
    b.namespace(ns)

    # clusterctl move: pause the Cluster; copy the Cluster, the Secret, the pool, the claims
    # and their IPAddresses (owners first); annotate, delete and strip them at the source,
    # whose operator still runs; unpause the Cluster in the target.
    a.kube.patch(CLUSTERS, "clusters", "c1", {"spec": {"paused": True}}, ns)
    plural = "phpipamippools" if ipam.kind == "PHPIPAMIPPool" else "infobloxippools"
    kinds = [(f"{GROUP}/v1alpha1", plural) if p == "phpipamippools" else (v, p) for v, p in MOVE]
    assert a.version == "v1beta2"  # the version of PHPIPAM_MOVE's claims
    clusterctl_move(a, b, [(CLUSTERS, "clusters"), *kinds], namespace=ns)
    a.wait_gone(ns, timeout=30)  # released nothing: each carried delete-for-move
    b.kube.patch(CLUSTERS, "clusters", "c1", {"spec": {"paused": False}}, ns)
    assert wait_bound(b, ns, names) == before
    # No entry created or deleted (the same ids); the target wrote itself as their owner.
    wait_for(
        lambda: all(
            ipam.entries()[f"{n}.{ns}"][2] == EntryOwner(cluster_id(b), f"{ns}/{n}") for n in names
        ),
        timeout=10,
        message="the owners rewritten",
    )
    after = ipam.entries()
    assert {h: e[:2] for h, e in after.items()} == {h: e[:2] for h, e in entries.items()}

    for name in names:  # the target releases them
        b.delete_claim(ns, name)
    b.wait_gone(ns, timeout=30)
    assert not [h for h in ipam.entries() if h.endswith(f".{ns}")]


# -- the upgrade from the previous release -----------------------------------------------------


def test_entries_of_the_previous_release_are_kept_and_upgraded_on_the_next_write(
    make_sandbox: Callable[..., Sandbox], ipam: Ipam
) -> None:
    sandbox = make_sandbox()
    ns = f"upgrade-{ipam.kind.lower()[:3]}"
    ipam.pool(sandbox, ns)
    for name in ("u0", "u1"):
        sandbox.claim(ns, name, "pool", kind=ipam.kind)
    bound = wait_bound(sandbox, ns, ["u0", "u1"])
    sandbox.stop_operator()
    # As the previous release left them: its entries carry no cluster id; u2's entry was
    # registered but the release stopped before its IPAddress (a crash, an upgrade).
    for name in ("u0", "u1"):
        ipam.as_previous_release(f"{name}.{ns}", f"{ns}/{name}")
    sandbox.claim(ns, "u2", "pool", kind=ipam.kind)
    legacy = "10.20.0.200"
    if ipam.kind == "PHPIPAMIPPool":
        ipam.server.store.add_address(
            PHPIPAM_SUBNET_ID, legacy, hostname=f"u2.{ns}", description=f"ipam-bridge {ns}/u2"
        )
    else:
        ipam.server.store.add_record(
            {
                "type": "record:host",
                "name": f"u2.{ns}",
                "address": legacy,
                "comment": f"ipam-bridge {ns}/u2",
            }
        )
    before = ipam.entries()
    assert before[f"u0.{ns}"][2] == EntryOwner("", f"{ns}/u0")
    if ipam.kind == "PHPIPAMIPPool":
        ipam.server.store.clear_journal()

    sandbox.start_operator()
    after = wait_bound(sandbox, ns, ["u0", "u1", "u2"])
    if ipam.kind == "PHPIPAMIPPool":  # the bound claims cost no IPAM request at all
        paths = [e.path for e in ipam.server.store.requests()]
        assert not [p for p in paths if f"u0.{ns}" in p or f"u1.{ns}" in p], paths
        assert [p for p in paths if f"u2.{ns}" in p]  # the adopted one was searched
    assert after == {**bound, "u2": legacy}  # every entry kept, none allocated again
    entries = ipam.entries()
    me = cluster_id(sandbox)
    # u2's entry was written (adopted, its owner upgraded); u0 and u1 are bound and not touched.
    assert entries[f"u2.{ns}"][:2] == before[f"u2.{ns}"][:2]
    assert entries[f"u2.{ns}"][2] == EntryOwner(me, f"{ns}/u2")
    for name in ("u0", "u1"):
        assert entries[f"{name}.{ns}"] == before[f"{name}.{ns}"]
    assert ipaddress.ip_address(legacy) in ipaddress.ip_network(SUBNET)

    for name in ("u0", "u1", "u2"):  # the previous release's entries are released too
        sandbox.delete_claim(ns, name)
    sandbox.wait_gone(ns, timeout=30)
    assert not [h for h in ipam.entries() if h.endswith(f".{ns}")]
