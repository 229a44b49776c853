"""Unit tests of backends.phpipam for pools of several subnets, requested addresses,
quarantine and the audit listing, against `responses` with a real phpIPAM 1.8.2's answers.

Bodies are copied from /work/shared/reference/phpipam-api.md (section numbers in the
comments) or built from its row shape (2c, 4a, 4h) where a test needs other rows.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import responses
from test_phpipam import (
    BASE,
    CLUSTER,
    CREATED_12,
    CREATED_13,
    DUPLICATE_ENTRY,
    ENDPOINT,
    HOSTNAME_NOT_FOUND,
    IP_EXISTS,
    NO_FREE,
    OWNER,
    OWNER_FIELDS,
    PASSWORD,
    SUBNET_7,
    SUBNET_8,
    USAGE_7,
    USERNAME,
    add,
    add_login,
    legacy_not_found,
    stringified,
    urls,
)

from backends.base import (
    Allocation,
    EntryOwner,
    IPAMBackend,
    SubnetInfo,
    SubnetRef,
    quarantine_mark,
    quarantined_until,
)
from backends.errors import (
    AddressUnavailableError,
    SubnetExhaustedError,
    SubnetNotFoundError,
)
from backends.flowcontrol import FlowControl
from backends.phpipam import MAX_SUBNETS, PHPIPAMBackend, PHPIPAMConfig
from backends.retry import RetryPolicy

# ---------------------------------------------------------------- recorded answers
# 3h: GET /subnets/9/ (10.20.1.0/30, no gateway)
SUBNET_9 = (
    '{"code":200,"success":true,"data":{"id":9,"subnet":"10.20.1.0","mask":"30","sectionId":3,'
    '"description":"capi tiny \\/30","linked_subnet":null,"firewallAddressObject":null,'
    '"vrfId":null,"masterSubnetId":0,"allowRequests":0,"vlanId":null,"showName":0,"device":0,'
    '"permissions":null,"pingSubnet":0,"discoverSubnet":0,"resolveDNS":0,"DNSrecursive":0,'
    '"DNSrecords":0,"nameserverId":0,"scanAgent":null,"customer_id":null,"isFolder":0,'
    '"isFull":0,"isPool":0,"tag":2,"threshold":0,"location":null,"editDate":null,'
    '"lastScan":null,"lastDiscovery":null,"calculation":{"Type":"IPv4","IP address":"\\/",'
    '"Network":"10.20.1.0","Broadcast":"10.20.1.3","Subnet bitmask":"30",'
    '"Subnet netmask":"255.255.255.252","Subnet wildcard":"0.0.0.3","Min host IP":"10.20.1.1",'
    '"Max host IP":"10.20.1.2","Number of hosts":"2","Subnet Class":"private A"}},"time":0.002}'
)
# 3l: GET /subnets/9/usage/ on the exhausted /30
USAGE_9_FULL = (
    '{"code":200,"success":true,"data":{"Used":2,"Reserved":0,"Used_percent":100,"used":"2",'
    '"Reserved_percent":0,"freehosts":"0","freehosts_percent":0,"maxhosts":"2"},"time":0.001}'
)
# 3i-1: POST /addresses/first_free/9/
CREATED_19 = (
    '{"code":201,"success":true,"message":"Address created","id":"19","data":"10.20.1.1",'
    '"time":0.009}'
)
# 5a: POST /addresses/ with an explicit ip (no data)
CREATED_21 = '{"code":201,"success":true,"message":"Address created","id":"21","time":0.006}'
# 5c: an ip phpIPAM does not accept in the subnet
NOT_VALID_FOR_SUBNET = (
    '{"code":500,"success":false,"message":"10.30.0.5 is not a valid address for subnet '
    '10.20.0.0\\/24","time":0.002}'
)
# 2i: GET /subnets/9999/...
SUBNET_9999 = '{"code":400,"success":false,"message":"Invalid subnet Id (9999)","time":0.001}'
# 2i: GET /subnets/{id}/addresses/ of a subnet deleted meanwhile
ADDRESSES_OF_SUBNET_7_GONE = (
    '{"code":404,"success":false,"message":"Invalid subnet Id (7)","time":0.001}'
)
# 2m: GET /subnets/{id}/addresses/ on an empty subnet
NO_ADDRESSES = '{"code":404,"success":false,"message":"No addresses found","time":0.002}'
# 4i: GET /addresses/search/{ip}/ without a row
ADDRESS_NOT_FOUND = '{"code":404,"success":false,"message":"Address not found","time":0.002}'
# 6a / 10c
DELETED = '{"code":200,"success":true,"message":"Address deleted","time":0.007}'
UPDATED = '{"code":200,"success":true,"message":"Address updated","time":0.01}'

_ROW_TAIL: dict[str, Any] = {
    "mac": None,
    "owner": None,
    "tag": 2,
    "deviceId": None,
    "location": None,
    "port": None,
    "note": None,
    "lastSeen": "1970-01-01 00:00:01",
    "excludePing": 0,
    "PTRignore": 0,
    "PTR": 0,
    "firewallAddressObject": None,
    "editDate": None,
    "customer_id": None,
}

UNTIL = 1_800_000_000  # 2027-01-15T08:00:00Z


def row(
    address_id: int,
    subnet_id: int,
    ip: str,
    hostname: str | None,
    description: str | None = "capi claim",
    *,
    is_gateway: int = 0,
    note: str | None = None,
) -> dict[str, Any]:
    """One address row as phpIPAM lists it (2c, 4a, 4h: keys in phpIPAM's order; ``note``
    and ``owner`` as section 12 shows them)."""
    return {
        "id": address_id,
        "subnetId": subnet_id,
        "ip": ip,
        "is_gateway": is_gateway,
        "description": description,
        "hostname": hostname,
        **_ROW_TAIL,
        "note": note,
    }


#: The note `OWNER` writes (section 12).
NOTE = OWNER_FIELDS["note"]


def rows(*data: dict[str, Any]) -> str:
    """A 200 answer listing ``data`` (search_hostname, search, subnets/{id}/addresses)."""
    return json.dumps({"code": 200, "success": True, "data": list(data), "time": 0.001})


GATEWAY_ROW = row(11, 7, "10.20.0.1", "gw.capi-test", "gateway", is_gateway=1)


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def pool(sleeps: list[float]) -> Iterator[Callable[..., PHPIPAMBackend]]:
    """Build a backend for the subnets given (ids or `SubnetRef`), default [9, 7]."""
    made: list[PHPIPAMBackend] = []

    def factory(*subnets: int | SubnetRef, **overrides: Any) -> PHPIPAMBackend:
        refs = tuple(
            s if isinstance(s, SubnetRef) else SubnetRef(subnet_id=s) for s in subnets or (9, 7)
        )
        fields: dict[str, Any] = {
            "endpoint": ENDPOINT,
            "app_id": "capi",
            "subnets": refs,
            "username": USERNAME,
            "password": PASSWORD,
            "retry": RetryPolicy(
                attempts=3,
                initial_delay_seconds=0.0,
                max_delay_seconds=0.0,
                total_seconds=60.0,
                sleep=sleeps.append,
            ),
        }
        fields.update(overrides)
        backend = PHPIPAMBackend(PHPIPAMConfig(**fields), endpoints=FlowControl(max_concurrent=16))
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend.close()


def prime(rsps: responses.RequestsMock, *subnets: int) -> None:
    """Login and the facts (``GET subnets/{id}/``) of each subnet."""
    add_login(rsps)
    answers = {7: SUBNET_7, 8: SUBNET_8, 9: SUBNET_9}
    for subnet in subnets or (9, 7):
        add(rsps, "GET", f"subnets/{subnet}/", answers[subnet])


def calls_to(rsps: responses.RequestsMock, method: str, path: str) -> int:
    return urls(rsps).count(f"{method} {BASE}/{path}")


# ---------------------------------------------------------------- config


def test_single_subnet_arguments_are_a_one_entry_pool() -> None:
    config = PHPIPAMConfig(
        endpoint=ENDPOINT, app_id="capi", subnet="10.20.0.0/24", gateway="10.20.0.254", app_code="c"
    )
    assert config.effective_subnets == (SubnetRef(cidr="10.20.0.0/24", gateway="10.20.0.254"),)
    single = PHPIPAMConfig(endpoint=ENDPOINT, app_id="capi", subnet_id=7, app_code="c")
    assert single.effective_subnets == (SubnetRef(subnet_id=7),)
    # Callers copy configs with dataclasses.replace (the e2e tests do): both forms survive it.
    assert dataclasses.replace(single, subnet_id=8).effective_subnets == (SubnetRef(subnet_id=8),)
    assert dataclasses.replace(config, app_code="d").effective_subnets == config.effective_subnets


def test_pool_overrides_are_folded_into_entries_without_their_own() -> None:
    config = PHPIPAMConfig(
        endpoint=ENDPOINT,
        app_id="capi",
        app_code="c",
        gateway="10.20.0.1",
        prefix=23,
        subnets=(
            SubnetRef(subnet_id=7),
            SubnetRef(cidr="2001:DB8:20::/64", gateway="2001:DB8:20::1", prefix=56),
        ),
    )
    assert config.effective_subnets == (
        SubnetRef(subnet_id=7, gateway="10.20.0.1", prefix=23),
        SubnetRef(cidr="2001:db8:20::/64", gateway="2001:db8:20::1", prefix=56),
    )
    assert dataclasses.replace(config, gateway=None).effective_subnets[0] == SubnetRef(
        subnet_id=7, prefix=23
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"subnets": (SubnetRef(subnet_id=7),), "subnet_id": 7},
        {"subnets": (SubnetRef(subnet_id=7),), "subnet": "10.20.0.0/24"},
        {"subnets": tuple(SubnetRef(subnet_id=n) for n in range(1, MAX_SUBNETS + 2))},
        {"subnets": (SubnetRef(subnet_id=7), SubnetRef(subnet_id=7))},
        {"subnets": (SubnetRef(cidr="10.20.0.0/24"), SubnetRef(cidr="10.20.0.0/24"))},
        {"subnets": (SubnetRef(),)},
        {"subnets": (SubnetRef(subnet_id=0),)},
        {"subnets": (SubnetRef(cidr="10.20.0.1/24"),)},
        {"subnets": (SubnetRef(cidr="10.20.0.0/24", gateway="2001:db8::1"),)},
        {"subnets": (SubnetRef(cidr="10.20.0.0/24", prefix=33),)},
        {"subnets": (SubnetRef(subnet_id=7, gateway="not-an-ip"),)},
        {"subnets": (SubnetRef(subnet_id=7),), "prefix": -1},
        {"subnets": ()},
    ],
)
def test_invalid_subnets_are_rejected(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"subnet|prefix|gateway"):
        PHPIPAMConfig(endpoint=ENDPOINT, app_id="capi", app_code="c", **fields)


# ---------------------------------------------------------------- describe


def test_describe_subnets_reports_each_subnet_with_its_overrides_after_one_login(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/9/", SUBNET_9)
    add(rsps, "GET", "subnets/9/usage/", USAGE_9_FULL)
    add(rsps, "GET", "subnets/7/", SUBNET_7)
    add(rsps, "GET", "subnets/7/usage/", USAGE_7)

    backend = pool(SubnetRef(subnet_id=9, gateway="10.20.1.254", prefix=24), 7)
    infos = backend.describe_subnets()

    assert isinstance(backend, IPAMBackend)
    assert infos == [
        SubnetInfo(cidr="10.20.1.0/30", prefix=24, gateway="10.20.1.254", total=2, used=2, free=0),
        SubnetInfo(
            cidr="10.20.0.0/24", prefix=24, gateway="10.20.0.1", total=254, used=1, free=253
        ),
    ]
    assert urls(rsps) == [
        f"POST {BASE}/user/",
        f"GET {BASE}/subnets/9/",
        f"GET {BASE}/subnets/9/usage/",
        f"GET {BASE}/subnets/7/",
        f"GET {BASE}/subnets/7/usage/",
    ]


def test_a_missing_subnet_of_the_pool_is_named(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", SUBNET_7)
    add(rsps, "GET", "subnets/7/usage/", USAGE_7)
    add(rsps, "GET", "subnets/9999/", SUBNET_9999, 400)

    with pytest.raises(SubnetNotFoundError, match=r"9999"):
        pool(7, 9999).describe_subnets()


def test_an_entry_with_id_and_cidr_must_agree_with_phpipam(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", SUBNET_7)
    add(rsps, "GET", "subnets/7/usage/", USAGE_7)

    assert pool(SubnetRef(subnet_id=7, cidr="10.20.0.0/24")).describe_subnets()[0].total == 254
    with pytest.raises(SubnetNotFoundError, match=r"subnet 7 is 10\.20\.0\.0/24, not 10\.30"):
        pool(SubnetRef(subnet_id=7, cidr="10.30.0.0/24")).describe_subnets()


def test_subnets_named_by_cidr_are_resolved_once_each(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    cidr_9 = json.dumps(
        {
            "code": 200,
            "success": True,
            "data": [dict(json.loads(SUBNET_9)["data"], id=9)],
            "time": 0.001,
        }
    )
    add_login(rsps)
    add(rsps, "GET", "subnets/cidr/10.20.1.0/30/", cidr_9)
    add(rsps, "GET", "subnets/9/", SUBNET_9)
    add(rsps, "GET", "subnets/9/usage/", USAGE_9_FULL)
    add(rsps, "GET", "subnets/7/", SUBNET_7)
    add(rsps, "GET", "subnets/7/usage/", USAGE_7)

    backend = pool(SubnetRef(cidr="10.20.1.0/30"), 7)
    backend.describe_subnets()
    backend.describe_subnets()

    assert calls_to(rsps, "GET", "subnets/cidr/10.20.1.0/30/") == 1
    assert calls_to(rsps, "GET", "subnets/9/usage/") == 2


# ---------------------------------------------------------------- first free over subnets


def test_first_free_takes_the_first_subnet_that_has_an_address(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/tiny.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/9/", CREATED_19, 201)

    allocation = pool().allocate("tiny.claim-1", OWNER)

    assert allocation == Allocation(
        address="10.20.1.1",
        prefix=30,
        gateway=None,
        hostname="tiny.claim-1",
        ref="19",
        subnet="10.20.1.0/30",
        description=OWNER_FIELDS["description"],
        owner=OWNER,
    )
    assert calls_to(rsps, "POST", "addresses/first_free/7/") == 0


@pytest.mark.parametrize(
    ("full", "status"),
    [
        (NO_FREE, 404),
        (NO_FREE.replace("found", "found (subnet is full)"), 404),
        (legacy_not_found("No free addresses found"), 200),
    ],
    ids=["no-free", "isFull", "phpipam-1.4"],
)
def test_a_full_subnet_is_skipped_for_the_next_with_its_prefix_and_gateway(
    rsps: responses.RequestsMock,
    pool: Callable[..., PHPIPAMBackend],
    sleeps: list[float],
    full: str,
    status: int,
) -> None:
    prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/9/", full, status)  # 3i-3
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)

    allocation = pool().allocate("default.claim-1", OWNER)

    assert (allocation.address, allocation.prefix, allocation.gateway, allocation.subnet) == (
        "10.20.0.2",
        24,
        "10.20.0.1",
        "10.20.0.0/24",
    )
    assert urls(rsps)[3:] == [
        f"GET {BASE}/addresses/search_hostname/default.claim-1/",
        f"POST {BASE}/addresses/first_free/9/",
        f"POST {BASE}/addresses/first_free/7/",
    ]
    assert sleeps == []  # a full subnet is an answer, not a failure to retry


def test_pool_is_exhausted_only_when_every_subnet_is_full(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend], sleeps: list[float]
) -> None:
    prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/9/", NO_FREE, 404)
    add(rsps, "POST", "addresses/first_free/7/", NO_FREE, 404)

    with pytest.raises(
        SubnetExhaustedError, match=r"all 2 subnets.*10\.20\.1\.0/30.*10\.20\.0\.0/24"
    ):
        pool().allocate("default.claim-1", OWNER)
    assert calls_to(rsps, "POST", "addresses/first_free/9/") == 1
    assert calls_to(rsps, "POST", "addresses/first_free/7/") == 1
    assert sleeps == []


def test_entry_overrides_are_reported_on_allocations(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/tiny.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/9/", CREATED_19, 201)

    allocation = pool(SubnetRef(subnet_id=9, gateway="10.20.9.1", prefix=22), 7).allocate(
        "tiny.claim-1", OWNER
    )

    assert (allocation.prefix, allocation.gateway) == (22, "10.20.9.1")


# ---------------------------------------------------------------- find


def test_find_searches_every_subnet_with_one_request(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    # 4b: the 2nd and later rows of a hostname carry ip as a decimal integer.
    prime(rsps)
    add(
        rsps,
        "GET",
        "addresses/search_hostname/default.claim-1/",
        rows(
            row(5, 3, "10.0.0.9", "default.claim-1"),  # not a subnet of the pool
            row(19, 9, "169083137", "default.claim-1"),  # 10.20.1.1
            row(24, 7, "169082884", "default.claim-1"),  # 10.20.0.4, younger
        ),
    )

    found = pool(7, 9).find("default.claim-1")

    assert found == Allocation(
        address="10.20.1.1",
        prefix=30,
        gateway=None,
        hostname="default.claim-1",
        ref="19",
        subnet="10.20.1.0/30",
        description="capi claim",
    )
    searches = [u for u in urls(rsps) if "search" in u or "/addresses/" in u]
    assert searches == [f"GET {BASE}/addresses/search_hostname/default.claim-1/"]


def test_find_never_adopts_a_quarantined_row(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    # The hostname of a quarantined row no longer matches; should a person rename it back and
    # leave the mark, it still is not the claim's.
    prime(rsps)
    add(
        rsps,
        "GET",
        "addresses/search_hostname/default.claim-1/",
        rows(row(12, 7, "10.20.0.2", "default.claim-1", quarantine_mark(UNTIL, "capi claim 1"))),
    )

    assert pool().find("default.claim-1") is None


# ---------------------------------------------------------------- requested address


def test_requested_address_is_created_in_its_subnet(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.static-50/", HOSTNAME_NOT_FOUND, 404)
    add(
        rsps,
        "POST",
        "addresses/",
        CREATED_21,
        201,
        headers={"Location": "/api/capi/addresses/21/"},
        json_body={
            "subnetId": 7,
            "ip": "10.20.0.50",
            "hostname": "default.static-50",
            **OWNER_FIELDS,
        },
    )

    allocation = pool().allocate("default.static-50", OWNER, address=" 10.20.0.50 ")

    assert allocation == Allocation(
        address="10.20.0.50",
        prefix=24,
        gateway="10.20.0.1",
        hostname="default.static-50",
        ref="21",
        subnet="10.20.0.0/24",
        description=OWNER_FIELDS["description"],
        owner=OWNER,
    )
    assert calls_to(rsps, "POST", "addresses/first_free/9/") == 0


def test_requested_address_already_held_by_the_hostname_is_returned_without_post(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    prime(rsps)
    add(
        rsps,
        "GET",
        "addresses/search_hostname/default.static-50/",
        rows(row(21, 7, "10.20.0.50", "default.static-50", "static", note=NOTE)),
    )

    allocation = pool().allocate("default.static-50", OWNER, address="10.20.0.50")

    assert (allocation.address, allocation.ref) == ("10.20.0.50", "21")
    assert calls_to(rsps, "POST", "addresses/") == 0
    assert calls_to(rsps, "PATCH", "addresses/21/") == 0


@pytest.mark.parametrize(
    ("race", "status"), [(IP_EXISTS, 409), (DUPLICATE_ENTRY, 500)], ids=["409", "500-duplicate"]
)
def test_requested_address_held_by_someone_else_names_the_holder(
    rsps: responses.RequestsMock,
    pool: Callable[..., PHPIPAMBackend],
    sleeps: list[float],
    race: str,
    status: int,
) -> None:
    # 5b: someone holds it (or took it by first-free a moment before our POST: the 500).
    prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.static-50b/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/", race, status)
    add(
        rsps,
        "GET",
        "addresses/search/10.20.0.50/",
        rows(
            row(3, 1, "10.20.0.50", "printer.other-section"),
            row(21, 7, "10.20.0.50", "default.static-50", "static"),
        ),
    )

    with pytest.raises(AddressUnavailableError) as caught:
        pool().allocate("default.static-50b", OWNER, address="10.20.0.50")

    assert (caught.value.address, caught.value.holder) == ("10.20.0.50", "default.static-50")
    assert "10.20.0.50" in caught.value.message
    assert "default.static-50" in caught.value.message
    assert not caught.value.retryable
    assert calls_to(rsps, "POST", "addresses/") == 1
    assert sleeps == []


def test_requested_address_whose_create_answer_was_lost_is_ours(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    # Our first POST created the row but its answer never came; the repeat gets 409.
    prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.static-50/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/", IP_EXISTS, 409)
    add(
        rsps,
        "GET",
        "addresses/search/10.20.0.50/",
        rows(row(21, 7, "10.20.0.50", "DEFAULT.static-50", "static", note=NOTE)),
    )

    allocation = pool().allocate("default.static-50", OWNER, address="10.20.0.50")

    assert (allocation.address, allocation.ref, allocation.hostname) == (
        "10.20.0.50",
        "21",
        "default.static-50",
    )


def test_requested_address_freed_again_after_the_conflict_is_tried_again(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend], sleeps: list[float]
) -> None:
    prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.static-50/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/", IP_EXISTS, 409)
    add(rsps, "GET", "addresses/search/10.20.0.50/", ADDRESS_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/", CREATED_21, 201)

    allocation = pool().allocate("default.static-50", OWNER, address="10.20.0.50")

    assert allocation.ref == "21"
    assert calls_to(rsps, "POST", "addresses/") == 2
    assert len(sleeps) == 1


def test_requested_address_held_by_a_quarantined_row_is_refused(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/", IP_EXISTS, 409)
    mark = quarantine_mark(UNTIL, "capi claim 1")
    add(
        rsps,
        "GET",
        "addresses/search/10.20.0.2/",
        rows(row(12, 7, "10.20.0.2", "quarantined.default.claim-1", mark)),
    )

    with pytest.raises(AddressUnavailableError) as caught:
        pool().allocate("default.claim-1", OWNER, address="10.20.0.2")
    assert caught.value.holder == "quarantined.default.claim-1"


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("10.30.0.5", "outside every subnet"),
        ("2001:db8:20::5", "outside every subnet"),
        ("10.20.0.1", "gateway"),
        ("10.20.0.0", "network address"),
        ("10.20.0.255", "broadcast address"),
        ("10.20.1.3", "broadcast address"),
    ],
)
def test_requested_address_outside_the_pool_or_never_handed_out_is_refused_without_a_write(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend], address: str, why: str
) -> None:
    prime(rsps)

    with pytest.raises(AddressUnavailableError, match=why) as caught:
        pool().allocate("default.claim-1", OWNER, address=address)

    assert (caught.value.address, caught.value.holder) == (address, None)
    assert not any(call.request.method != "GET" for call in rsps.calls[1:])


def test_requested_ipv6_address_in_any_notation_and_the_anycast_address(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    # 7h: explicit IPv6 create; the subnet-router anycast address (7a-1) is never handed out.
    prime(rsps, 7, 8)
    add(rsps, "GET", "addresses/search_hostname/v6.static-50/", HOSTNAME_NOT_FOUND, 404)
    add(
        rsps,
        "POST",
        "addresses/",
        CREATED_21,
        201,
        json_body={
            "subnetId": 8,
            "ip": "2001:db8:20::50",
            "hostname": "v6.static-50",
            **OWNER_FIELDS,
        },
    )
    backend = pool(7, 8)

    granted = backend.allocate("v6.static-50", OWNER, address="2001:0DB8:0020::0050")
    with pytest.raises(AddressUnavailableError, match="anycast"):
        backend.allocate("v6.static-51", OWNER, address="2001:db8:20::")

    assert (granted.address, granted.prefix, granted.gateway) == ("2001:db8:20::50", 64, None)


def test_requested_address_is_refused_when_the_hostname_holds_another(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    # One address per claim (as the Infoblox client): a hostname that already holds another
    # address of the pool never gets a second one; nothing is registered.
    prime(rsps)
    add(
        rsps,
        "GET",
        "addresses/search_hostname/default.claim-1/",
        rows(row(12, 7, "10.20.0.2", "default.claim-1")),
    )

    with pytest.raises(AddressUnavailableError, match=r"already holds 10\.20\.0\.2 ") as caught:
        pool().allocate("default.claim-1", OWNER, address="10.20.0.50")

    assert caught.value.address == "10.20.0.50"
    assert calls_to(rsps, "POST", "addresses/") == 0


def test_requested_address_that_is_no_ip_is_refused_without_a_request(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    with pytest.raises(AddressUnavailableError, match="not an IP address") as caught:
        pool().allocate("default.claim-1", OWNER, address="10.20.0.300")
    assert caught.value.holder is None
    assert len(rsps.calls) == 0


def test_requested_address_phpipam_finds_invalid_is_refused_not_retried(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend], sleeps: list[float]
) -> None:
    # 5c: phpIPAM's own check (e.g. its subnet changed since the facts were read).
    prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/", NOT_VALID_FOR_SUBNET, 500)

    with pytest.raises(AddressUnavailableError, match="not a valid address"):
        pool().allocate("default.claim-1", OWNER, address="10.20.0.77")
    assert calls_to(rsps, "POST", "addresses/") == 1
    assert sleeps == []


def test_first_free_after_losing_to_a_requested_address_takes_another(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    prime(rsps, 7)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", IP_EXISTS, 409)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_13, 201)

    allocation = pool(7).allocate("default.claim-2", OWNER)

    assert allocation.ref == "13"


# ---------------------------------------------------------------- release, quarantine, purge


def test_release_with_quarantine_renames_and_marks_the_rows(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(
        rsps,
        "GET",
        "addresses/search_hostname/default.claim-1/",
        rows(
            row(5, 3, "10.0.0.9", "default.claim-1"),  # another subnet: not ours to touch
            row(12, 7, "169082882", "default.claim-1", "ipam-bridge default/claim-1"),
        ),
    )
    expected = {
        "hostname": "quarantined.default.claim-1",
        "description": "ipam-bridge quarantined until 2027-01-15T08:00:00Z: ipam-bridge",
    }
    assert (
        expected["description"]
        == quarantine_mark(UNTIL, "ipam-bridge default/claim-1")[:64].rstrip()
    )
    add(rsps, "PATCH", "addresses/12/", UPDATED, json_body=expected)

    assert pool().release("default.claim-1", OWNER, quarantine_until=UNTIL) is True

    assert [c.request.method for c in rsps.calls].count("PATCH") == 1
    assert calls_to(rsps, "DELETE", "addresses/12/") == 0
    assert quarantined_until(expected["description"]) == UNTIL


def test_release_deletes_rows_of_every_subnet_of_the_pool(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(
        rsps,
        "GET",
        "addresses/search_hostname/default.claim-1/",
        rows(
            row(5, 3, "10.0.0.9", "default.claim-1"),
            row(12, 7, "169082882", "default.claim-1"),
            row(19, 9, "169083137", "default.claim-1"),
        ),
    )
    add(rsps, "DELETE", "addresses/12/", DELETED)
    add(rsps, "DELETE", "addresses/19/", DELETED)

    assert pool().release("default.claim-1", OWNER) is True
    deletes = [u for u in urls(rsps) if u.startswith("DELETE")]
    assert deletes == [f"DELETE {BASE}/addresses/12/", f"DELETE {BASE}/addresses/19/"]


def test_release_after_quarantine_finds_nothing(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)

    assert pool().release("default.claim-1", OWNER, quarantine_until=UNTIL) is False


OTHER_NOTE = "ipam-bridge cluster=a-second-cluster claim=default/claim-1"


def test_release_deletes_only_the_rows_the_claim_owns(
    rsps: responses.RequestsMock,
    pool: Callable[..., PHPIPAMBackend],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Same hostname in one IPAM, written by two management clusters (no hostnameSuffix).
    add_login(rsps)
    add(
        rsps,
        "GET",
        "addresses/search_hostname/default.claim-1/",
        rows(
            row(12, 7, "10.20.0.2", "default.claim-1", note=OTHER_NOTE),
            row(13, 7, "10.20.0.3", "default.claim-1", note=NOTE),
            row(14, 7, "10.20.0.4", "default.claim-1", "ipam-bridge default/claim-1 cluster m1"),
        ),
    )
    add(rsps, "DELETE", "addresses/13/", DELETED)
    add(rsps, "DELETE", "addresses/14/", DELETED)  # the previous release's: ours

    with caplog.at_level(logging.INFO, logger="backends.phpipam"):
        assert pool().release("default.claim-1", OWNER) is True

    deletes = [u for u in urls(rsps) if u.startswith("DELETE")]
    assert deletes == [f"DELETE {BASE}/addresses/13/", f"DELETE {BASE}/addresses/14/"]
    assert "a-second-cluster" in caplog.text
    assert calls_to(rsps, "GET", "subnets/7/") == 0  # the owner alone decided


@pytest.mark.parametrize("until", [None, UNTIL], ids=["delete", "quarantine"])
def test_release_of_another_clusters_row_only_is_false_and_writes_nothing(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend], until: float | None
) -> None:
    add_login(rsps)
    search = rows(row(12, 7, "10.20.0.2", "default.claim-1", note=OTHER_NOTE))
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", search)

    assert pool().release("default.claim-1", OWNER, quarantine_until=until) is False
    assert [c.request.method for c in rsps.calls] == ["POST", "GET"]  # login, search


def test_release_deletes_another_owners_row_at_the_address_the_ipaddress_names(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    # Moved from another management cluster: its IPAddress names 10.20.0.2.
    prime(rsps)
    search = rows(row(12, 7, "169082882", "default.claim-1", note=OTHER_NOTE))
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", search)
    add(rsps, "DELETE", "addresses/12/", DELETED)

    assert pool().release("default.claim-1", OWNER, address="10.20.0.2") is True
    assert pool().release("default.claim-1", OWNER, address="10.20.0.9") is False


def test_purge_deletes_only_the_quarantined_rows_of_this_cluster(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    now = float(UNTIL)
    prime(rsps, 7)
    ended = quarantine_mark(now - 1, "ipam-bridge default/claim-1")[:64].rstrip()
    add(
        rsps,
        "GET",
        "subnets/7/addresses/",
        rows(
            row(12, 7, "10.20.0.2", "quarantined.default.claim-1", ended, note=OTHER_NOTE),
            row(13, 7, "10.20.0.3", "quarantined.default.claim-1", ended, note=NOTE),
            row(14, 7, "10.20.0.4", "quarantined.default.claim-2", ended),  # previous release
        ),
    )
    add(rsps, "DELETE", "addresses/13/", DELETED)
    add(rsps, "DELETE", "addresses/14/", DELETED)

    assert pool(7).purge_quarantined(now, CLUSTER) == ["10.20.0.3", "10.20.0.4"]


def _subnet_7_rows(now: float) -> str:
    return rows(
        GATEWAY_ROW,
        row(12, 7, "10.20.0.2", "quarantined.default.claim-1", quarantine_mark(now - 1, "a")),
        row(13, 7, "10.20.0.3", "quarantined.default.claim-2", quarantine_mark(now + 60, "b")),
        row(14, 7, "10.20.0.4", "quarantined.by-hand", "a person's note"),
        row(15, 7, "10.20.0.5", "default.claim-5", quarantine_mark(now - 60)),
        row(16, 7, "10.20.0.6", "QUARANTINED.default.claim-6", quarantine_mark(now)),
    )


def test_purge_deletes_only_rows_whose_quarantine_ended(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    now = float(UNTIL)
    prime(rsps)
    add(rsps, "GET", "subnets/9/addresses/", NO_ADDRESSES, 404)
    add(rsps, "GET", "subnets/7/addresses/", _subnet_7_rows(now))
    add(rsps, "DELETE", "addresses/12/", DELETED)
    add(rsps, "DELETE", "addresses/16/", DELETED)

    assert pool().purge_quarantined(now, CLUSTER) == ["10.20.0.2", "10.20.0.6"]

    deletes = [u for u in urls(rsps) if u.startswith("DELETE")]
    assert deletes == [f"DELETE {BASE}/addresses/12/", f"DELETE {BASE}/addresses/16/"]
    assert calls_to(rsps, "GET", "subnets/9/addresses/") == 1
    assert calls_to(rsps, "GET", "subnets/7/addresses/") == 1


# ---------------------------------------------------------------- entries


@pytest.mark.parametrize("convert", [str, stringified], ids=["native-types", "all-strings"])
def test_entries_lists_every_row_with_one_request_per_subnet(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend], convert: Any
) -> None:
    prime(rsps)
    add(rsps, "GET", "subnets/9/addresses/", NO_ADDRESSES, 404)
    add(
        rsps,
        "GET",
        "subnets/7/addresses/",
        convert(
            rows(
                GATEWAY_ROW,
                row(
                    12, 7, "10.20.0.2", "default.claim-1", "ipam-bridge default/claim-1", note=NOTE
                ),
                row(13, 7, "10.20.0.3", "quarantined.default.claim-2", quarantine_mark(UNTIL)),
                row(14, 7, "10.20.0.4", None, None),
                row(
                    15, 7, "10.20.0.5", "default.claim-1", "ipam-bridge default/claim-1 cluster m1"
                ),
            )
        ),
    )

    backend = pool()
    found = backend.entries()

    def entry(
        ref: str, ip: str, host: str, desc: str, until: float | None = None, owner: Any = None
    ) -> Allocation:
        return Allocation(ip, 24, "10.20.0.1", host, ref, "10.20.0.0/24", desc, until, owner)

    previous_release = EntryOwner("", "default/claim-1")
    assert found == [
        entry("11", "10.20.0.1", "gw.capi-test", "gateway"),
        entry("12", "10.20.0.2", "default.claim-1", "ipam-bridge default/claim-1", None, OWNER),
        entry("13", "10.20.0.3", "quarantined.default.claim-2", quarantine_mark(UNTIL), UNTIL),
        entry("14", "10.20.0.4", "", ""),
        entry(
            "15",
            "10.20.0.5",
            "default.claim-1",
            "ipam-bridge default/claim-1 cluster m1",
            None,
            previous_release,
        ),
    ]
    lists = [u for u in urls(rsps) if u.endswith("/addresses/")]
    assert lists == [f"GET {BASE}/subnets/9/addresses/", f"GET {BASE}/subnets/7/addresses/"]

    backend.entries()  # facts are cached: a later audit costs the list requests only
    assert calls_to(rsps, "GET", "subnets/7/") == 1
    assert calls_to(rsps, "GET", "subnets/7/addresses/") == 2


def test_entries_of_an_unknown_subnet_is_subnet_not_found(
    rsps: responses.RequestsMock, pool: Callable[..., PHPIPAMBackend]
) -> None:
    # 2i: the facts are known, then the subnet is deleted in phpIPAM.
    prime(rsps, 7)
    add(rsps, "GET", "addresses/search_hostname/x/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "GET", "subnets/7/addresses/", ADDRESSES_OF_SUBNET_7_GONE, 404)

    backend = pool(7)
    assert backend.find("x") is None
    with pytest.raises(SubnetNotFoundError):
        backend.entries()
