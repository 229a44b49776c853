"""The scenario of ``ipam-bridge demo``: the whole flow on one machine, no cluster, no IPAM.

Starts a mock IPAM (phpIPAM, or Infoblox WAPI) and the in-memory Kubernetes API on
127.0.0.1, runs the real operator against them, creates a Secret, a pool and claims, prints
what each claim got and what the IPAM recorded, deletes the claims and shows the addresses
released; then a paused ClusterClass Cluster gets its control-plane endpoint from the pool, a
Cluster from CAPV's own template without a ClusterClass gets its VIP in the VSphereCluster, the
kube-vip Pod and the Cluster, and a pool of two subnets fills the first one and moves on to the
second.
``pip install 'ipam-bridge[demo]'`` brings all it needs (the CRDs are package data of
``bridge``); ``bridge.demo`` runs it.
"""

from __future__ import annotations

import importlib.resources
import ipaddress
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from backends.base import parse_owner
from mock_kubernetes.sandbox import Sandbox, wait_for

__all__ = ["run_demo"]

NAMESPACE = "demo"
SUBNET = "10.20.0.0/24"
GATEWAY = "10.20.0.1"
USERNAME = "ipam-bridge"
PASSWORD = "demo-password-not-a-secret"  # the mock's own; printed nowhere


def _phpipam(sandbox: Sandbox) -> tuple[Any, Callable[[], list[tuple[str, str, str]]], str]:
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

    def entries() -> list[tuple[str, str, str]]:
        return [
            (
                str(a.ip),
                a.hostname or ("(gateway)" if a.is_gateway else ""),
                _owner(a.values.get("note")),
            )
            for a in store.subnet_addresses(7)
        ]

    return server, entries, "PHPIPAMIPPool"


def _infoblox(sandbox: Sandbox) -> tuple[Any, Callable[[], list[tuple[str, str, str]]], str]:
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

    def entries() -> list[tuple[str, str, str]]:
        rows = []
        for host in store.dump()["objects"].get("record:host", []):
            owner = _owner(host.get("comment"))
            for addr in host.get("ipv4addrs") or []:
                rows.append((str(addr.get("ipv4addr")), str(host.get("name")), owner))
        return sorted(rows, key=lambda r: tuple(int(x) for x in r[0].split(".")))

    return server, entries, "InfobloxIPPool"


def _owner(text: object) -> str:
    """Return the ipam-bridge owner a stored text names, ``<cluster id> <ns>/<claim>``, or "-".

    phpIPAM's ``note`` and WAPI's ``comment`` (`backends.base.parse_owner`).
    """
    owner = parse_owner(text if isinstance(text, str) else None)
    return "-" if owner is None else f"{owner.cluster_id or '(previous release)'} {owner.claim}"


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join("  " + line for line in lines)


def _cluster_crds() -> list[Path]:
    """Return CAPI v1.14's Cluster CRD (``crds/capi/``, package data) when present, else []."""
    path = Path(str(importlib.resources.files("bridge") / "crds" / "capi"))
    return [p for p in (path / "cluster.x-k8s.io_clusters.yaml",) if p.is_file()]


def _endpoint_step(sandbox: Sandbox, kind: str, say: Callable[[str], None]) -> bool:
    """Step 5: a paused ClusterClass Cluster gets its control-plane endpoint from the pool.

    Returns True when the Cluster got the endpoint, the variable and was unpaused in one
    write, and the address was released once the Cluster was deleted.
    """
    from bridge.reconcilers.control_plane import (
        POOL_ANNOTATION,
        UNPAUSE_ANNOTATION,
        VARIABLES_ANNOTATION,
    )

    clusters = "cluster.x-k8s.io/v1beta2"
    sandbox.create(
        {
            "apiVersion": clusters,
            "kind": "Cluster",
            "metadata": {
                "name": "workload-1",
                "namespace": NAMESPACE,
                "annotations": {
                    POOL_ANNOTATION: f"{kind}/nodes",
                    VARIABLES_ANNOTATION: "controlPlaneIpAddr",
                    UNPAUSE_ANNOTATION: "true",
                },
            },
            "spec": {
                "paused": True,
                "topology": {"classRef": {"name": "vsphere-kube-vip"}, "version": "v1.33.0"},
            },
        }
    )

    def endpoint() -> dict[str, Any] | None:
        body = sandbox.get_object(clusters, "clusters", "workload-1", NAMESPACE) or {}
        return body if (body.get("spec") or {}).get("controlPlaneEndpoint") else None

    cluster = wait_for(endpoint, timeout=30, message="the control-plane endpoint")
    spec = cluster["spec"]
    host, port = spec["controlPlaneEndpoint"]["host"], spec["controlPlaneEndpoint"]["port"]
    variables = {v["name"]: v["value"] for v in spec["topology"].get("variables") or []}
    say(
        f"5. Cluster {NAMESPACE}/workload-1 (paused, annotated "
        f"{POOL_ANNOTATION.split('/')[1]}: {kind}/nodes) got, in one write:\n"
        f"   controlPlaneEndpoint {host}:{port}, variable controlPlaneIpAddr="
        f"{variables.get('controlPlaneIpAddr')}, paused {spec.get('paused')}\n"
        f"   (from IPAddressClaim {NAMESPACE}/workload-1-control-plane-endpoint)"
    )
    sandbox.delete_object(clusters, "clusters", "workload-1", NAMESPACE)
    sandbox.wait_gone(NAMESPACE, timeout=60)
    say("   Cluster deleted: its claim went with it and the address was released")
    return variables.get("controlPlaneIpAddr") == host and spec.get("paused") is False


