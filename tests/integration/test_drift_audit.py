"""The drift audit (issue 14): the real operator and ``ipam-bridge audit`` against both mocks.

Entries are deleted, renamed and added behind the operator's back through the mocks' admin
surfaces (`mock_phpipam.store.Store.remove_address`/``edit_address``/``add_address``,
`mock_infoblox.store.InfobloxStore.remove_records`/``edit_record``/``add_record``); the
audit runs every half second (``IPAM_BRIDGE_AUDIT_SECONDS``).
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from typing import Any

import pytest
import requests
from integration_env import CREDENTIALS, NAMESPACE
from prometheus_client.parser import text_string_to_metric_families

from bridge import cli
from bridge.reconcilers.audit import IN_SYNC
from mock_infoblox.server import MockInfobloxServer
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

AUDIT = {"IPAM_BRIDGE_AUDIT_SECONDS": "0.5"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def drift_metric(port: int, pool: str, kind: str) -> dict[str, float]:
    """Return ``{finding: value}`` of ``ipam_bridge_drift`` for one pool."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        sample.labels["finding"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "ipam_bridge_drift"
        and sample.labels.get("pool") == pool
        and sample.labels.get("kind") == kind
    }


def events(sandbox: Sandbox, reason: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in sandbox.events(NAMESPACE)
        if e.get("reason") == reason
        and (name is None or (e.get("involvedObject") or {}).get("name") == name)
    ]


def in_sync(sandbox: Sandbox, name: str, kind: str = "PHPIPAMIPPool") -> dict[str, Any] | None:
    pool = sandbox.pool(NAMESPACE, name, kind) or {}
    return next(
        (c for c in (pool.get("status") or {}).get("conditions") or [] if c["type"] == IN_SYNC),
        None,
    )


def addresses_of(sandbox: Sandbox) -> dict[str, str]:
    return {a["metadata"]["name"]: a["spec"]["address"] for a in sandbox.addresses(NAMESPACE)}


def phpipam_rows(server: MockPhpipamServer, subnet_id: int = 7) -> dict[str, str]:
    """``{address: hostname}`` of the rows of a subnet."""
    return {str(a.ip): str(a.hostname or "") for a in server.store.subnet_addresses(subnet_id)}


