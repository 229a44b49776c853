"""The claim annotation ``ipam.cluster.x-k8s.io/requested-address`` (issue 12, item 3).

The real operator against the emulated Kubernetes API and the IPAM mocks over HTTP on
127.0.0.1, for both IPAMs: a free address inside the pool's subnets is registered under the
claim's hostname; one held by another entry, or outside the subnets, leaves the claim Ready
False ``AllocationFailed`` with a message naming the address (and the holder), and nothing is
registered.
"""

from __future__ import annotations

import pytest
from integration_env import CREDENTIALS, NAMESPACE

from bridge.capi import REQUESTED_ADDRESS_ANNOTATION
from mock_infoblox.server import MockInfobloxServer
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer

__all__: list[str] = []


def condition_message(sandbox: Sandbox, name: str) -> str:
    claim = sandbox.get_claim(NAMESPACE, name) or {}
    return next(c["message"] for c in claim["status"]["conditions"] if c["type"] == "Ready")


@pytest.mark.parametrize("ipam", ["phpipam", "infoblox"])
def test_requested_addresses_granted_held_and_outside(
    request: pytest.FixtureRequest, sandbox: Sandbox, ipam: str
) -> None:
    if ipam == "phpipam":
        server: MockPhpipamServer | MockInfobloxServer = request.getfixturevalue("phpipam")
        kind = "PHPIPAMIPPool"
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=server.url, subnet_id=7, credentials=CREDENTIALS
        )
    else:
        server = request.getfixturevalue("infoblox")
        kind = "InfobloxIPPool"
        sandbox.infoblox_pool(
            NAMESPACE, "pool", endpoint=server.url, subnet="10.20.0.0/24", credentials=CREDENTIALS
        )
    sandbox.wait_pool_ready(NAMESPACE, "pool", kind)

    sandbox.claim(
        NAMESPACE,
        "pinned",
        "pool",
        kind=kind,
        annotations={REQUESTED_ADDRESS_ANNOTATION: "10.20.0.50"},
    )
    sandbox.wait_claims_bound(NAMESPACE, 1)
    address = sandbox.get_object(
        f"ipam.cluster.x-k8s.io/{sandbox.version}", "ipaddresses", "pinned", NAMESPACE
    )
    assert address is not None and address["spec"]["address"] == "10.20.0.50"
    assert address["spec"]["prefix"] == 24 and address["spec"]["gateway"] == "10.20.0.1"

    # Held by the first claim: refused, naming the address and its holder.
    sandbox.claim(
        NAMESPACE,
        "thief",
        "pool",
        kind=kind,
        annotations={REQUESTED_ADDRESS_ANNOTATION: "10.20.0.50"},
    )
    sandbox.wait_claim_reason(NAMESPACE, "thief", "AllocationFailed")
    message = condition_message(sandbox, "thief")
    assert "10.20.0.50" in message and f"pinned.{NAMESPACE}" in message

    # Outside every subnet of the pool: refused, naming the address.
    sandbox.claim(
        NAMESPACE,
        "astray",
        "pool",
        kind=kind,
        annotations={REQUESTED_ADDRESS_ANNOTATION: "10.99.0.5"},
    )
    sandbox.wait_claim_reason(NAMESPACE, "astray", "AllocationFailed")
    assert "10.99.0.5" in condition_message(sandbox, "astray")

    # Nothing was registered for the refused claims.
    names = {a["metadata"]["name"] for a in sandbox.addresses(NAMESPACE)}
    assert names == {"pinned"}
    if isinstance(server, MockPhpipamServer):
        assert not server.store.search_hostname(f"thief.{NAMESPACE}")
        assert not server.store.search_hostname(f"astray.{NAMESPACE}")
