"""The mock's journal tells clients apart (User-Agent) and says when each request arrived."""

from __future__ import annotations

import time

from phpipam_mock_helpers import Api

from mock_phpipam import MockPhpipamServer, Store


def test_each_journal_entry_carries_the_user_agent_and_arrival_time(
    server: MockPhpipamServer, store: Store
) -> None:
    a, b = Api(server), Api(server)
    a.session.headers["User-Agent"] = "ipam-bridge/1.0 (replica-a)"
    b.session.headers["User-Agent"] = "ipam-bridge/1.0 (replica-b)"
    before = time.time()
    a.login()
    b.login()
    a.call("GET", "/subnets/7/")
    after = time.time()
    b.call("POST", "/addresses/first_free/7/", json={"hostname": "m1.test"})
    entries = store.requests()
    assert [(e.method, e.client) for e in entries] == [
        ("POST", "ipam-bridge/1.0 (replica-a)"),
        ("POST", "ipam-bridge/1.0 (replica-b)"),
        ("GET", "ipam-bridge/1.0 (replica-a)"),
        ("POST", "ipam-bridge/1.0 (replica-b)"),
    ]
    assert all(before <= e.at <= after for e in entries[:3])
    assert entries[3].at >= entries[2].at
    writes = store.requests(writes_only=True)
    assert [e.client for e in writes] == ["ipam-bridge/1.0 (replica-b)"]