def _kube_vip_address(kcp: dict[str, Any]) -> str | None:
    """Return the kube-vip static Pod's ``address`` in a KubeadmControlPlane, or None."""
    import yaml

    for item in kcp["spec"]["kubeadmConfigSpec"].get("files") or []:
        if str(item.get("path", "")).endswith("kube-vip.yaml"):
            for container in yaml.safe_load(item["content"])["spec"]["containers"]:
                for env in container.get("env") or []:
                    if container.get("name") == "kube-vip" and env.get("name") == "address":
                        return str(env.get("value") or "") or None
    return None


def _capv_step(sandbox: Sandbox, kind: str, say: Callable[[str], None]) -> bool:
    """Step 5b: CAPV's own template, without a ClusterClass and the VIP left empty.

    The Cluster, VSphereCluster and KubeadmControlPlane that ``clusterctl generate cluster``
    renders (`mock_kubernetes.capv`), the Cluster paused and annotated. Returns True when the
    VIP reached the VSphereCluster, the kube-vip Pod and the Cluster, and the Cluster was
    unpaused.
    """
    from bridge.reconcilers.control_plane import POOL_ANNOTATION, UNPAUSE_ANNOTATION
    from mock_kubernetes.capv import generate_cluster

    name = "workload-2"
    values = {
        "CLUSTER_NAME": name,
        "NAMESPACE": NAMESPACE,
        "CONTROL_PLANE_MACHINE_COUNT": "3",
        "KUBERNETES_VERSION": "v1.33.0",
        "VSPHERE_SERVER": "vcenter.example",
        "VSPHERE_TLS_THUMBPRINT": "01:02:03:04",
        "VSPHERE_SSH_AUTHORIZED_KEY": "ssh-ed25519 AAAAC3Nz demo",
    }
    where = {
        "Cluster": ("cluster.x-k8s.io/v1beta2", "clusters"),
        "VSphereCluster": ("infrastructure.cluster.x-k8s.io/v1beta2", "vsphereclusters"),
        "KubeadmControlPlane": ("controlplane.cluster.x-k8s.io/v1beta2", "kubeadmcontrolplanes"),
    }
    for body in generate_cluster(values):
        if body["kind"] == "Cluster":
            body["metadata"]["annotations"] = {
                POOL_ANNOTATION: f"{kind}/nodes",
                UNPAUSE_ANNOTATION: "true",
            }
            body["spec"]["paused"] = True
        sandbox.create(body)

    def read(kind_: str) -> dict[str, Any]:
        return sandbox.get_object(*where[kind_], name, NAMESPACE) or {}

    wait_for(
        lambda: read("Cluster").get("spec", {}).get("paused") is False,
        timeout=30,
        message="the CAPV Cluster unpaused",
    )
    cluster, infra, kcp = read("Cluster"), read("VSphereCluster"), read("KubeadmControlPlane")
    host = cluster["spec"]["controlPlaneEndpoint"]["host"]
    infra_host = infra["spec"]["controlPlaneEndpoint"].get("host")
    vip = _kube_vip_address(kcp)
    say(
        f"5b. CAPV's cluster-template.yaml (no ClusterClass), generated with the VIP empty;\n"
        f"   Cluster {NAMESPACE}/{name} paused and annotated {kind}/nodes. The VIP now is in:"
    )
    say(
        _table(
            [
                (f"VSphereCluster {name}", "spec.controlPlaneEndpoint.host", str(infra_host)),
                (f"KubeadmControlPlane {name}", "kube-vip.yaml env address", str(vip)),
                (f"Cluster {name}", "spec.controlPlaneEndpoint.host", host),
            ],
            ("object", "field", "value"),
        )
    )
    say(f"   and the Cluster was unpaused last: paused {cluster['spec'].get('paused')}")
    for kind_ in ("Cluster", "VSphereCluster", "KubeadmControlPlane"):
        sandbox.delete_object(*where[kind_], name, NAMESPACE)
    sandbox.wait_gone(NAMESPACE, timeout=60)
    say("   Cluster deleted: its claim went with it and the address was released")
    return bool(host == infra_host == vip)


#: Step 6: a pool of two subnets, the first with two host addresses.
FIRST_SUBNET, SECOND_SUBNET, SECOND_GATEWAY = "10.21.0.0/30", "10.21.1.0/29", "10.21.1.1"


