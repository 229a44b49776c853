"""The real operator with InfobloxIPPools against the WAPI mock over HTTP on 127.0.0.1."""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from integration_env import CREDENTIALS, NAMESPACE
from moving import cluster_id

import bridge.operator as operator_module
from backends.base import parse_owner
from bridge.capi import (
    ADDRESS_FINALIZER,
    CLAIM_FINALIZER,
    CLUSTER_NAME_LABEL,
    GROUP,
    HOSTNAME_ANNOTATION,
)
from bridge.reconcilers.claims import ClaimDeps, reconcile_claim
from bridge.runtime.workqueue import Result
from mock_infoblox.server import MockInfobloxServer
from mock_infoblox.store import NON_DNS_VIEW, InfobloxStore, SearchFilter
from mock_kubernetes.sandbox import Sandbox, wait_for

__all__: list[str] = []

KIND = "InfobloxIPPool"
ZERO_MAC = "00:00:00:00:00:00"
V4_NET = "10.20.0.0/24"
V4_GATEWAY = "10.20.0.1"
TINY_NET = "10.20.1.0/30"
V6_NET = "2001:db8:20::/64"
ZONE = "nodes.example.com"


# ------------------------------------------------------------------------------ helpers


@dataclass(frozen=True)
class WapiCall:
    """One store operation a WAPI request ended in."""

    op: str  # create | update | delete | search
    type_name: str
    names: tuple[str, ...] = ()
    ok: bool = True


class WapiJournal:
    """Record the WAPI operations that reach a mock store (installed by wrapping its methods).

    The WAPI mock keeps no request journal; every POST, PUT, DELETE and GET it serves ends
    in the store's ``create``, ``update``, ``delete`` or ``search``, so those are counted.
    """

    def __init__(self, store: InfobloxStore) -> None:
        self._lock = threading.Lock()
        self.calls: list[WapiCall] = []
        create, update, delete, search = store.create, store.update, store.delete, store.search

        def _record(call: WapiCall) -> None:
            with self._lock:
                self.calls.append(call)

        def _run(call: WapiCall, fn: Callable[[], Any]) -> Any:
            try:
                result = fn()
            except Exception:
                _record(WapiCall(call.op, call.type_name, call.names, ok=False))
                raise
            _record(call)
            return result

        def wrapped_create(type_name: str, body: Mapping[str, Any]) -> dict[str, Any]:
            call = WapiCall("create", type_name, (str(body.get("name", "")),))
            return dict(_run(call, lambda: create(type_name, body)))

        def wrapped_update(ref: str, body: Mapping[str, Any]) -> dict[str, Any]:
            call = WapiCall("update", ref.partition("/")[0], (ref,))
            return dict(_run(call, lambda: update(ref, body)))

        def wrapped_delete(ref: str) -> str:
            call = WapiCall("delete", ref.partition("/")[0], (ref,))
            return str(_run(call, lambda: delete(ref)))

        def wrapped_search(
            type_name: str, filters: Iterable[SearchFilter]
        ) -> Iterator[dict[str, Any]]:
            filters = list(filters)
            names = tuple(v for f in filters if f.field == "name" for v in f.values)
            _record(WapiCall("search", type_name, names))
            return search(type_name, filters)

        store.create = wrapped_create  # type: ignore[method-assign]
        store.update = wrapped_update  # type: ignore[method-assign]
        store.delete = wrapped_delete  # type: ignore[method-assign]
        store.search = wrapped_search  # type: ignore[method-assign]

    def snapshot(self) -> list[WapiCall]:
        """Return a copy of the calls so far."""
        with self._lock:
            return list(self.calls)

    def clear(self) -> None:
        """Forget the calls so far."""
        with self._lock:
            self.calls.clear()

    def writes(self) -> list[WapiCall]:
        """Return the POST/PUT/DELETE operations (successful or not)."""
        return [c for c in self.snapshot() if c.op in ("create", "update", "delete")]

    def naming(self, names: Iterable[str]) -> list[WapiCall]:
        """Return the operations whose request named one of ``names``."""
        wanted = set(names)
        return [c for c in self.snapshot() if wanted.intersection(c.names)]


