"""Claims deleted after a silent network (a blackhole, then the heal) are released in time.

The real operator runs against the emulated API server and the phpIPAM mock. The network
between them goes silent (`mock_kubernetes.silence`: every open watch stays open and sends
nothing more, ever; new requests hang) for longer than the operator's stall limit, then
heals. A watch with no event and no bookmark for the stall limit is dead: the operator lists
again and watches anew. Claims deleted after the heal must then be released (IPAddresses and
phpIPAM entries gone) and the pool deletable, within 2 minutes of the heal.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

import pytest
from fault_audit import entries_per_claim
from integration_env import CREDENTIALS, NAMESPACE

from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

#: The operator's stall limit in this test (90 s in production).
STALL_SECONDS = 3.0
#: Seconds between the emulator's bookmarks (60 s on a real API server): below the limit.
BOOKMARK_SECONDS = 1.0
#: Seconds the network is silent: well beyond the stall limit.
SILENCE_SECONDS = 3 * STALL_SECONDS
#: What the issue asks: released, and the pool gone, within 2 minutes of the heal.
RELEASED_WITHIN = 120.0
SUBNET = 7
CLAIMS = 10


def _bound(sandbox: Sandbox, names: set[str]) -> bool:
    claims = {str(c["metadata"]["name"]): c for c in sandbox.claims(NAMESPACE)}
    return all(
        name in claims and (claims[name].get("status") or {}).get("addressRef") for name in names
    )


def test_claims_deleted_after_a_silent_network_are_released_and_the_pool_can_go(
    make_sandbox: Callable[..., Sandbox],
    phpipam: MockPhpipamServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="bridge.runtime.informer")
    sandbox = make_sandbox(
        settings={"IPAM_BRIDGE_WATCH_STALL_SECONDS": str(STALL_SECONDS)}, start_operator=False
    )
    sandbox.kube.handler.bookmark_seconds = BOOKMARK_SECONDS
    sandbox.start_operator()
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=SUBNET, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "pool", timeout=60)
    names = {f"c{i}" for i in range(CLAIMS)}
    for name in sorted(names):
        sandbox.claim(NAMESPACE, name, "pool")
    wait_for(lambda: _bound(sandbox, names), timeout=120, message="every claim bound")
    assert entries_per_claim(phpipam.store, SUBNET) == collections.Counter(names)

    sandbox.kube.handler.silence.begin()
    time.sleep(SILENCE_SECONDS)  # the blackhole itself: a scenario's duration, not a wait
    sandbox.kube.handler.silence.heal()
    healed = time.monotonic()

    for name in sorted(names):  # on the store directly: the harness is not cut off
        sandbox.delete_claim(NAMESPACE, name)
    left = lambda: RELEASED_WITHIN - (time.monotonic() - healed)  # noqa: E731
    try:
        wait_for(
            lambda: (
                not sandbox.claims(NAMESPACE)
                and not sandbox.addresses(NAMESPACE)
                and not entries_per_claim(phpipam.store, SUBNET)
            ),
            timeout=left(),
            message="the claims deleted after the heal released",
        )
        sandbox.delete_pool(NAMESPACE, "pool")
        wait_for(
            lambda: sandbox.pool(NAMESPACE, "pool") is None,
            timeout=max(left(), 0.1),
            message="the pool deleted (its finalizer gone)",
        )
    finally:
        entries = sum(entries_per_claim(phpipam.store, SUBNET).values())
        print(
            f"silent network ({SILENCE_SECONDS:.0f} s, stall limit {STALL_SECONDS:.0f} s):"
            f" {len(sandbox.claims(NAMESPACE))} claims, {len(sandbox.addresses(NAMESPACE))}"
            f" IPAddresses, {entries} phpIPAM entries left"
            f" {time.monotonic() - healed:.1f} s after the heal"
        )
    # The dead watches were found by their read timeout (the stall limit), then listed again.
    assert "failed (ReadTimeoutError): listing again" in caplog.text
    assert "ipaddressclaims listed again" in caplog.text
    assert sandbox.operator_running
