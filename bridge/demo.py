"""``ipam-bridge demo``: the whole flow on one machine, with no cluster and no IPAM.

Starts a mock IPAM (phpIPAM, or Infoblox WAPI) and the in-memory Kubernetes API on
127.0.0.1, runs the real operator against them, creates a Secret, a pool and claims, prints
what each claim got and what the IPAM recorded, deletes the claims and shows the addresses
released. ``pip install ipam-bridge`` brings all it needs (kmock; the CRDs as package data).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from bridge.testing.sandbox import Sandbox

__all__ = ["run_demo"]

NAMESPACE = "demo"
SUBNET = "10.20.0.0/24"
GATEWAY = "10.20.0.1"
USERNAME = "ipam-bridge"
PASSWORD = "demo-password-not-a-secret"  # the mock's own; printed nowhere


def _phpipam(sandbox: Sandbox) -> tuple[Any, Callable[[], list[tuple[str, str]]], str]:
    from mock_phpipam.server import MockPhpipamServer
    from mock_phpipam.store import Store

    store = Store(
        {
            "users": [{"username": USERNAME, "password": PASSWORD}],
            "apps": [{"id": "capi", "permissions": 2, "security": "none"}],
            "sections": [
                {
                    "id": 1,
                    "name": "datacenter",
                    "subnets": [
                        {
                            "id": 7,
                            "cidr": SUBNET,
                            "gateway": GATEWAY,
                            "description": "CAPI node network",
                        }
                    ],
                }
            ],
        }
    )
    server = MockPhpipamServer(store).start()
    sandbox.phpipam_pool(
        NAMESPACE,
        "nodes",
        endpoint=server.url,
        subnet_id=7,
        credentials={"username": USERNAME, "password": PASSWORD},
    )

    def entries() -> list[tuple[str, str]]:
        return [
            (str(a.ip), a.hostname or ("(gateway)" if a.is_gateway else ""))
            for a in store.subnet_addresses(7)
        ]

    return server, entries, "PHPIPAMIPPool"


def _infoblox(sandbox: Sandbox) -> tuple[Any, Callable[[], list[tuple[str, str]]], str]:
    from mock_infoblox.server import MockInfobloxServer
    from mock_infoblox.store import InfobloxStore

    store = InfobloxStore.from_seed(
        {
            "users": {USERNAME: PASSWORD},
            "networks": [{"network": SUBNET, "network_view": "default", "gateway": GATEWAY}],
            "used": [
                {"ip": GATEWAY, "network_view": "default", "names": ["gateway"], "types": ["A"]}
            ],
        }
    )
    server = MockInfobloxServer(store).start()
    sandbox.infoblox_pool(
        NAMESPACE,
        "nodes",
        endpoint=server.url,
        subnet=SUBNET,
        credentials={"username": USERNAME, "password": PASSWORD},
    )

    def entries() -> list[tuple[str, str]]:
        rows = []
        for host in store.dump()["objects"].get("record:host", []):
            for addr in host.get("ipv4addrs") or []:
                rows.append((str(addr.get("ipv4addr")), str(host.get("name"))))
        return sorted(rows, key=lambda r: tuple(int(x) for x in r[0].split(".")))

    return server, entries, "InfobloxIPPool"


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join("  " + line for line in lines)


def run_demo(*, claims: int = 10, backend: str = "phpipam") -> int:
    """Run the demo; return the exit code (0 when every step did what it should).

    Parameters
    ----------
    claims:
        How many IPAddressClaims to create.
    backend:
        ``phpipam`` or ``infoblox``: which mock IPAM the pool points at.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # The operator runs in a thread here, where kopf cannot install signal handlers.
    logging.getLogger("kopf._core.reactor.running").setLevel(logging.ERROR)
    started = time.monotonic()
    say = print
    say(f"ipam-bridge demo: {claims} claims against a mock {backend} on 127.0.0.1\n")
    with Sandbox() as sandbox:
        sandbox.namespace(NAMESPACE)
        setup = _phpipam if backend == "phpipam" else _infoblox
        server, entries, kind = setup(sandbox)
        try:
            pool = sandbox.wait_pool_ready(NAMESPACE, "nodes", kind)
            status = pool["status"]
            say(
                f"1. {kind} {NAMESPACE}/nodes is Ready: subnet {status['subnet']}, "
                f"gateway {status.get('gateway')}, {status['ipAddresses']['free']} free\n"
            )

            for i in range(claims):
                sandbox.claim(NAMESPACE, f"node-{i:02d}-eth0", "nodes", kind=kind, cluster=None)
            bound = sandbox.wait_claims_bound(NAMESPACE, claims, timeout=60)
            addresses = {a["metadata"]["name"]: a["spec"] for a in sandbox.addresses(NAMESPACE)}
            rows = sorted(
                (
                    c["metadata"]["name"],
                    addresses[c["status"]["addressRef"]["name"]]["address"],
                    str(addresses[c["status"]["addressRef"]["name"]]["prefix"]),
                    addresses[c["status"]["addressRef"]["name"]].get("gateway", "-"),
                    sandbox.ready(c)[1] or "",
                )
                for c in bound
            )
            say(f"2. {claims} IPAddressClaims bound, each with an IPAddress of the same name:")
            say(_table(rows, ("claim", "address", "prefix", "gateway", "Ready reason")))
            distinct = len({r[1] for r in rows})
            say(f"   {distinct} distinct addresses\n")

            time.sleep(1.5)  # one pool refresh
            usage = (sandbox.pool(NAMESPACE, "nodes", kind) or {})["status"]["ipAddresses"]
            say(
                f"3. pool usage: total {usage['total']}, used {usage['used']}, free {usage['free']}"
            )
            registered = entries()
            say(f"   the {backend} mock holds {len(registered)} entries in {SUBNET}:")
            say(_table([(ip, host) for ip, host in registered], ("address", "hostname")))
            say("")

            for c in bound:
                sandbox.delete_claim(NAMESPACE, c["metadata"]["name"])
            sandbox.wait_gone(NAMESPACE, timeout=60)
            left = entries()
            say(
                f"4. claims deleted: every IPAddress is gone; the {backend} mock holds "
                f"{len(left)} entries: {', '.join(f'{ip} {h}' for ip, h in left) or 'none'}"
            )
        finally:
            server.stop()
    ok = distinct == claims and not [h for _, h in left if h.startswith("node-")]
    say(f"\n{'done' if ok else 'FAILED'} in {time.monotonic() - started:.1f}s")
    return 0 if ok else 1