def _subnets_step(sandbox: Sandbox, server: Any, kind: str, say: Callable[[str], None]) -> bool:
    """Step 6: a pool of two subnets fills the first one, then hands out the second's.

    Returns True when the first subnet's two addresses went first, the other claims got
    addresses of the second subnet with its prefix and gateway, and everything was released.
    """
    spec: dict[str, Any]
    if kind == "PHPIPAMIPPool":
        server.store.add_subnet(FIRST_SUBNET, section_id=1, subnet_id=21)
        server.store.add_subnet(SECOND_SUBNET, section_id=1, subnet_id=22, gateway=SECOND_GATEWAY)
        spec = {"appId": "capi", "subnets": [{"subnetId": 21}, {"subnetId": 22}]}
    else:
        server.store.seed(
            {
                "networks": [
                    {"network": FIRST_SUBNET, "network_view": "default"},
                    {
                        "network": SECOND_SUBNET,
                        "network_view": "default",
                        "gateway": SECOND_GATEWAY,
                    },
                ]
            }
        )
        spec = {"subnets": [{"subnet": FIRST_SUBNET}, {"subnet": SECOND_SUBNET}]}
    sandbox.create(
        {
            "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": "spread", "namespace": NAMESPACE},
            "spec": {
                "endpoint": server.url,
                "credentialsRef": {"name": "nodes-credentials"},  # the Secret of step 1
                **spec,
            },
        }
    )
    sandbox.wait_pool_ready(NAMESPACE, "spread", kind)
    names = [f"spread-{i}" for i in range(4)]
    for name in names:
        sandbox.claim(NAMESPACE, name, "spread", kind=kind)
    sandbox.wait_claims_bound(NAMESPACE, len(names), timeout=60)
    specs = {a["metadata"]["name"]: a["spec"] for a in sandbox.addresses(NAMESPACE)}
    rows = sorted(  # in address order: claims are served in parallel, not by name
        (
            (
                name,
                specs[name]["address"],
                str(specs[name]["prefix"]),
                specs[name].get("gateway", "-"),
            )
            for name in names
        ),
        key=lambda row: ipaddress.ip_address(row[1]),
    )
    time.sleep(1.5)  # one pool refresh
    status = (sandbox.pool(NAMESPACE, "spread", kind) or {})["status"]
    say(f"6. {kind} {NAMESPACE}/spread lists two subnets; 4 claims fill the first, then move on:")
    say(_table(rows, ("claim", "address", "prefix", "gateway")))
    say(
        _table(
            [
                (s["cidr"], str(s["prefix"]), s.get("gateway", "-"), str(s["ipAddresses"]["free"]))
                for s in status["subnets"]
            ],
            ("status.subnets", "prefix", "gateway", "free"),
        )
    )
    for name in names:
        sandbox.delete_claim(NAMESPACE, name)
    sandbox.wait_gone(NAMESPACE, timeout=60)
    sandbox.delete_pool(NAMESPACE, "spread", kind)
    wait_for(lambda: sandbox.pool(NAMESPACE, "spread", kind) is None, timeout=30, message="pool")
    say("   claims deleted: both subnets' addresses released; the pool deleted")
    first = sorted(r[1] for r in rows if r[1].startswith("10.21.0."))
    second = [r for r in rows if r[1].startswith("10.21.1.")]
    return first == ["10.21.0.1", "10.21.0.2"] and all(
        (r[2], r[3]) == ("29", SECOND_GATEWAY) for r in second
    )


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
    from mock_kubernetes.capv import CRDS as CAPV_CRDS

    with Sandbox(capi_crds=[*_cluster_crds(), *CAPV_CRDS]) as sandbox:
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
            say(f"   the {backend} mock holds {len(registered)} entries in {SUBNET}, each naming")
            say("   its owner: this management cluster (the uid of kube-system) and the claim:")
            say(_table(registered, ("address", "hostname", "owner (cluster, claim)")))
            say("")

            for c in bound:
                sandbox.delete_claim(NAMESPACE, c["metadata"]["name"])
            sandbox.wait_gone(NAMESPACE, timeout=60)
            left = entries()
            say(
                f"4. claims deleted: every IPAddress is gone; the {backend} mock holds "
                f"{len(left)} entries: {', '.join(f'{ip} {h}' for ip, h, _ in left) or 'none'}"
            )
            say("")
            endpoint_ok = _endpoint_step(sandbox, kind, say)
            say("")
            endpoint_ok = _capv_step(sandbox, kind, say) and endpoint_ok
            say("")
            subnets_ok = _subnets_step(sandbox, server, kind, say)
            left = entries()
        finally:
            server.stop()
    ok = (
        distinct == claims
        and endpoint_ok
        and subnets_ok
        and not [h for _, h, _ in left if h.startswith(("node-", "workload-"))]
    )
    say(f"\n{'done' if ok else 'FAILED'} in {time.monotonic() - started:.1f}s")
    return 0 if ok else 1
