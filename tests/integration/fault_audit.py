"""Audit helpers of the fault and concurrency tests: the end state and what users saw.

`audit` checks the invariants after a fault (no address held by two claims, no address in
phpIPAM without a live claim, no live claim without its address); `FailureLog` samples the
conditions and Events users see while a fault lasts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from integration_env import CREDENTIALS, NAMESPACE

from bridge.capi import GROUP
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = [
    "Audit",
    "FailureLog",
    "audit",
    "converged",
    "entries_per_claim",
    "print_figures",
    "wait_converged",
]

#: The /24 of `integration_env.PHPIPAM_SEED` (gateway 10.20.0.1, 253 assignable addresses).
SUBNET_ID = 7

#: How often state is sampled while a fault lasts (seconds).
SAMPLE_SECONDS = 0.25

#: Ready False reasons a claim may show while the IPAM misbehaves.
CLAIM_FAILURE_REASONS = frozenset({"AllocationFailed", "PoolNotReady", "PoolExhausted"})


def ready_condition(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return the metav1 Ready condition of a claim or pool ({} when none)."""
    status = body.get("status") or {}
    conditions = status.get("conditions") or []
    if str(body.get("apiVersion", "")).endswith("/v1beta1") and body.get("kind") == (
        "IPAddressClaim"
    ):
        conditions = (status.get("v1beta2") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Ready"), {})


def hostname_of(claim: Mapping[str, Any]) -> str:
    """The claim's key in phpIPAM (``<claim>.<namespace>``; the pools here set no suffix)."""
    return f"{claim['metadata']['name']}.{claim['metadata']['namespace']}"


def deleting(body: Mapping[str, Any]) -> bool:
    """True once the object has a deletionTimestamp."""
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


def pools(sandbox: Sandbox, namespace: str) -> list[dict[str, Any]]:
    """The PHPIPAMIPPools of a namespace."""
    return sandbox.kube.list(f"{GROUP}/v1alpha1", "phpipamippools", namespace)


def is_bound(claim: Mapping[str, Any]) -> bool:
    """The claim has ``status.addressRef`` and Ready True."""
    return bool((claim.get("status") or {}).get("addressRef")) and (
        ready_condition(claim).get("status") == "True"
    )


def poll(predicate: Callable[[], Any], *, timeout: float, message: str) -> Any:
    """`wait_for` at the sampling pace (lists of hundreds of objects are not free)."""
    return wait_for(predicate, timeout=timeout, interval=SAMPLE_SECONDS, message=message)


@dataclass(frozen=True)
class Audit:
    """The end state of one namespace against phpIPAM (every list empty = clean).

    Attributes
    ----------
    claims:
        Live claims (no deletionTimestamp).
    addresses:
        IPAddress objects.
    rows:
        Address rows in the audited subnets, gateways excluded.
    duplicates:
        Addresses held by more than one IPAddress, or by more than one phpIPAM row.
    leaks:
        phpIPAM rows whose hostname belongs to no live claim, and second rows of a hostname.
    unbound:
        Live claims without Ready True, addressRef, and an IPAddress of theirs whose address
        is the one phpIPAM holds under their hostname.
    orphans:
        IPAddresses whose claim is not a live claim.
    deleting:
        Claims still being deleted.
    """

    claims: int
    addresses: int
    rows: int
    duplicates: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    unbound: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    deleting: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """True when nothing is duplicated, leaked, unbound, orphaned or stuck."""
        return not (self.duplicates or self.leaks or self.unbound or self.orphans or self.deleting)


def audit(
    sandbox: Sandbox,
    store: Store,
    namespace: str = NAMESPACE,
    subnet_ids: Iterable[int] = (SUBNET_ID,),
) -> Audit:
    """Compare the claims and IPAddresses of ``namespace`` with phpIPAM's rows."""
    claims = sandbox.claims(namespace)
    addresses = sandbox.addresses(namespace)
    rows = [
        (a.hostname or "", a.ip.compressed)
        for sid in subnet_ids
        for a in store.subnet_addresses(sid)
        if not a.is_gateway
    ]
    live = {hostname_of(c): c for c in claims if not deleting(c)}

    held = Counter(a["spec"]["address"] for a in addresses)
    registered = Counter(ip for _, ip in rows)
    duplicates = sorted(
        {ip for ip, n in held.items() if n > 1} | {ip for ip, n in registered.items() if n > 1}
    )

    per_host = Counter(host for host, _ in rows)
    leaks = sorted(f"{host or '(no hostname)'} ({ip})" for host, ip in rows if host not in live)
    leaks += sorted(f"{host} x{n}" for host, n in per_host.items() if host in live and n > 1)

    ip_of = dict(rows)
    by_name = {a["metadata"]["name"]: a for a in addresses}
    unbound = []
    for host, claim in sorted(live.items()):
        name = claim["metadata"]["name"]
        ref = ((claim.get("status") or {}).get("addressRef") or {}).get("name")
        address = by_name.get(ref or "")
        if (
            not is_bound(claim)
            or address is None
            or address["spec"].get("claimRef", {}).get("name") != name
            or address["spec"].get("poolRef") != claim["spec"]["poolRef"]
            or address["spec"]["address"] != ip_of.get(host)
        ):
            unbound.append(name)
    live_names = {c["metadata"]["name"] for c in live.values()}
    orphans = sorted(
        a["metadata"]["name"]
        for a in addresses
        if a["spec"].get("claimRef", {}).get("name") not in live_names
    )
    return Audit(
        claims=len(live),
        addresses=len(addresses),
        rows=len(rows),
        duplicates=duplicates,
        leaks=leaks,
        unbound=unbound,
        orphans=orphans,
        deleting=sorted(c["metadata"]["name"] for c in claims if deleting(c)),
    )


def converged(
    sandbox: Sandbox,
    store: Store,
    expected: int,
    namespace: str = NAMESPACE,
    subnet_ids: Iterable[int] = (SUBNET_ID,),
) -> Audit | None:
    """Return the audit once it is clean with ``expected`` live claims, else None."""
    result = audit(sandbox, store, namespace, subnet_ids)
    return result if result.clean and result.claims == expected else None


def wait_converged(
    sandbox: Sandbox,
    store: Store,
    expected: int,
    *,
    timeout: float,
    namespace: str = NAMESPACE,
    subnet_ids: Iterable[int] = (SUBNET_ID,),
    each: Callable[[], Any] | None = None,
) -> Audit:
    """Wait until `converged` (calling ``each()`` at every poll, e.g. to sample); on timeout
    fail with the last audit (what is wrong)."""
    ids = tuple(subnet_ids)

    def check() -> Audit | None:
        if each is not None:
            each()
        return converged(sandbox, store, expected, namespace, ids)

    try:
        result: Audit = poll(
            check, timeout=timeout, message=f"{expected} claims bound, nothing else"
        )
    except TimeoutError:
        pytest.fail(f"not converged within {timeout}s: {audit(sandbox, store, namespace, ids)}")
    return result


def print_figures(title: str, **figures: Any) -> None:
    """Print one line of figures for the release note (shown by ``pytest -s``)."""
    shown = ", ".join(
        f"{k}={v:.1f}s" if k.endswith("seconds") else f"{k}={v}" for k, v in figures.items()
    )
    print(f"\n[figures] {title}: {shown}")


class FailureLog:
    """Failures users can see, sampled while a fault lasts, and their Events.

    `sample` records every claim and pool whose Ready condition is False (with reason and
    message); `assert_events` then checks each recorded failure has a Warning Event with
    that reason on that object.
    """

    def __init__(self, sandbox: Sandbox, namespace: str = NAMESPACE) -> None:
        self.sandbox = sandbox
        self.namespace = namespace
        #: (kind, name, reason) -> message
        self.seen: dict[tuple[str, str, str], str] = {}
        self.samples = 0

    def sample(self) -> None:
        """Record the objects whose Ready condition is False right now."""
        self.samples += 1
        for body in self.sandbox.claims(self.namespace) + pools(self.sandbox, self.namespace):
            condition = ready_condition(body)
            if condition.get("status") != "False":
                continue
            key = (str(body["kind"]), str(body["metadata"]["name"]), str(condition["reason"]))
            self.seen[key] = str(condition.get("message") or "")

    def failures(self, kind: str) -> dict[tuple[str, str, str], str]:
        """The recorded failures of one kind."""
        return {k: v for k, v in self.seen.items() if k[0] == kind}

    def assert_events(self, timeout: float = 30.0) -> None:
        """Every recorded failure has a message and a Warning Event with its reason."""
        for (kind, name, reason), message in self.seen.items():
            assert message, f"{kind} {name}: Ready False {reason} without a message"
            assert CREDENTIALS["password"] not in message

        def missing() -> list[tuple[str, str, str]]:
            events = {
                (e["involvedObject"].get("kind"), e["involvedObject"].get("name"), e["reason"])
                for e in self.sandbox.events(self.namespace)
                if e.get("type") == "Warning"
            }
            return [key for key in self.seen if key not in events]

        try:
            wait_for(
                lambda: not missing(),
                timeout=timeout,
                interval=SAMPLE_SECONDS,
                message="a Warning Event for every failure",
            )
        except TimeoutError:
            pytest.fail(f"failures without a Warning Event: {missing()}")


def sampling(log: FailureLog, predicate: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap ``predicate`` so that every poll also samples failures."""

    def check() -> Any:
        log.sample()
        return predicate()

    return check


def make_pool(
    sandbox: Sandbox,
    server: MockPhpipamServer,
    credentials: Mapping[str, str] = CREDENTIALS,
    name: str = "pool",
) -> None:
    """Create the pool on subnet 7 with its Secret."""
    sandbox.phpipam_pool(
        NAMESPACE, name, endpoint=server.url, subnet_id=SUBNET_ID, credentials=credentials
    )


def create_claims(sandbox: Sandbox, names: Iterable[str], pool: str = "pool") -> None:
    """Create one claim per name on ``pool``."""
    for name in names:
        sandbox.claim(NAMESPACE, name, pool)


def bound_names(sandbox: Sandbox) -> set[str]:
    """Names of the claims bound now."""
    return {c["metadata"]["name"] for c in sandbox.claims(NAMESPACE) if is_bound(c)}


def registered(store: Store) -> list[tuple[str, str]]:
    """The (hostname, address) rows of the subnet, gateway included, sorted."""
    return sorted((a.hostname or "", a.ip.compressed) for a in store.subnet_addresses(SUBNET_ID))


def entries_per_claim(store: Store, subnet_id: int = SUBNET_ID) -> Counter[str]:
    """Count a subnet's phpIPAM entries per claim name (a hostname is ``<claim>.<namespace>``).

    The gateway and the operator's reserved entries are left out.
    """
    return Counter(
        str(a.hostname).split(".", 1)[0]
        for a in store.subnet_addresses(subnet_id)
        if not a.is_gateway and not str(a.hostname).startswith("ipam-bridge-reserved")
    )


def logins(store: Store, *, ok: bool) -> int:
    """Count login requests (``POST <app>/user/``) that succeeded (``ok``) or failed."""
    return sum(
        1
        for e in store.requests()
        if e.method == "POST" and e.path.rstrip("/").endswith("/user") and (e.status == 200) == ok
    )


# ------------------------------------------------------------------------------ (a)