def run_audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["audit", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_phpipam_drift_is_repaired_or_reported_and_the_cli_shows_it(
    make_sandbox: Callable[..., Sandbox],
    phpipam: MockPhpipamServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    sandbox = make_sandbox(settings={**AUDIT, "IPAM_BRIDGE_METRICS_PORT": str(port)})
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    for name in ("m1", "m2", "m3"):
        sandbox.claim(NAMESPACE, name, "pool")
    sandbox.wait_claims_bound(NAMESPACE, 3)
    wait_for(lambda: (c := in_sync(sandbox, "pool")) and c["status"] == "True", timeout=10)
    assert run_audit(capsys)[0] == 0
    bound = addresses_of(sandbox)

    # Behind the operator's back: a person deletes m1's entry, renames m2's, a failed run
    # left an entry of a claim that is gone, and a printer has an address of its own.
    store = phpipam.store
    store.remove_address(bound["m1"], subnet_id=7)
    store.edit_address(bound["m2"], {"hostname": "printer-7"}, subnet_id=7)
    store.add_address(
        7, "10.20.0.200", hostname="gone.test", description="ipam-bridge test/gone cluster c1"
    )
    store.add_address(7, "10.20.0.201", hostname="printer-8", description="3rd floor")
    # Another management cluster's entry (same IPAM, no hostnameSuffix): never an orphan here.
    store.add_address(
        7,
        "10.20.0.202",
        hostname="gone2.test",
        description="ipam-bridge test/gone2",
        note="ipam-bridge cluster=cluster-b claim=test/gone2",
    )

    restored = wait_for(lambda: events(sandbox, "AddressRestored", "m1"), timeout=10)
    assert restored[0]["type"] == "Normal" and bound["m1"] in restored[0]["message"]
    assert phpipam_rows(phpipam)[bound["m1"]] == "m1.test"  # the same address, its hostname
    conflict = wait_for(lambda: events(sandbox, "AddressConflict", "m2"), timeout=10)
    assert conflict[0]["type"] == "Warning"
    assert "'printer-7'" in conflict[0]["message"] and "'m2.test'" in conflict[0]["message"]
    orphan = wait_for(lambda: events(sandbox, "OrphanEntry", "pool"), timeout=10)
    assert "test/gone" in orphan[0]["message"] and "10.20.0.200" in orphan[0]["message"]
    condition = wait_for(
        lambda: (c := in_sync(sandbox, "pool")) and c["status"] == "False" and c, timeout=10
    )
    assert condition["reason"] == "DriftFound"
    assert condition["message"].startswith("0 missing, 1 conflict, 1 orphan")
    assert condition["message"].endswith("1 of cluster cluster-b")
    assert sandbox.ready(sandbox.pool(NAMESPACE, "pool"))[0] == "True"  # Ready untouched
    assert drift_metric(port, "test/pool", "PHPIPAMIPPool") == {
        "missing": 0.0,
        "conflict": 1.0,
        "orphan": 1.0,
    }
    # Nothing was taken or deleted: the renamed entry, the orphan and the printer stay.
    rows = phpipam_rows(phpipam)
    assert rows[bound["m2"]] == "printer-7"
    assert rows["10.20.0.200"] == "gone.test" and rows["10.20.0.201"] == "printer-8"
    assert addresses_of(sandbox) == bound
    assert not events(sandbox, "OrphanEntry", "printer-8")

    # The same findings from a person's kubeconfig, read-only.
    code, out, _ = run_audit(capsys)
    assert code == 1
    header, *table = out.splitlines()
    assert header.split() == ["POOL", "CLAIM", "ADDRESS", "IPAM", "HOSTNAME", "FINDING"]
    assert table[0].split() == ["test/pool", "test/m2", bound["m2"], "printer-7", "conflict"]
    assert table[1].split() == ["test/pool", "test/gone", "10.20.0.200", "gone.test", "orphan"]
    assert "PHPIPAMIPPool test/pool: entries by owner: " in out and "1 of cluster cluster-b" in out
    assert "test/gone2" not in out
    code, out, _ = run_audit(capsys, "--namespace", NAMESPACE, "--output", "json")
    document = json.loads(out)
    assert code == 1 and document["inSync"] is False and document["errors"] == []
    assert [(f["finding"], f["claim"]) for f in document["findings"]] == [
        ("conflict", "test/m2"),
        ("orphan", "test/gone"),
    ]
    assert run_audit(capsys, "--namespace", "elsewhere")[0] == 0  # no pools there

    # Put right in the IPAM: in sync again.
    store.edit_address(bound["m2"], {"hostname": "m2.test"}, subnet_id=7)
    store.remove_address("10.20.0.200", subnet_id=7)
    wait_for(lambda: (c := in_sync(sandbox, "pool")) and c["status"] == "True", timeout=10)
    assert drift_metric(port, "test/pool", "PHPIPAMIPPool")["conflict"] == 0.0
    code, out, _ = run_audit(capsys)
    assert code == 0 and out.startswith("in sync: 1 pool(s) audited, 3 IPAddresses")


def test_infoblox_deleted_record_restored_and_renamed_record_reported(
    make_sandbox: Callable[..., Sandbox], infoblox: MockInfobloxServer
) -> None:
    sandbox = make_sandbox(settings=AUDIT)
    sandbox.infoblox_pool(
        NAMESPACE, "ib", endpoint=infoblox.url, subnet="10.20.0.0/24", credentials=CREDENTIALS
    )
    for name in ("m1", "m2"):
        sandbox.claim(NAMESPACE, name, "ib", kind="InfobloxIPPool")
    sandbox.wait_claims_bound(NAMESPACE, 2)
    bound = addresses_of(sandbox)
    store = infoblox.store
    store.remove_records({"name": "m1.test"})
    store.edit_record({"name": "m2.test"}, {"name": "printer-7"})
    store.add_record(
        {"name": "gone.test", "address": "10.20.0.200", "comment": "ipam-bridge test/gone"}
    )

    wait_for(lambda: events(sandbox, "AddressRestored", "m1"), timeout=10)
    [record] = store.records(name="m1.test")
    assert bound["m1"] in json.dumps(record)  # the same address again
    conflict = wait_for(lambda: events(sandbox, "AddressConflict", "m2"), timeout=10)
    assert "'printer-7'" in conflict[0]["message"]
    wait_for(lambda: events(sandbox, "OrphanEntry", "ib"), timeout=10)
    condition = wait_for(
        lambda: (c := in_sync(sandbox, "ib", "InfobloxIPPool")) and c["status"] == "False" and c,
        timeout=10,
    )
    assert condition["message"].startswith("0 missing, 1 conflict, 1 orphan")
    assert store.records(name="printer-7") and store.records(name="gone.test")  # untouched
    assert addresses_of(sandbox) == bound


def test_an_ipam_error_during_the_audit_is_no_finding(
    make_sandbox: Callable[..., Sandbox],
    phpipam: MockPhpipamServer,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The pool's own check does not run again meanwhile (its refresh is long), so it stays
    # Ready and the audit itself meets the failing IPAM.
    sandbox = make_sandbox(settings={**AUDIT, "IPAM_BRIDGE_POOL_REFRESH_SECONDS": "600"})
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.claim(NAMESPACE, "m1", "pool")
    sandbox.wait_claims_bound(NAMESPACE, 1)
    wait_for(lambda: (c := in_sync(sandbox, "pool")) and c["status"] == "True", timeout=10)
    address = addresses_of(sandbox)["m1"]
    caplog.set_level(logging.WARNING, logger="bridge.reconcilers.audit")
    phpipam.faults.update(error_rate=1.0, error_statuses=(503,))
    phpipam.store.remove_address(address, subnet_id=7)

    def failed_rounds() -> int:
        return sum("drift audit of" in r.getMessage() for r in caplog.records)

    wait_for(lambda: failed_rounds() >= 3, timeout=20)  # several rounds, all failing
    assert events(sandbox, "AddressRestored") == []
    assert events(sandbox, "AddressMissing") == [] and events(sandbox, "AddressConflict") == []
    assert (in_sync(sandbox, "pool") or {}).get("status") == "True"  # left as it was
    code, _, err = run_audit(capsys)
    assert code == 2 and "PHPIPAMIPPool test/pool" in err
    # The IPAM answers again: the next round repairs.
    phpipam.faults.reset()
    wait_for(lambda: events(sandbox, "AddressRestored", "m1"), timeout=15)
    assert phpipam_rows(phpipam)[address] == "m1.test"