def objects(server: MockInfobloxServer, type_name: str) -> list[dict[str, Any]]:
    """Return the mock grid's objects of one WAPI type (full objects)."""
    found: list[dict[str, Any]] = server.store.dump()["objects"].get(type_name, [])
    return found


def host_ips(record: Mapping[str, Any]) -> list[str]:
    """Return every address of a ``record:host`` (IPv4 and IPv6), normalised."""
    return [
        str(ipaddress.ip_address(item.get("ipv4addr") or item.get("ipv6addr")))
        for key in ("ipv4addrs", "ipv6addrs")
        for item in record.get(key) or []
    ]


def by_name(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Index records by ``name``; fail on duplicate names."""
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        assert record["name"] not in out, f"two records named {record['name']}"
        out[record["name"]] = dict(record)
    return out


def address_map(sandbox: Sandbox) -> dict[str, str]:
    """Return ``{IPAddress name: spec.address}`` in `NAMESPACE`."""
    return {a["metadata"]["name"]: a["spec"]["address"] for a in sandbox.addresses(NAMESPACE)}


def ready_pool(
    sandbox: Sandbox, server: MockInfobloxServer, name: str, subnet: str, **spec: Any
) -> dict[str, Any]:
    """Create an InfobloxIPPool with the test credentials and wait until it is Ready."""
    sandbox.infoblox_pool(
        NAMESPACE, name, endpoint=server.url, subnet=subnet, credentials=CREDENTIALS, **spec
    )
    return sandbox.wait_pool_ready(NAMESPACE, name, KIND)


def claim_message(claim: Mapping[str, Any]) -> str:
    """Return the message of a (v1beta2) claim's Ready condition."""
    for condition in (claim.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return str(condition.get("message") or "")
    return ""


def pool_condition(sandbox: Sandbox, name: str) -> dict[str, Any]:
    """Return the Ready condition of a pool in `NAMESPACE` (empty when none yet)."""
    pool = sandbox.pool(NAMESPACE, name, KIND) or {}
    for condition in (pool.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return dict(condition)
    return {}


def events_for(sandbox: Sandbox, name: str) -> list[dict[str, Any]]:
    """Return the Events of the object named ``name`` in `NAMESPACE`."""
    return [
        e for e in sandbox.events(NAMESPACE) if (e.get("involvedObject") or {}).get("name") == name
    ]


def wait_bound(sandbox: Sandbox, name: str, *, timeout: float = 30.0) -> dict[str, Any]:
    """Wait until the claim ``name`` has ``status.addressRef`` and Ready True; return it."""

    def bound() -> dict[str, Any] | None:
        claim = sandbox.get_claim(NAMESPACE, name)
        if (
            claim
            and (claim.get("status") or {}).get("addressRef")
            and (sandbox.ready(claim)[0] == "True")
        ):
            return claim
        return None

    return dict(wait_for(bound, timeout=timeout, message=f"claim {name} bound"))


def pool_used(sandbox: Sandbox, name: str) -> int | None:
    """Return ``status.ipAddresses.used`` of a pool (None before the first check)."""
    status = (sandbox.pool(NAMESPACE, name, KIND) or {}).get("status") or {}
    used = (status.get("ipAddresses") or {}).get("used")
    return None if used is None else int(used)


# ------------------------------------------------------------------------ allocation


def test_fifty_claims_get_distinct_first_free_addresses_and_are_released(
    infoblox: MockInfobloxServer, sandbox: Sandbox
) -> None:
    # A DHCP range in the middle of the network: next-available-IP never offers it.
    dhcp_first, dhcp_last = ipaddress.ip_address("10.20.0.10"), ipaddress.ip_address("10.20.0.29")
    infoblox.store.seed(
        {
            "ranges": [
                {
                    "start_addr": str(dhcp_first),
                    "end_addr": str(dhcp_last),
                    "network": V4_NET,
                    "server_association_type": "MEMBER",
                }
            ]
        }
    )
    pool = ready_pool(sandbox, infoblox, "pool", V4_NET)
    assert pool["status"]["subnet"] == V4_NET
    assert pool["status"]["prefix"] == 24
    assert pool["status"]["gateway"] == V4_GATEWAY
    assert pool["status"]["ipAddresses"]["total"] == 254

    names = [f"m{i:02d}" for i in range(50)]
    for name in names:
        sandbox.claim(NAMESPACE, name, "pool", kind=KIND)
    claims = sandbox.wait_claims_bound(NAMESPACE, 50, timeout=60)

    network = ipaddress.ip_network(V4_NET)
    forbidden = {
        network.network_address,
        network.broadcast_address,
        ipaddress.ip_address(V4_GATEWAY),
    }
    forbidden |= {ipaddress.ip_address(i) for i in range(int(dhcp_first), int(dhcp_last) + 1)}
    first_free = [str(ip) for ip in network.hosts() if ip not in forbidden][:50]

    addresses = {a["metadata"]["name"]: a for a in sandbox.addresses(NAMESPACE)}
    assert sorted(addresses) == names
    handed_out = [a["spec"]["address"] for a in addresses.values()]
    assert len(set(handed_out)) == 50
    assert set(handed_out) == set(first_free)
    assert not {ipaddress.ip_address(ip) for ip in handed_out} & forbidden

    pool_uid = sandbox.pool(NAMESPACE, "pool", KIND)["metadata"]["uid"]  # type: ignore[index]
    for claim in claims:
        name = claim["metadata"]["name"]
        assert claim["status"]["addressRef"] == {"name": name}
        assert sandbox.ready(claim) == ("True", "AddressAllocated")
        assert CLAIM_FINALIZER in claim["metadata"]["finalizers"]
        address = addresses[name]
        assert address["spec"]["prefix"] == 24
        assert address["spec"]["gateway"] == V4_GATEWAY
        assert address["spec"]["claimRef"] == {"name": name}
        assert address["spec"]["poolRef"] == {"apiGroup": GROUP, "kind": KIND, "name": "pool"}
        assert address["metadata"]["finalizers"] == [ADDRESS_FINALIZER]
        assert address["metadata"]["annotations"][HOSTNAME_ANNOTATION] == f"{name}.{NAMESPACE}"
        owners = {
            (o["kind"], o["name"], o["uid"], o["controller"], o["blockOwnerDeletion"])
            for o in address["metadata"]["ownerReferences"]
        }
        assert owners == {
            ("IPAddressClaim", name, claim["metadata"]["uid"], True, True),
            (KIND, "pool", pool_uid, False, True),
        }

    # The grid holds one host record per claim, outside DNS, with the IPAddress's address.
    records = by_name(objects(infoblox, "record:host"))
    assert set(records) == {f"{n}.{NAMESPACE}" for n in names}
    for name in names:
        record = records[f"{name}.{NAMESPACE}"]
        assert host_ips(record) == [addresses[name]["spec"]["address"]]
        assert record["configure_for_dns"] is False
        assert record["view"] == NON_DNS_VIEW
        assert record["network_view"] == "default"
        # The owner: this management cluster (the uid of its kube-system) and the claim.
        assert record["comment"] == f"ipam-bridge {cluster_id(sandbox)} {NAMESPACE}/{name}"
    assert objects(infoblox, "fixedaddress") == []

    # The pool's refreshed status counts them, the gateway and the 20 addresses of the DHCP
    # range (next-available-IP never hands those out).
    wait_for(lambda: pool_used(sandbox, "pool") == 71, timeout=30, message="pool used == 71")

    for name in names:
        sandbox.delete_claim(NAMESPACE, name)
    sandbox.wait_gone(NAMESPACE, timeout=60)
    assert objects(infoblox, "record:host") == []
    wait_for(lambda: pool_used(sandbox, "pool") == 21, timeout=30, message="pool used == 21")


def test_exhausted_network_recovers_after_a_deletion(
    infoblox: MockInfobloxServer, sandbox: Sandbox
) -> None:
    pool = ready_pool(sandbox, infoblox, "tiny", TINY_NET)
    assert pool["status"]["ipAddresses"]["total"] == 2
    sandbox.claim(NAMESPACE, "a", "tiny", kind=KIND)
    sandbox.claim(NAMESPACE, "b", "tiny", kind=KIND)
    sandbox.wait_claims_bound(NAMESPACE, 2)
    first = address_map(sandbox)
    assert sorted(first.values()) == ["10.20.1.1", "10.20.1.2"]

    sandbox.claim(NAMESPACE, "c", "tiny", kind=KIND)
    claim = sandbox.wait_claim_reason(NAMESPACE, "c", "PoolExhausted")
    assert sandbox.ready(claim)[0] == "False"
    assert "tiny" in claim_message(claim)
    assert not (claim.get("status") or {}).get("addressRef")
    wait_for(  # Events are posted in the background, after the status they tell of
        lambda: any(
            e["reason"] == "PoolExhausted" and e["type"] == "Warning"
            for e in events_for(sandbox, "c")
        ),
        message="the PoolExhausted Event",
    )
    assert sorted(r["name"] for r in objects(infoblox, "record:host")) == ["a.test", "b.test"]
    assert "c" not in address_map(sandbox)

    sandbox.delete_claim(NAMESPACE, "a")
    wait_bound(sandbox, "c", timeout=30)
    assert sandbox.get_claim(NAMESPACE, "a") is None
    after = address_map(sandbox)
    assert after == {"b": first["b"], "c": first["a"]}
    records = by_name(objects(infoblox, "record:host"))
    assert sorted(records) == ["b.test", "c.test"]
    assert host_ips(records["c.test"]) == [first["a"]]


# -------------------------------------------------------------------- record shapes


@pytest.mark.parametrize(
    ("dns_zone", "dns_view", "record_name", "record_view"),
    [
        (None, None, "m1.test", NON_DNS_VIEW),
        (ZONE, None, f"m1.test.{ZONE}", "default"),
        (ZONE, "internal", f"m1.test.{ZONE}", "internal"),
    ],
    ids=["no-dns", "zone-default-view", "zone-and-view"],
)
def test_host_record_name_and_dns_view(
    infoblox: MockInfobloxServer,
    sandbox: Sandbox,
    dns_zone: str | None,
    dns_view: str | None,
    record_name: str,
    record_view: str,
) -> None:
    infoblox.store.seed({"dns_views": ["internal"], "zones": [{"fqdn": ZONE, "view": "internal"}]})
    spec: dict[str, Any] = {}
    if dns_zone:
        spec["dnsZone"] = dns_zone
    if dns_view:
        spec["dnsView"] = dns_view
    ready_pool(sandbox, infoblox, "pool", V4_NET, **spec)
    sandbox.claim(NAMESPACE, "m1", "pool", kind=KIND)
    sandbox.wait_claims_bound(NAMESPACE, 1)

    (record,) = objects(infoblox, "record:host")
    assert record["name"] == record_name
    assert record["view"] == record_view
    assert record["configure_for_dns"] is bool(dns_zone)
    if dns_zone:
        assert record["zone"] == dns_zone
    assert host_ips(record) == [address_map(sandbox)["m1"]]
    # The key in the IPAM stays <claim>.<namespace>; the zone is only the DNS suffix.
    (address,) = sandbox.addresses(NAMESPACE)
    assert address["metadata"]["annotations"][HOSTNAME_ANNOTATION] == "m1.test"

    sandbox.delete_claim(NAMESPACE, "m1")
    sandbox.wait_gone(NAMESPACE)
    assert objects(infoblox, "record:host") == []


@pytest.mark.parametrize("record_type", ["host", "fixedaddress"])
def test_extensible_attributes_and_provenance_on_every_record(
    infoblox: MockInfobloxServer, sandbox: Sandbox, record_type: str
) -> None:
    infoblox.store.seed({"extensible_attributes": ["Site"]})
    eas = {"Owner": "platform-team", "Site": "fra1"}
    ready_pool(sandbox, infoblox, "pool", V4_NET, recordType=record_type, extensibleAttributes=eas)
    sandbox.apply(
        {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": NAMESPACE},
            "spec": {},
        }
    )
    sandbox.claim(NAMESPACE, "m1", "pool", kind=KIND, cluster="c1")
    sandbox.claim(NAMESPACE, "m2", "pool", kind=KIND, labels={CLUSTER_NAME_LABEL: "c1"})
    sandbox.claim(NAMESPACE, "m3", "pool", kind=KIND)
    sandbox.wait_claims_bound(NAMESPACE, 3)
    addresses = address_map(sandbox)

    wapi_type, other = (
        ("record:host", "fixedaddress")
        if record_type == "host"
        else ("fixedaddress", "record:host")
    )
    assert objects(infoblox, other) == []
    records = by_name(objects(infoblox, wapi_type))
    assert sorted(records) == ["m1.test", "m2.test", "m3.test"]
    expected_eas = {k: {"value": v} for k, v in eas.items()}
    for record in records.values():
        assert record["extattrs"] == expected_eas
    me = cluster_id(sandbox)  # the owner: this management cluster and the claim
    for name in ("m1", "m2", "m3"):
        assert records[f"{name}.test"]["comment"] == f"ipam-bridge {me} test/{name}"
    labels = {
        a["metadata"]["name"]: a["metadata"].get("labels") or {}
        for a in sandbox.addresses(NAMESPACE)
    }
    assert labels["m1"] == {CLUSTER_NAME_LABEL: "c1"}
    assert labels["m2"] == {CLUSTER_NAME_LABEL: "c1"}
    assert CLUSTER_NAME_LABEL not in labels["m3"]

    for name in ("m1", "m2", "m3"):
        record = records[f"{name}.test"]
        if record_type == "host":
            assert host_ips(record) == [addresses[name]]
        else:
            assert record["ipv4addr"] == addresses[name]
            assert record["mac"] == ZERO_MAC
            assert record["network"] == V4_NET
            assert record["network_view"] == "default"

    for name in ("m1", "m2", "m3"):
        sandbox.delete_claim(NAMESPACE, name)
    sandbox.wait_gone(NAMESPACE)
    assert objects(infoblox, wapi_type) == []


def test_the_pools_owner_extensible_attribute_names_the_owner(
    infoblox: MockInfobloxServer, sandbox: Sandbox
) -> None:
    infoblox.store.seed({"extensible_attributes": ["CAPI-Owner"]})
    ready_pool(sandbox, infoblox, "pool", V4_NET, ownerExtensibleAttribute="CAPI-Owner")
    sandbox.claim(NAMESPACE, "m1", "pool", kind=KIND)
    sandbox.wait_claims_bound(NAMESPACE, 1)

    [record] = objects(infoblox, "record:host")
    value = record["extattrs"]["CAPI-Owner"]["value"]
    owner = parse_owner(f"ipam-bridge {value}")
    assert owner is not None and owner.claim == "test/m1"
    assert parse_owner(record["comment"]) == owner  # the comment names the same owner


@pytest.mark.parametrize("record_type", ["host", "fixedaddress"])
def test_ipv6_pool(infoblox: MockInfobloxServer, sandbox: Sandbox, record_type: str) -> None:
    pool = ready_pool(sandbox, infoblox, "v6", V6_NET, recordType=record_type)
    assert pool["status"]["subnet"] == V6_NET
    assert pool["status"]["prefix"] == 64
    assert pool["status"].get("gateway") is None
    assert pool["status"]["ipAddresses"]["used"] == 0

    for name in ("v6a", "v6b", "v6c"):
        sandbox.claim(NAMESPACE, name, "v6", kind=KIND)
    sandbox.wait_claims_bound(NAMESPACE, 3)

    network = ipaddress.ip_network(V6_NET)
    addresses = {a["metadata"]["name"]: a for a in sandbox.addresses(NAMESPACE)}
    ips = {name: ipaddress.ip_address(a["spec"]["address"]) for name, a in addresses.items()}
    assert len(set(ips.values())) == 3
    for name, address in addresses.items():
        assert ips[name].version == 6 and ips[name] in network
        assert ips[name] != network.network_address  # subnet-router anycast is never handed out
        assert address["spec"]["prefix"] == 64
        assert "gateway" not in address["spec"]

    if record_type == "host":
        records = by_name(objects(infoblox, "record:host"))
        assert {n: host_ips(records[f"{n}.test"]) for n in ips} == {
            n: [str(ip)] for n, ip in ips.items()
        }
    else:
        records = by_name(objects(infoblox, "ipv6fixedaddress"))
        assert {n: ipaddress.ip_address(records[f"{n}.test"]["ipv6addr"]) for n in ips} == ips
        duids = [r["duid"] for r in records.values()]
        assert len(set(duids)) == 3 and all(duids)

    for name in ips:
        sandbox.delete_claim(NAMESPACE, name)
    sandbox.wait_gone(NAMESPACE)
    assert objects(infoblox, "record:host") == []
    assert objects(infoblox, "ipv6fixedaddress") == []


def test_parallel_claims_never_share_an_address(
    infoblox: MockInfobloxServer, make_sandbox: Callable[..., Sandbox]
) -> None:
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_WORKERS": "8"})
    journal = WapiJournal(infoblox.store)
    ready_pool(sandbox, infoblox, "pool", V4_NET)
    names = [f"p{i:02d}" for i in range(40)]
    start = threading.Barrier(8)

    def create(chunk: list[str]) -> None:
        start.wait(timeout=10)
        for name in chunk:
            sandbox.claim(NAMESPACE, name, "pool", kind=KIND)

    with ThreadPoolExecutor(max_workers=8) as executor:
        for future in [executor.submit(create, names[i::8]) for i in range(8)]:
            future.result()
    sandbox.wait_claims_bound(NAMESPACE, 40, timeout=60)

    addresses = address_map(sandbox)
    assert sorted(addresses) == names
    assert len(set(addresses.values())) == 40
    records = by_name(objects(infoblox, "record:host"))
    assert sorted(records) == sorted(f"{n}.test" for n in names)
    grid_ips = [ip for r in records.values() for ip in host_ips(r)]
    assert len(grid_ips) == 40 and len(set(grid_ips)) == 40
    assert {n: host_ips(records[f"{n}.test"]) for n in names} == {n: [addresses[n]] for n in names}
    created = [c for c in journal.writes() if c.op == "create" and c.ok]
    assert len(created) == 40
    assert not [c for c in journal.writes() if c.op != "create"]


# ------------------------------------------------------------------------ bad input

#: Configuration errors are retried after IPAM_BRIDGE_REQUEUE_CONFIG_ERROR_SECONDS; keep the
#: recovery tests short.
QUICK_RETRY = {"IPAM_BRIDGE_REQUEUE_CONFIG_ERROR_SECONDS": "0.5"}


@pytest.fixture
def quick(make_sandbox: Callable[..., Sandbox]) -> Sandbox:
    """A sandbox whose operator retries configuration errors after 0.5 s."""
    return make_sandbox(settings=QUICK_RETRY)


def _assert_no_secret(sandbox: Sandbox, password: str) -> None:
    blob = json.dumps(
        [
            sandbox.events(NAMESPACE),
            sandbox.claims(NAMESPACE),
            sandbox.kube.list(f"{GROUP}/v1alpha1", "infobloxippools", NAMESPACE),
        ]
    )
    assert password not in blob


def test_wrong_password(infoblox: MockInfobloxServer, quick: Sandbox) -> None:
    sandbox = quick
    wrong = "Wr0ng-pa55word-never-logged"
    sandbox.infoblox_pool(
        NAMESPACE,
        "pool",
        endpoint=infoblox.url,
        subnet=V4_NET,
        credentials={"username": CREDENTIALS["username"], "password": wrong},
    )
    pool = sandbox.wait_pool_ready(NAMESPACE, "pool", KIND, reason="AuthenticationFailed")
    assert sandbox.ready(pool)[0] == "False"
    assert CREDENTIALS["username"] in pool_condition(sandbox, "pool")["message"]
    sandbox.claim(NAMESPACE, "m1", "pool", kind=KIND)
    claim = sandbox.wait_claim_reason(NAMESPACE, "m1", "PoolNotReady")
    assert CREDENTIALS["username"] in claim_message(claim)
    assert "credentials" in claim_message(claim)
    wait_for(
        lambda: any(e["reason"] == "AuthenticationFailed" for e in events_for(sandbox, "pool")),
        message="the AuthenticationFailed Event",
    )
    assert objects(infoblox, "record:host") == []
    assert sandbox.addresses(NAMESPACE) == []
    _assert_no_secret(sandbox, wrong)


def test_unknown_network(infoblox: MockInfobloxServer, quick: Sandbox) -> None:
    sandbox = quick
    sandbox.infoblox_pool(
        NAMESPACE, "pool", endpoint=infoblox.url, subnet="10.99.0.0/24", credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "pool", KIND, reason="SubnetNotFound")
    assert "10.99.0.0/24" in pool_condition(sandbox, "pool")["message"]
    sandbox.claim(NAMESPACE, "m1", "pool", kind=KIND)
    claim = sandbox.wait_claim_reason(NAMESPACE, "m1", "PoolNotReady")
    assert "10.99.0.0/24" in claim_message(claim)
    assert objects(infoblox, "record:host") == []
    assert sandbox.addresses(NAMESPACE) == []


def test_unknown_extensible_attribute_then_defined(
    infoblox: MockInfobloxServer, quick: Sandbox
) -> None:
    sandbox = quick
    journal = WapiJournal(infoblox.store)
    ready_pool(sandbox, infoblox, "pool", V4_NET, extensibleAttributes={"CostCenter": "42"})
    sandbox.claim(NAMESPACE, "m1", "pool", kind=KIND)
    claim = sandbox.wait_claim_reason(NAMESPACE, "m1", "PoolNotReady")
    assert sandbox.ready(claim)[0] == "False"
    assert "CostCenter" in claim_message(claim)
    wait_for(
        lambda: any(
            e["type"] == "Warning" and "CostCenter" in e["message"]
            for e in events_for(sandbox, "m1")
        ),
        message="the Warning naming CostCenter",
    )
    assert objects(infoblox, "record:host") == []
    assert sandbox.addresses(NAMESPACE) == []
    assert [c.ok for c in journal.writes()] == [False] * len(journal.writes())

    # A person defines the attribute in the grid: the claim is retried and bound.
    infoblox.store.seed({"extensible_attributes": ["CostCenter"]})
    sandbox.wait_claims_bound(NAMESPACE, 1, timeout=20)
    (record,) = objects(infoblox, "record:host")
    assert record["extattrs"] == {"CostCenter": {"value": "42"}}


def test_missing_secret_then_created(infoblox: MockInfobloxServer, quick: Sandbox) -> None:
    sandbox = quick
    sandbox.infoblox_pool(
        NAMESPACE, "pool", endpoint=infoblox.url, subnet=V4_NET, secret="ib-creds"
    )
    sandbox.wait_pool_ready(NAMESPACE, "pool", KIND, reason="CredentialsNotFound")
    assert "ib-creds" in pool_condition(sandbox, "pool")["message"]
    sandbox.claim(NAMESPACE, "m1", "pool", kind=KIND)
    claim = sandbox.wait_claim_reason(NAMESPACE, "m1", "PoolNotReady")
    assert "ib-creds" in claim_message(claim)
    assert objects(infoblox, "record:host") == []

    sandbox.secret(NAMESPACE, "ib-creds", CREDENTIALS)
    sandbox.wait_pool_ready(NAMESPACE, "pool", KIND, timeout=20)
    sandbox.wait_claims_bound(NAMESPACE, 1, timeout=20)
    (record,) = objects(infoblox, "record:host")
    assert host_ips(record) == [address_map(sandbox)["m1"]]


# -------------------------------------------------------------------------- restart


def test_restart_costs_no_backend_call_for_bound_claims(
    infoblox: MockInfobloxServer, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = WapiJournal(infoblox.store)
    ready_pool(sandbox, infoblox, "pool", V4_NET)
    names = [f"r{i}" for i in range(5)]
    for name in names:
        sandbox.claim(NAMESPACE, name, "pool", kind=KIND)
    sandbox.wait_claims_bound(NAMESPACE, 5)
    assert len([c for c in journal.writes() if c.op == "create"]) == 5
    hostnames = [f"{n}.{NAMESPACE}" for n in names]
    assert journal.naming(hostnames)  # allocation looked each hostname up first
    grid_before = objects(infoblox, "record:host")
    addresses_before = {
        a["metadata"]["name"]: (a["metadata"]["uid"], a["spec"])
        for a in sandbox.addresses(NAMESPACE)
    }

    sandbox.stop_operator()
    journal.clear()
    # Observe the operator's reconciles: each claim is looked at once at start-up.
    seen: list[str] = []
    original = reconcile_claim

    def spy(ctx: ClaimDeps, namespace: str, name: str) -> Result:
        decision = original(ctx, namespace, name)
        seen.append(name)
        return decision

    monkeypatch.setattr(operator_module, "reconcile_claim", spy)
    sandbox.start_operator()
    wait_for(
        lambda: set(seen) >= set(names),
        timeout=20,
        message="start-up reconciles of the bound claims",
    )

    assert journal.writes() == []
    assert journal.naming(hostnames) == []
    assert objects(infoblox, "record:host") == grid_before
    assert {
        a["metadata"]["name"]: (a["metadata"]["uid"], a["spec"])
        for a in sandbox.addresses(NAMESPACE)
    } == addresses_before
    assert all(sandbox.ready(c) == ("True", "AddressAllocated") for c in sandbox.claims(NAMESPACE))

    # The restarted operator still releases: one DELETE for the deleted claim only.
    sandbox.delete_claim(NAMESPACE, "r0")
    wait_for(lambda: sandbox.get_claim(NAMESPACE, "r0") is None, message="r0 gone")
    assert [(c.op, c.type_name) for c in journal.writes()] == [("delete", "record:host")]
    assert sorted(r["name"] for r in objects(infoblox, "record:host")) == sorted(hostnames[1:])


def test_restart_writes_nothing_to_bound_claims(
    infoblox: MockInfobloxServer, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    ready_pool(sandbox, infoblox, "pool", V4_NET)
    names = [f"r{i}" for i in range(3)]
    for name in names:
        sandbox.claim(NAMESPACE, name, "pool", kind=KIND)
    sandbox.wait_claims_bound(NAMESPACE, 3)
    sandbox.stop_operator()

    # Record every write the emulated API server receives for the claims.
    store = sandbox.kube.store
    claim_writes: list[tuple[str, str | None]] = []
    patch = store.patch

    def recording_patch(
        defn: Any, namespace: str | None, name: str, *args: Any, **kwargs: Any
    ) -> Any:
        if defn.plural == "ipaddressclaims":
            claim_writes.append((name, kwargs.get("subresource")))
        return patch(defn, namespace, name, *args, **kwargs)

    monkeypatch.setattr(store, "patch", recording_patch)
    seen: list[str] = []
    original = reconcile_claim

    def spy(ctx: ClaimDeps, namespace: str, name: str) -> Result:
        decision = original(ctx, namespace, name)
        seen.append(name)
        return decision

    monkeypatch.setattr(operator_module, "reconcile_claim", spy)
    sandbox.start_operator()
    wait_for(lambda: set(seen) >= set(names), timeout=20, message="start-up reconciles")
    # A bound claim is answered from its IPAddress: nothing to write back.
    sandbox.delete_claim(NAMESPACE, "r0")
    wait_for(
        lambda: sandbox.get_claim(NAMESPACE, "r0") is None,
        timeout=3,
        message="r0 released promptly after a restart",
    )
    assert [w for w in claim_writes if w[0] != "r0"] == []
