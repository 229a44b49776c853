"""Unit tests of backends.phpipam against `responses`, with the answers of a real phpIPAM 1.8.2.

Bodies and headers are copied from /work/shared/reference/phpipam-api.md (section numbers in
the comments); a few are derived from them where the reference describes but does not show an
answer (phpIPAM <= 1.4's HTTP 200 + success false, stringified values).
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import logging
import re
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
import responses
from responses import matchers

from backends.base import Allocation, EntryOwner, IPAMBackend, SubnetInfo
from backends.errors import (
    AuthenticationFailedError,
    BackendError,
    BackendUnavailableError,
    ConflictError,
    EntryOwnedError,
    InvalidRequestError,
    SubnetExhaustedError,
    SubnetNotFoundError,
    TLSVerificationError,
)
from backends.flowcontrol import FlowControl, endpoint_key
from backends.phpipam import (
    RESERVED_BROADCAST_HOSTNAME,
    RESERVED_GATEWAY_DESCRIPTION,
    RESERVED_GATEWAY_HOSTNAME,
    RESERVED_NETWORK_HOSTNAME,
    PHPIPAMBackend,
    PHPIPAMConfig,
)
from backends.retry import RetryPolicy

ENDPOINT = "http://127.0.0.1:8080/api"
BASE = f"{ENDPOINT}/capi"
JSON = "application/json; charset=utf-8"
USERNAME = "Admin"
PASSWORD = "ipamadmin"
TOKEN = "mecHgCchmVl2mi0K70QqJIzm"
TOKEN2 = "2BWNjbEGG77nwRcS3biqLwW2"
APP_CODE = "Zq3fVb7xKpL0aa9wE2rTyUi1oPl4mN8c"
ATTEMPTS = 3
#: This management cluster (the uid of its kube-system namespace) and a claim of it.
CLUSTER = "3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f"
OWNER = EntryOwner(CLUSTER, "default/claim-1")

# ---------------------------------------------------------------- recorded answers
# 1a / 9l: POST /user/
LOGIN_OK = (
    '{"code":200,"success":true,"data":{"token":"mecHgCchmVl2mi0K70QqJIzm",'
    '"expires":"2026-11-22 16:41:03"},"time":0.011}'
)
LOGIN_OK_2 = (
    '{"code":200,"success":true,"data":{"token":"2BWNjbEGG77nwRcS3biqLwW2",'
    '"expires":"2026-11-22 16:43:00"},"time":0.007}'
)
# 1b, 1d, 11a
WRONG_PASSWORD = (
    '{"code":500,"success":false,"message":"Invalid username or password","time":0.007}'
)
NO_CREDENTIALS = (
    '{"code":400,"success":false,"message":"Please provide username and password","time":0}'
)
BLOCKED = (
    '{"code":500,"success":false,"message":"Your IP has been blocked for 5 minutes because of '
    'excessive login failures","time":0}'
)
# 1f / 9h: bogus or expired token on a resource controller
UNAUTHORIZED = '{"code":401,"success":false,"message":"Unauthorized","time":0.001}'
# 1j, 1k, 1m, 10e, 10g
INVALID_APP = '{"code":400,"success":false,"message":"Invalid application id","time":0}'
SSL_REQUIRED = (
    '{"code":503,"success":false,"message":"SSL connection is required for API","time":0.002}'
)
INVALID_PERMISSIONS = '{"code":401,"success":false,"message":"invalid permissions","time":0.001}'
INVALID_CONTROLLER = '{"code":400,"success":false,"message":"Invalid controller","time":0.001}'
API_DISABLED = '{"code":503,"success":false,"message":"API server disabled","time":0}'
# A.2 table (same envelope, message from api/index.php)
APP_DISABLED = '{"code":503,"success":false,"message":"Application disabled","time":0}'
# 1h: GET /subnets/7/
SUBNET_7 = (
    '{"code":200,"success":true,"data":{"id":7,"subnet":"10.20.0.0","mask":"24","sectionId":3,'
    '"description":"capi v4 test","linked_subnet":null,"firewallAddressObject":null,"vrfId":null,'
    '"masterSubnetId":0,"allowRequests":0,"vlanId":null,"showName":0,"device":0,'
    '"permissions":null,"pingSubnet":0,"discoverSubnet":0,"resolveDNS":0,"DNSrecursive":0,'
    '"DNSrecords":0,"nameserverId":0,"scanAgent":null,"customer_id":null,"isFolder":0,"isFull":0,'
    '"isPool":0,"tag":2,"threshold":0,"location":null,"editDate":null,"lastScan":null,'
    '"lastDiscovery":null,"gatewayId":11,"gateway":{"ip_addr":"10.20.0.1","id":11},'
    '"calculation":{"Type":"IPv4","IP address":"\\/","Network":"10.20.0.0",'
    '"Broadcast":"10.20.0.255","Subnet bitmask":"24","Subnet netmask":"255.255.255.0",'
    '"Subnet wildcard":"0.0.0.255","Min host IP":"10.20.0.1","Max host IP":"10.20.0.254",'
    '"Number of hosts":"254","Subnet Class":"private A"}},"time":0.002}'
)
# 2a: GET /subnets/7/usage/
USAGE_7 = (
    '{"code":200,"success":true,"data":{"Used":1,"Reserved":0,"Used_percent":0.39,"used":"1",'
    '"Reserved_percent":0,"freehosts":"253","freehosts_percent":99.61,"maxhosts":"254"},'
    '"time":0.006}'
)
# 2d / 2e: GET /subnets/cidr/.../
CIDR_7 = (
    '{"code":200,"success":true,"data":[{"id":7,"subnet":"10.20.0.0","mask":"24","sectionId":3,'
    '"description":"capi v4 test","linked_subnet":null,"firewallAddressObject":null,"vrfId":null,'
    '"masterSubnetId":0,"allowRequests":0,"vlanId":null,"showName":0,"device":0,'
    '"permissions":null,"pingSubnet":0,"discoverSubnet":0,"resolveDNS":0,"DNSrecursive":0,'
    '"DNSrecords":0,"nameserverId":0,"scanAgent":null,"customer_id":null,"isFolder":0,"isFull":0,'
    '"isPool":0,"tag":2,"threshold":0,"location":null,"editDate":null,"lastScan":null,'
    '"lastDiscovery":null}],"time":0.001}'
)
NO_SUBNETS = '{"code":404,"success":false,"message":"No subnets found","time":0.001}'
# 2f / 2g: nonexistent subnet id
SUBNET_9999 = '{"code":400,"success":false,"message":"Invalid subnet Id (9999)","time":0.001}'
USAGE_9999 = '{"code":404,"success":false,"message":"Invalid subnet Id (9999)","time":0.001}'
# 2k / 2o: IPv6 subnet 8, no gateway
SUBNET_8 = (
    '{"code":200,"success":true,"data":{"id":8,"subnet":"2001:db8:20::","mask":"64","sectionId":3,'
    '"description":"capi v6 test","linked_subnet":null,"firewallAddressObject":null,"vrfId":null,'
    '"masterSubnetId":0,"allowRequests":0,"vlanId":null,"showName":0,"device":0,'
    '"permissions":null,"pingSubnet":0,"discoverSubnet":0,"resolveDNS":0,"DNSrecursive":0,'
    '"DNSrecords":0,"nameserverId":0,"scanAgent":null,"customer_id":null,"isFolder":0,"isFull":0,'
    '"isPool":0,"tag":2,"threshold":0,"location":null,"editDate":null,"lastScan":null,'
    '"lastDiscovery":null,"calculation":{"Type":"IPv6","Host address":"\\/",'
    '"Host address (uncompressed)":"\\/","Subnet prefix":"2001:db8:20::\\/64",'
    '"Prefix length":"64","Subnet Reverse DNS":"0.0.0.0.0.2.0.0.8.b.d.0.1.0.0.2.ip6.arpa",'
    '"Min host IP":"2001:db8:20::","Max host IP":"2001:db8:20:0:ffff:ffff:ffff:ffff",'
    '"Number of hosts":"18446744073709551616","Address type":"NET_IPV6"}},"time":0.002}'
)
USAGE_8 = (
    '{"code":200,"success":true,"data":{"Used":0,"Reserved":0,"used":0,"Used_percent":0,'
    '"Reserved_percent":0,"freehosts":"18446744073709551616","freehosts_percent":100,'
    '"maxhosts":"18446744073709551616"},"time":0.002}'
)
# 3a-1, 3a-2, 3i-3: POST /addresses/first_free/{id}/
CREATED_12 = (
    '{"code":201,"success":true,"message":"Address created","id":"12","data":"10.20.0.2",'
    '"time":0.005}'
)
CREATED_13 = (
    '{"code":201,"success":true,"message":"Address created","id":"13","data":"10.20.0.3",'
    '"time":0.014}'
)
NO_FREE = '{"code":404,"success":false,"message":"No free addresses found","time":0.005}'
# 3d
FIRST_FREE_9999 = '{"code":400,"success":false,"message":"Invalid subnet identifier","time":0.001}'
# 4a, 4b, 4c: GET /addresses/search_hostname/{h}/
_ROW_TAIL = (
    '"mac":null,"owner":null,"tag":2,"deviceId":null,"location":null,"port":null,"note":null,'
    '"lastSeen":"1970-01-01 00:00:01","excludePing":0,"PTRignore":0,"PTR":0,'
    '"firewallAddressObject":null,"editDate":null,"customer_id":null}'
)
SEARCH_CLAIM_2 = (
    '{"code":200,"success":true,"data":[{"id":13,"subnetId":7,"ip":"10.20.0.3","is_gateway":0,'
    '"description":"capi claim 2","hostname":"default.claim-2",' + _ROW_TAIL + '],"time":0.001}'
)
SEARCH_CLAIM_1_TWICE = (
    '{"code":200,"success":true,"data":[{"id":12,"subnetId":7,"ip":"10.20.0.2","is_gateway":0,'
    '"description":"capi claim 1","hostname":"default.claim-1",' + _ROW_TAIL + ","
    '{"id":15,"subnetId":7,"ip":"169082885","is_gateway":0,"description":"dup hostname",'
    '"hostname":"default.claim-1",' + _ROW_TAIL + '],"time":0.001}'
)
HOSTNAME_NOT_FOUND = '{"code":404,"success":false,"message":"Hostname not found","time":0.001}'
#: Section 12: the fields ipam-bridge writes for OWNER (create and PATCH bodies).
OWNER_FIELDS = {
    "description": "ipam-bridge default/claim-1",
    "owner": f"ipam-bridge {CLUSTER} default/claim-1",
    "note": f"ipam-bridge cluster={CLUSTER} claim=default/claim-1",
}


def owned_search(
    hostname: str, *, owner: str | None, note: str | None, description: str = "x"
) -> str:
    """A search_hostname answer (4a's shape) with one row of id 13 at 10.20.0.3 (section 12)."""
    row = json.loads(SEARCH_CLAIM_2)["data"][0]
    row.update(hostname=hostname, owner=owner, note=note, description=description)
    return json.dumps({"code": 200, "success": True, "data": [row], "time": 0.001})


#: default.claim-1 at 10.20.0.3 (id 13), written by OWNER.
SEARCH_OWNED = owned_search(
    "default.claim-1",
    owner=OWNER_FIELDS["owner"],
    note=OWNER_FIELDS["note"],
    description=OWNER_FIELDS["description"],
)
# 5b and 8f: the two faces of a lost first-free race
IP_EXISTS = '{"code":409,"success":false,"message":"IP address already exists","time":0.002}'
DUPLICATE_ENTRY = (
    '{"code":500,"success":false,"message":"Error: SQLSTATE[23000]: Integrity constraint '
    "violation: 1062 Duplicate entry '169083393-10' for key 'sid_ip_unique'\",\"time\":0.004}"
)
# 6a, 6b: DELETE /addresses/{id}/
DELETED = '{"code":200,"success":true,"message":"Address deleted","time":0.007}'
NO_SUCH_ADDRESS = '{"code":404,"success":false,"message":"Address does not exist","time":0.007}'
# 7a-1, 7a-2: first_free on the empty IPv6 subnet 8
CREATED_V6_NET = (
    '{"code":201,"success":true,"message":"Address created","id":"25","data":"2001:db8:20::",'
    '"time":0.005}'
)
CREATED_V6_1 = (
    '{"code":201,"success":true,"message":"Address created","id":"26","data":"2001:db8:20::1",'
    '"time":0.013}'
)
# 10c: PATCH /addresses/{id}/
UPDATED = '{"code":200,"success":true,"message":"Address updated","time":0.01}'

ERROR_HEADERS = {"Connection": "close"}
UNAUTHORIZED_HEADERS = {"Location": "/api//user/"}


def stringified(body: str) -> str:
    """The same answer with every scalar as a string (``Api-Stringify-Results: true``, 10b)."""

    def conv(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: conv(v) for k, v in value.items()}
        if isinstance(value, list):
            return [conv(v) for v in value]
        if isinstance(value, bool) or value is None:
            return value
        return str(value)

    envelope = json.loads(body)
    envelope["data"] = conv(envelope["data"])
    return json.dumps(envelope, separators=(",", ":"))


def legacy_not_found(message: str) -> str:
    """phpIPAM <= 1.4: "not found" as HTTP 200 with success false (backends.md A.3)."""
    return json.dumps({"code": 200, "success": False, "message": message, "time": 0.003})


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def make(sleeps: list[float]) -> Iterator[Callable[..., PHPIPAMBackend]]:
    made: list[PHPIPAMBackend] = []

    def factory(**overrides: Any) -> PHPIPAMBackend:
        fields: dict[str, Any] = {
            "endpoint": ENDPOINT,
            "app_id": "capi",
            "subnet_id": 7,
            "username": USERNAME,
            "password": PASSWORD,
            "timeout_seconds": 7.5,
            "retry": RetryPolicy(
                attempts=ATTEMPTS,
                initial_delay_seconds=0.0,
                max_delay_seconds=0.0,
                total_seconds=60.0,
                sleep=sleeps.append,
            ),
        }
        fields.update(overrides)
        if "app_code" in overrides:
            fields.pop("username")
            fields.pop("password")
        if "subnet" in overrides:
            fields.pop("subnet_id")
        endpoints = fields.pop("endpoints", None) or FlowControl(max_concurrent=16)
        backend = PHPIPAMBackend(PHPIPAMConfig(**fields), endpoints=endpoints)
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend.close()


def add(
    rsps: responses.RequestsMock,
    method: str,
    path: str,
    body: str,
    status: int = 200,
    *,
    headers: dict[str, str] | None = None,
    content_type: str = JSON,
    token: str | None = TOKEN,
    json_body: dict[str, Any] | None = None,
) -> None:
    """Register one recorded answer; the request must carry ``token`` (and ``json_body``)."""
    match: list[Any] = []
    if token is not None:
        match.append(matchers.header_matcher({"token": token}))
    if json_body is not None:
        match.append(matchers.json_params_matcher(json_body))
    if headers is None and status in (400, 500, 503):
        headers = ERROR_HEADERS
    if headers is None and status == 401:
        headers = UNAUTHORIZED_HEADERS
    rsps.add(
        method,
        f"{BASE}/{path}",
        body=body,
        status=status,
        content_type=content_type,
        headers=headers,
        match=match,
    )


def add_login(rsps: responses.RequestsMock, body: str = LOGIN_OK, status: int = 200) -> None:
    basic = base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
    rsps.add(
        "POST",
        f"{BASE}/user/",
        body=body,
        status=status,
        content_type=JSON,
        headers=ERROR_HEADERS if status >= 400 else None,
        match=[matchers.header_matcher({"Authorization": f"Basic {basic}"})],
    )


def urls(rsps: responses.RequestsMock) -> list[str]:
    return [f"{c.request.method} {c.request.url}" for c in rsps.calls]


def logins(rsps: responses.RequestsMock) -> int:
    return sum(1 for c in rsps.calls if c.request.url == f"{BASE}/user/")


# ---------------------------------------------------------------- describe_subnets


@pytest.mark.parametrize("convert", [str, stringified], ids=["native-types", "all-strings"])
def test_describe_subnet_logs_in_and_reads_facts_and_usage(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend], convert: Any
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", convert(SUBNET_7))
    add(rsps, "GET", "subnets/7/usage/", convert(USAGE_7))

    backend = make()
    info = backend.describe_subnets()[0]

    assert isinstance(backend, IPAMBackend)
    assert info == SubnetInfo(
        cidr="10.20.0.0/24", prefix=24, gateway="10.20.0.1", total=254, used=1, free=253
    )
    assert urls(rsps) == [
        f"POST {BASE}/user/",
        f"GET {BASE}/subnets/7/",
        f"GET {BASE}/subnets/7/usage/",
    ]
    login = rsps.calls[0].request
    assert "token" not in login.headers
    assert login.headers["User-Agent"].startswith("ipam-bridge")


def test_describe_ipv6_subnet_without_gateway_and_huge_counts(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add(rsps, "GET", "subnets/8/", SUBNET_8, token=APP_CODE)
    add(rsps, "GET", "subnets/8/usage/", USAGE_8, token=APP_CODE)

    info = make(subnet_id=8, app_code=APP_CODE).describe_subnets()[0]

    assert info == SubnetInfo(
        cidr="2001:db8:20::/64", prefix=64, gateway=None, total=2**64, used=0, free=2**64
    )


def test_subnet_cidr_is_resolved_once(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/cidr/10.20.0.0/24/", CIDR_7)
    add(rsps, "GET", "subnets/7/", SUBNET_7)
    add(rsps, "GET", "subnets/7/usage/", USAGE_7)

    backend = make(subnet="10.20.0.0/24")
    first = backend.describe_subnets()[0]
    second = backend.describe_subnets()[0]

    assert first == second
    assert first.cidr == "10.20.0.0/24"
    assert urls(rsps).count(f"GET {BASE}/subnets/cidr/10.20.0.0/24/") == 1
    assert urls(rsps).count(f"GET {BASE}/subnets/7/usage/") == 2


def test_ipv6_cidr_lookup_path(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    cidr_8 = CIDR_7.replace(
        '"id":7,"subnet":"10.20.0.0","mask":"24"', '"id":8,"subnet":"2001:db8:20::","mask":"64"'
    )
    add(rsps, "GET", "subnets/cidr/2001:db8:20::/64/", cidr_8, token=APP_CODE)
    add(rsps, "GET", "subnets/8/", SUBNET_8, token=APP_CODE)
    add(rsps, "GET", "subnets/8/usage/", USAGE_8, token=APP_CODE)

    info = make(subnet="2001:db8:20::/64", app_code=APP_CODE).describe_subnets()[0]

    assert info.cidr == "2001:db8:20::/64"


def test_cidr_without_match_is_subnet_not_found(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/cidr/10.99.0.0/24/", NO_SUBNETS, 404)

    with pytest.raises(SubnetNotFoundError):
        make(subnet="10.99.0.0/24").describe_subnets()[0]
    assert len(rsps.calls) == 2  # not retried


def _two_sections() -> str:
    envelope = json.loads(CIDR_7)
    other = dict(envelope["data"][0], id=31, sectionId=5)
    envelope["data"].append(other)
    return json.dumps(envelope, separators=(",", ":"))


def test_cidr_in_several_sections_needs_section_id(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/cidr/10.20.0.0/24/", _two_sections())

    with pytest.raises(SubnetNotFoundError, match=r"2 subnets .*sections 3, 5"):
        make(subnet="10.20.0.0/24").describe_subnets()[0]


def test_section_id_narrows_cidr_lookup(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/cidr/10.20.0.0/24/", _two_sections())
    subnet_31 = SUBNET_7.replace('"id":7,', '"id":31,').replace('"sectionId":3', '"sectionId":5')
    add(rsps, "GET", "subnets/31/", subnet_31)
    add(rsps, "GET", "subnets/31/usage/", USAGE_7)

    make(subnet="10.20.0.0/24", section_id=5).describe_subnets()[0]

    assert f"GET {BASE}/subnets/31/usage/" in urls(rsps)


def test_cidr_absent_from_section_is_subnet_not_found(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/cidr/10.20.0.0/24/", CIDR_7)

    with pytest.raises(SubnetNotFoundError, match="in section 9"):
        make(subnet="10.20.0.0/24", section_id=9).describe_subnets()[0]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [("subnets/9999/", SUBNET_9999, 400), ("subnets/9999/usage/", USAGE_9999, 404)],
)
def test_unknown_subnet_id_is_subnet_not_found(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    path: str,
    body: str,
    status: int,
) -> None:
    add_login(rsps)
    add(rsps, "GET", path, body, status)
    if path != "subnets/9999/":
        add(rsps, "GET", "subnets/9999/", SUBNET_7.replace('"id":7', '"id":9999'))

    with pytest.raises(SubnetNotFoundError) as caught:
        make(subnet_id=9999).describe_subnets()[0]
    assert caught.value.status == status
    assert "Invalid subnet Id (9999)" in str(caught.value)
    assert urls(rsps).count(f"GET {BASE}/{path}") == 1


# ---------------------------------------------------------------- find


def _prime(rsps: responses.RequestsMock, subnet: int = 7) -> None:
    add_login(rsps)
    add(rsps, "GET", f"subnets/{subnet}/", SUBNET_7 if subnet == 7 else SUBNET_8)


@pytest.mark.parametrize("convert", [str, stringified], ids=["native-types", "all-strings"])
def test_find_returns_the_row_of_this_subnet(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend], convert: Any
) -> None:
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", convert(SEARCH_CLAIM_2))

    found = make().find("default.claim-2")

    assert found == Allocation(
        address="10.20.0.3",
        prefix=24,
        gateway="10.20.0.1",
        hostname="default.claim-2",
        ref="13",
        subnet="10.20.0.0/24",
        description="capi claim 2",
    )


@pytest.mark.parametrize(
    ("body", "status"),
    [(HOSTNAME_NOT_FOUND, 404), (legacy_not_found("Hostname not found"), 200)],
    ids=["phpipam-1.5+", "phpipam-1.4"],
)
def test_find_missing_hostname_is_none(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend], body: str, status: int
) -> None:
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.missing/", body, status)

    assert make().find("default.missing") is None


def test_find_ignores_other_subnets_and_converts_decimal_ip(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    # The same hostname in subnet 3 (id 5) first; our row comes 2nd, so phpIPAM sends its
    # ip as a decimal integer (4b).
    envelope = json.loads(SEARCH_CLAIM_1_TWICE)
    envelope["data"][0].update(id=5, subnetId=3, ip="10.0.0.9")
    _prime(rsps)
    add(
        rsps,
        "GET",
        "addresses/search_hostname/default.claim-1/",
        json.dumps(envelope, separators=(",", ":")),
    )

    found = make().find("default.claim-1")

    assert found is not None
    assert (found.address, found.ref) == ("10.20.0.5", "15")


def test_find_converts_decimal_ipv6(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    envelope = json.loads(SEARCH_CLAIM_1_TWICE)
    envelope["data"][0].update(subnetId=3, ip="10.0.0.9")
    envelope["data"][1].update(subnetId=8, ip=str(int(ipaddress.ip_address("2001:db8:20::5"))))
    _prime(rsps, subnet=8)
    add(
        rsps,
        "GET",
        "addresses/search_hostname/default.claim-1/",
        json.dumps(envelope, separators=(",", ":")),
    )

    found = make(subnet_id=8).find("default.claim-1")

    assert found is not None
    assert (found.address, found.prefix, found.gateway) == ("2001:db8:20::5", 64, None)


def test_find_with_several_rows_returns_the_oldest(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    envelope = json.loads(SEARCH_CLAIM_1_TWICE)
    envelope["data"].reverse()  # order of the answer must not matter
    _prime(rsps)
    add(
        rsps,
        "GET",
        "addresses/search_hostname/default.claim-1/",
        json.dumps(envelope, separators=(",", ":")),
    )

    found = make().find("default.claim-1")

    assert found is not None
    assert (found.address, found.ref) == ("10.20.0.2", "12")


def test_find_does_not_refetch_subnet_facts(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", SEARCH_CLAIM_2)

    backend = make()
    backend.find("default.claim-2")
    backend.find("default.claim-2")

    assert urls(rsps).count(f"GET {BASE}/subnets/7/") == 1


# ---------------------------------------------------------------- allocate


def test_allocate_posts_first_free_with_hostname_and_description(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(
        rsps,
        "POST",
        "addresses/first_free/7/",
        CREATED_12,
        201,
        headers={"Location": "/api/capi/addresses/12/"},
        json_body={"hostname": "default.claim-1", **OWNER_FIELDS},
    )

    allocation = make().allocate("default.claim-1", OWNER)

    assert allocation == Allocation(
        address="10.20.0.2",
        prefix=24,
        gateway="10.20.0.1",
        hostname="default.claim-1",
        ref="12",
        subnet="10.20.0.0/24",
        description="ipam-bridge default/claim-1",
        owner=OWNER,
    )
    post = rsps.calls[-1].request
    assert post.headers["Content-Type"] == "application/json"


def test_a_routine_allocation_and_release_log_nothing_at_info(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # One INFO line per claim is the claim reconciler's; the client's detail is at DEBUG.
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", SEARCH_CLAIM_1_TWICE)
    add(rsps, "DELETE", "addresses/12/", DELETED)
    add(rsps, "DELETE", "addresses/15/", DELETED)
    backend = make()

    with caplog.at_level(logging.DEBUG, logger="backends.phpipam"):
        backend.allocate("default.claim-1", OWNER)
        backend.release("default.claim-1", OWNER)

    levels = {
        r.getMessage(): r.levelname
        for r in caplog.records
        if "allocated" in r.getMessage() or "deleted" in r.getMessage()
    }
    assert levels == {
        "phpIPAM: allocated 10.20.0.2 (id 12) to default.claim-1": "DEBUG",
        "phpIPAM: deleted address id 12 of default.claim-1": "DEBUG",
        "phpIPAM: deleted address id 15 of default.claim-1": "DEBUG",
    }


def test_allocate_returns_its_own_row_without_post_or_patch(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", SEARCH_OWNED)

    allocation = make().allocate("default.claim-1", OWNER)

    assert (allocation.address, allocation.ref, allocation.owner) == ("10.20.0.3", "13", OWNER)
    assert [u for u in urls(rsps) if not u.startswith("GET")] == [f"POST {BASE}/user/"]


@pytest.mark.parametrize(
    ("owner", "note", "description"),
    [
        (None, None, "reserved for the mgmt control plane"),  # a network team's reservation
        (None, None, "ipam-bridge default/claim-1 cluster mgmt"),  # the previous release
        ("ipam-bridge default/claim-1", None, "x"),  # an owner field without a cluster
    ],
    ids=["reservation", "previous-release", "owner-field-only"],
)
def test_allocate_adopts_a_row_and_writes_its_owner_with_one_patch(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    owner: str | None,
    note: str | None,
    description: str,
) -> None:
    _prime(rsps)
    search = owned_search("default.claim-1", owner=owner, note=note, description=description)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", search)
    add(rsps, "PATCH", "addresses/13/", UPDATED, json_body=OWNER_FIELDS)  # 10c

    allocation = make().allocate("default.claim-1", OWNER)

    assert (allocation.address, allocation.ref, allocation.owner) == ("10.20.0.3", "13", OWNER)
    assert [u for u in urls(rsps) if not u.startswith("GET")] == [
        f"POST {BASE}/user/",
        f"PATCH {BASE}/addresses/13/",
    ]


@pytest.mark.parametrize(
    "other",
    [
        EntryOwner("a-second-cluster", "default/claim-1"),  # same names, another cluster
        EntryOwner(CLUSTER, "lab/claim-1.default"),  # another claim of ours, same hostname
        EntryOwner("", "lab/claim-1.default"),  # another claim of the previous release
    ],
    ids=["other-cluster", "other-claim", "other-claim-previous-release"],
)
@pytest.mark.parametrize("requested", [None, "10.20.0.3"], ids=["first-free", "requested"])
def test_allocate_refuses_a_row_of_another_owner_and_changes_nothing(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    sleeps: list[float],
    other: EntryOwner,
    requested: str | None,
) -> None:
    _prime(rsps)
    note = f"ipam-bridge cluster={other.cluster_id} claim={other.claim}"
    search = owned_search("default.claim-1", owner=None, note=note)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", search)

    with pytest.raises(EntryOwnedError) as raised:
        make().allocate("default.claim-1", OWNER, requested)

    error = raised.value
    assert (error.hostname, error.address, error.owner) == ("default.claim-1", "10.20.0.3", other)
    assert other.claim in error.message
    assert sleeps == []  # not retried
    assert [u for u in urls(rsps) if not u.startswith("GET")] == [f"POST {BASE}/user/"]


def test_a_row_deleted_before_its_owner_is_written_is_a_lost_race_then_first_free(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend], sleeps: list[float]
) -> None:
    _prime(rsps)
    search = owned_search("default.claim-1", owner=None, note=None, description="reserved")
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", search)
    add(rsps, "PATCH", "addresses/13/", NO_SUCH_ADDRESS, 404)  # 6b: deleted meanwhile
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)

    allocation = make().allocate("default.claim-1", OWNER)

    assert (allocation.address, allocation.owner) == ("10.20.0.2", OWNER)
    assert len(sleeps) == 1  # one retry of the policy


def test_allocate_adopts_another_owners_row_at_the_address_its_ipaddress_names(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    # clusterctl move: the claim's IPAddress (moved with it) names 10.20.0.3.
    _prime(rsps)
    note = "ipam-bridge cluster=the-source-cluster claim=default/claim-1"
    search = owned_search("default.claim-1", owner=None, note=note)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", search)
    add(rsps, "PATCH", "addresses/13/", UPDATED, json_body=OWNER_FIELDS)

    allocation = make().allocate("default.claim-1", OWNER, adopt="10.20.0.3")

    assert (allocation.address, allocation.owner) == ("10.20.0.3", OWNER)


def test_allocate_cuts_description_to_64_and_owner_to_128_chars(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    # A namespace of 63 characters and a claim name of 100: section 12's column widths.
    claim = "n" * 63 + "/" + "c" * 100
    owner = EntryOwner(CLUSTER, claim)
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)

    make().allocate("default.claim-1", owner)

    sent = json.loads(rsps.calls[-1].request.body or b"{}")
    assert sent["description"] == f"ipam-bridge {claim}"[:64]
    assert sent["owner"] == f"ipam-bridge {CLUSTER} {claim}"[:128]
    assert sent["note"] == f"ipam-bridge cluster={CLUSTER} claim={claim}"  # text: whole


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (NO_FREE, 404),
        (NO_FREE.replace("found", "found (subnet is full)"), 404),
        (legacy_not_found("No free addresses found"), 200),
    ],
    ids=["full", "isFull", "phpipam-1.4"],
)
def test_exhausted_subnet_is_not_retried(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    sleeps: list[float],
    body: str,
    status: int,
) -> None:
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/tiny.claim-3/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", body, status)

    with pytest.raises(SubnetExhaustedError):
        make().allocate("tiny.claim-3", OWNER)
    assert urls(rsps).count(f"POST {BASE}/addresses/first_free/7/") == 1
    assert sleeps == []


def test_first_free_on_unknown_subnet_is_subnet_not_found(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/x/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", FIRST_FREE_9999, 400)

    with pytest.raises(SubnetNotFoundError):
        make().allocate("x", OWNER)


@pytest.mark.parametrize(
    ("race", "status"), [(IP_EXISTS, 409), (DUPLICATE_ENTRY, 500)], ids=["409", "500-duplicate"]
)
def test_lost_race_searches_again_and_gets_a_new_address(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    sleeps: list[float],
    race: str,
    status: int,
) -> None:
    _prime(rsps)
    search = "addresses/search_hostname/default.claim-2/"
    add(rsps, "GET", search, HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", race, status)
    add(rsps, "GET", search, HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_13, 201)

    allocation = make().allocate("default.claim-2", OWNER)

    assert (allocation.address, allocation.ref) == ("10.20.0.3", "13")
    assert urls(rsps)[2:] == [
        f"GET {BASE}/{search}",
        f"POST {BASE}/addresses/first_free/7/",
        f"GET {BASE}/{search}",
        f"POST {BASE}/addresses/first_free/7/",
    ]
    assert len(sleeps) == 1


def test_lost_race_on_every_attempt_raises_conflict(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", IP_EXISTS, 409)

    with pytest.raises(ConflictError):
        make().allocate("default.claim-2", OWNER)
    assert urls(rsps).count(f"POST {BASE}/addresses/first_free/7/") == ATTEMPTS


def test_post_without_answer_is_found_by_the_next_search(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    """A POST whose answer was lost (timeout) may have created the row: never create twice."""
    _prime(rsps)
    search = "addresses/search_hostname/default.claim-2/"
    add(rsps, "GET", search, HOSTNAME_NOT_FOUND, 404)
    rsps.add("POST", f"{BASE}/addresses/first_free/7/", body=requests.ReadTimeout("read timeout"))
    add(rsps, "GET", search, SEARCH_OWNED.replace("default.claim-1", "default.claim-2"))

    allocation = make().allocate("default.claim-2", OWNER)

    assert (allocation.address, allocation.ref) == ("10.20.0.3", "13")
    assert urls(rsps).count(f"POST {BASE}/addresses/first_free/7/") == 1
    assert not [u for u in urls(rsps) if u.startswith("PATCH")]


def test_ipv6_network_address_is_kept_reserved_and_skipped(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    _prime(rsps, subnet=8)
    add(rsps, "GET", "addresses/search_hostname/v6.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/8/", CREATED_V6_NET, 201)
    add(rsps, "PATCH", "addresses/25/", UPDATED)
    add(rsps, "POST", "addresses/first_free/8/", CREATED_V6_1, 201)

    allocation = make(subnet_id=8).allocate("v6.claim-1", OWNER)

    assert allocation == Allocation(
        address="2001:db8:20::1",
        prefix=64,
        gateway=None,
        hostname="v6.claim-1",
        ref="26",
        subnet="2001:db8:20::/64",
        description="ipam-bridge default/claim-1",
        owner=OWNER,
    )
    patch = next(c.request for c in rsps.calls if c.request.method == "PATCH")
    sent = json.loads(patch.body or b"{}")
    assert sent["hostname"] == RESERVED_NETWORK_HOSTNAME
    assert "anycast" in sent["description"]
    assert len(sent["description"]) <= 64


def test_ipv6_network_address_handed_out_when_skip_is_off(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    _prime(rsps, subnet=8)
    add(rsps, "GET", "addresses/search_hostname/v6.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/8/", CREATED_V6_NET, 201)

    allocation = make(subnet_id=8, skip_ipv6_network_address=False).allocate("v6.claim-1", OWNER)

    assert (allocation.address, allocation.ref) == ("2001:db8:20::", "25")


def test_ipv6_network_row_left_by_an_interrupted_attempt_is_renamed(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    left_over = SEARCH_CLAIM_2.replace(
        '"id":13,"subnetId":7,"ip":"10.20.0.3"', '"id":25,"subnetId":8,"ip":"2001:db8:20::"'
    )
    _prime(rsps, subnet=8)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", left_over)
    add(rsps, "PATCH", "addresses/25/", UPDATED)
    add(rsps, "POST", "addresses/first_free/8/", CREATED_V6_1, 201)

    backend = make(subnet_id=8)
    allocation = backend.allocate("default.claim-2", OWNER)

    assert allocation.address == "2001:db8:20::1"
    assert f"PATCH {BASE}/addresses/25/" in urls(rsps)


@pytest.mark.parametrize("hostname", ["", " ", "a/b"])
def test_unusable_hostname_is_an_invalid_request(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend], hostname: str
) -> None:
    _prime(rsps)

    with pytest.raises(InvalidRequestError):
        make().allocate(hostname, OWNER)
    assert not [u for u in urls(rsps) if "addresses" in u]


# ---------------------------------------------------------------- release


def test_release_deletes_every_row_by_id(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    envelope = json.loads(SEARCH_CLAIM_1_TWICE)
    other = dict(envelope["data"][0], id=40, subnetId=3, ip="10.0.0.9")
    envelope["data"].append(other)
    add_login(rsps)
    add(
        rsps,
        "GET",
        "addresses/search_hostname/default.claim-1/",
        json.dumps(envelope, separators=(",", ":")),
    )
    add(rsps, "DELETE", "addresses/12/", DELETED)
    add(rsps, "DELETE", "addresses/15/", DELETED)

    assert make().release("default.claim-1", OWNER) is True

    deletes = [c.request.url or "" for c in rsps.calls if c.request.method == "DELETE"]
    assert deletes == [f"{BASE}/addresses/12/", f"{BASE}/addresses/15/"]
    # Never addresses/{ip}/{subnetId}/: a PHP fatal error when the address is gone (6e).
    assert all(re.fullmatch(rf"{re.escape(BASE)}/addresses/\d+/", u) for u in deletes)


@pytest.mark.parametrize(
    ("body", "status"),
    [(HOSTNAME_NOT_FOUND, 404), (legacy_not_found("Hostname not found"), 200)],
    ids=["phpipam-1.5+", "phpipam-1.4"],
)
def test_release_of_unknown_hostname_is_false(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend], body: str, status: int
) -> None:
    add_login(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.gone/", body, status)

    assert make().release("default.gone", OWNER) is False
    assert not [c for c in rsps.calls if c.request.method == "DELETE"]


def test_release_is_idempotent_when_the_row_vanished_meanwhile(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", SEARCH_CLAIM_2)
    add(rsps, "DELETE", "addresses/13/", NO_SUCH_ADDRESS, 404)

    assert make().release("default.claim-2", OWNER) is False


def test_release_retried_after_a_partial_failure_reports_the_deletion(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    search = "addresses/search_hostname/default.claim-1/"
    add_login(rsps)
    add(rsps, "GET", search, SEARCH_CLAIM_1_TWICE)
    add(rsps, "DELETE", "addresses/12/", DELETED)
    add(rsps, "DELETE", "addresses/15/", "", 502, content_type="text/html", headers={})
    remaining = json.loads(SEARCH_CLAIM_1_TWICE)
    remaining["data"] = remaining["data"][1:]
    add(rsps, "GET", search, json.dumps(remaining, separators=(",", ":")))
    add(rsps, "DELETE", "addresses/15/", DELETED)

    assert make().release("default.claim-1", OWNER) is True
    assert urls(rsps).count(f"DELETE {BASE}/addresses/15/") == 2


# ---------------------------------------------------------------- errors and retries


@pytest.mark.parametrize(
    ("body", "status", "content_type", "error", "tries"),
    [
        (INVALID_APP, 400, JSON, AuthenticationFailedError, 1),
        (APP_DISABLED, 503, JSON, AuthenticationFailedError, 1),
        (BLOCKED, 500, JSON, AuthenticationFailedError, 1),
        (SSL_REQUIRED, 503, JSON, InvalidRequestError, 1),
        (INVALID_CONTROLLER, 400, JSON, InvalidRequestError, 1),
        (API_DISABLED, 503, JSON, BackendUnavailableError, ATTEMPTS),
        ("", 500, "text/html; charset=UTF-8", BackendUnavailableError, ATTEMPTS),
        (
            "<html><body>502 Bad Gateway</body></html>",
            502,
            "text/html",
            BackendUnavailableError,
            ATTEMPTS,
        ),
        ("Too Many Requests", 429, "text/plain", BackendUnavailableError, ATTEMPTS),
        (
            UNAUTHORIZED.replace("401", "429").replace("Unauthorized", "Slow down"),
            429,
            JSON,
            BackendUnavailableError,
            ATTEMPTS,
        ),
        ("<html>maintenance</html>", 200, "text/html", BackendUnavailableError, ATTEMPTS),
    ],
    ids=[
        "invalid-app",
        "app-disabled",
        "ip-blocked",
        "ssl-required",
        "other-4xx",
        "api-disabled",
        "php-fatal-empty-500",
        "proxy-502-html",
        "429-text",
        "429-envelope",
        "200-not-json",
    ],
)
def test_error_mapping_and_retries(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    sleeps: list[float],
    body: str,
    status: int,
    content_type: str,
    error: type[BackendError],
    tries: int,
) -> None:
    add(rsps, "GET", "subnets/7/", body, status, content_type=content_type, token=APP_CODE)

    with pytest.raises(error) as caught:
        make(app_code=APP_CODE).describe_subnets()[0]

    assert type(caught.value) is error
    assert caught.value.status == status
    assert len(rsps.calls) == tries
    assert len(sleeps) == tries - 1


def test_ssl_required_explains_the_app_security_setting(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add(rsps, "POST", "user/", SSL_REQUIRED, 503, token=None)

    with pytest.raises(InvalidRequestError, match=r"https://.*api_allow_unsafe"):
        make().describe_subnets()[0]


@pytest.mark.parametrize(
    ("body", "status"),
    [(WRONG_PASSWORD, 500), (NO_CREDENTIALS, 400), (BLOCKED, 500)],
    ids=["wrong-password", "no-credentials", "ip-blocked"],
)
def test_failed_login_is_an_authentication_error_and_not_retried(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    sleeps: list[float],
    body: str,
    status: int,
) -> None:
    add_login(rsps, body, status)

    with pytest.raises(AuthenticationFailedError):
        make().describe_subnets()[0]
    assert urls(rsps) == [f"POST {BASE}/user/"]
    assert sleeps == []


def test_refused_logins_are_budgeted_per_endpoint_across_backends(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    """More than 10 failed logins in 5 minutes block the client's IP (section 11)."""
    add_login(rsps, WRONG_PASSWORD, 500)
    endpoints = FlowControl(login_retry_seconds=0)
    # Two pools (or one pool rebuilt after its Secret changed) with the same wrong password.
    backends = [make(endpoints=endpoints), make(endpoints=endpoints)]

    for i in range(8):
        with pytest.raises(AuthenticationFailedError, match="username or password") as caught:
            backends[i % 2].find("default.claim-2")

    assert logins(rsps) == 5
    assert "logins held back" in caught.value.message
    assert re.search(r"next try at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", caught.value.message)


def test_a_refused_credential_is_not_tried_again_for_a_while(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps, WRONG_PASSWORD, 500)
    endpoints = FlowControl()  # 60 s between two tries of one refused credential
    for _ in range(3):
        with pytest.raises(AuthenticationFailedError, match="username or password") as caught:
            make(endpoints=endpoints).find("default.claim-2")  # a rebuilt backend each time
    assert logins(rsps) == 1
    assert "next try at" in caught.value.message


def test_read_only_app_is_an_authentication_error_without_relogin(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/x/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", INVALID_PERMISSIONS, 401)

    with pytest.raises(AuthenticationFailedError, match="Read/Write"):
        make().allocate("x", OWNER)
    assert logins(rsps) == 1


@pytest.mark.parametrize(
    "failure",
    [
        requests.ConnectTimeout("connect timeout"),
        requests.ReadTimeout("read timeout"),
        requests.ConnectionError("connection refused"),
    ],
    ids=["connect-timeout", "read-timeout", "connection-error"],
)
def test_transport_failure_then_success(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    sleeps: list[float],
    failure: Exception,
) -> None:
    rsps.add("GET", f"{BASE}/subnets/7/", body=failure)
    add(rsps, "GET", "subnets/7/", SUBNET_7, token=APP_CODE)
    add(rsps, "GET", "subnets/7/usage/", USAGE_7, token=APP_CODE)

    assert make(app_code=APP_CODE).describe_subnets()[0].free == 253
    assert len(sleeps) == 1


@pytest.mark.parametrize(
    ("body", "status", "content_type"),
    [
        ("", 500, "text/html; charset=UTF-8"),
        (API_DISABLED, 503, JSON),
        ("Too Many Requests", 429, "text/plain"),
    ],
    ids=["500-empty", "503", "429"],
)
def test_transient_answer_then_success(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    body: str,
    status: int,
    content_type: str,
) -> None:
    add(rsps, "GET", "subnets/7/", body, status, content_type=content_type, token=APP_CODE)
    add(rsps, "GET", "subnets/7/", SUBNET_7, token=APP_CODE)
    add(rsps, "GET", "subnets/7/usage/", USAGE_7, token=APP_CODE)

    assert make(app_code=APP_CODE).describe_subnets()[0].cidr == "10.20.0.0/24"
    assert len(rsps.calls) == 3


def test_connection_refused_on_a_closed_port(
    make: Callable[..., PHPIPAMBackend], sleeps: list[float]
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = make(endpoint=f"http://127.0.0.1:{port}/api", app_code=APP_CODE)

    with pytest.raises(BackendUnavailableError, match="cannot reach") as caught:
        backend.describe_subnets()[0]
    assert caught.value.status is None
    assert len(sleeps) == ATTEMPTS - 1


def test_redirect_is_not_followed(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add(
        rsps,
        "GET",
        "subnets/7/",
        "",
        301,
        content_type="text/html",
        headers={"Location": "https://elsewhere.example/api/capi/subnets/7/"},
        token=APP_CODE,
    )

    with pytest.raises(InvalidRequestError, match="redirected"):
        make(app_code=APP_CODE).describe_subnets()[0]
    assert len(rsps.calls) == 1


# ---------------------------------------------------------------- token handling


def test_expired_token_logs_in_again_once_and_repeats_the_call(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend], sleeps: list[float]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", SUBNET_7)
    add(rsps, "GET", "subnets/7/usage/", USAGE_7)
    backend = make()
    backend.describe_subnets()[0]

    # The token expires (9h); a new login gives a new token (9l).
    rsps.reset()
    add_login(rsps, LOGIN_OK_2)
    add(rsps, "GET", "subnets/7/", UNAUTHORIZED, 401)
    add(rsps, "GET", "subnets/7/", SUBNET_7, token=TOKEN2)
    add(rsps, "GET", "subnets/7/usage/", USAGE_7, token=TOKEN2)

    assert backend.describe_subnets()[0].gateway == "10.20.0.1"
    assert urls(rsps) == [
        f"GET {BASE}/subnets/7/",
        f"POST {BASE}/user/",
        f"GET {BASE}/subnets/7/",
        f"GET {BASE}/subnets/7/usage/",
    ]
    assert [c.request.headers.get("token") for c in rsps.calls] == [TOKEN, None, TOKEN2, TOKEN2]
    assert sleeps == []  # a re-login is not a retry


def test_relogin_refused_is_an_authentication_error(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend], sleeps: list[float]
) -> None:
    add_login(rsps)
    add_login(rsps, WRONG_PASSWORD, 500)  # the password was changed meanwhile
    add(rsps, "GET", "subnets/7/", UNAUTHORIZED, 401)

    with pytest.raises(AuthenticationFailedError, match="username or password"):
        make().describe_subnets()[0]
    assert logins(rsps) == 2
    assert sleeps == []


def test_fresh_token_refused_again_is_an_authentication_error(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    rsps.add("GET", f"{BASE}/subnets/7/", body=UNAUTHORIZED, status=401, content_type=JSON)

    with pytest.raises(AuthenticationFailedError, match="just issued"):
        make().describe_subnets()[0]
    assert logins(rsps) == 2
    assert len(rsps.calls) == 4


def test_app_code_is_sent_as_token_without_login(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add(rsps, "GET", "subnets/7/", SUBNET_7, token=APP_CODE)
    add(rsps, "GET", "subnets/7/usage/", USAGE_7, token=APP_CODE)

    make(app_code=APP_CODE).describe_subnets()[0]

    assert logins(rsps) == 0
    assert all(c.request.headers["token"] == APP_CODE for c in rsps.calls)


def test_refused_app_code_is_an_authentication_error_without_login(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add(rsps, "GET", "subnets/7/", UNAUTHORIZED, 401, token=APP_CODE)

    with pytest.raises(AuthenticationFailedError, match="app code"):
        make(app_code=APP_CODE).describe_subnets()[0]
    assert logins(rsps) == 0
    assert len(rsps.calls) == 1


def _slow_login(body: str, counter: list[int]) -> Callable[[Any], tuple[int, dict[str, str], str]]:
    """A login answer that takes a while, so that other threads pile up behind it.

    The wait only widens the window in which a second login could start; nothing
    synchronises on it.
    """

    def callback(request: Any) -> tuple[int, dict[str, str], str]:
        counter.append(1)
        threading.Event().wait(0.05)
        return 200, {}, body

    return callback


def _in_threads(fn: Callable[[], Any], count: int = 8) -> list[Any]:
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        barrier.wait()
        results[i] = fn()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    return results


def test_parallel_first_calls_log_in_once(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    login_calls: list[int] = []
    rsps.add_callback(
        "POST", f"{BASE}/user/", callback=_slow_login(LOGIN_OK, login_calls), content_type=JSON
    )
    add(rsps, "GET", "subnets/7/", SUBNET_7)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", SEARCH_CLAIM_2)
    backend = make()

    results = _in_threads(lambda: backend.find("default.claim-2"))

    assert len(login_calls) == 1
    assert {r.address for r in results} == {"10.20.0.3"}


def test_parallel_calls_with_an_expired_token_log_in_again_once(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", SEARCH_CLAIM_2)
    backend = make()
    backend.find("default.claim-2")  # logged in with TOKEN

    # TOKEN expires (9h); the next login hands out TOKEN2 (9l). Every thread has sent the
    # old token before any of them learns that it expired.
    threads = 8
    in_flight = threading.Barrier(threads, timeout=5)

    def expired(request: Any) -> tuple[int, dict[str, str], str]:
        in_flight.wait()
        return 401, UNAUTHORIZED_HEADERS, UNAUTHORIZED

    login_calls: list[int] = []

    def login(request: Any) -> tuple[int, dict[str, str], str]:
        login_calls.append(1)
        return 200, {}, LOGIN_OK_2

    rsps.reset()
    search = f"{BASE}/addresses/search_hostname/default.claim-2/"
    rsps.add_callback("POST", f"{BASE}/user/", callback=login, content_type=JSON)
    rsps.add_callback(
        "GET",
        search,
        callback=expired,
        content_type=JSON,
        match=[matchers.header_matcher({"token": TOKEN})],
    )
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", SEARCH_CLAIM_2, token=TOKEN2)

    results = _in_threads(lambda: backend.find("default.claim-2"), threads)

    assert len(login_calls) == 1
    assert {r.ref for r in results} == {"13"}
    assert sum(1 for c in rsps.calls if c.request.headers.get("token") == TOKEN) == threads


# ---------------------------------------------------------------- transport settings


def test_every_request_has_the_timeout_and_verifies_tls_by_default(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # requests replaces verify=True by these (still verifying) when they are set.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)

    make().allocate("default.claim-1", OWNER)

    kwargs = [c.request.req_kwargs for c in rsps.calls]  # type: ignore[attr-defined]
    assert len(kwargs) == 4
    assert all(k["timeout"] == (7.5, 7.5) for k in kwargs)
    assert all(k["verify"] is True for k in kwargs)
    assert all(c.request.headers["User-Agent"].startswith("ipam-bridge") for c in rsps.calls)


@pytest.fixture
def https_phpipam(
    tls_server: Callable[[Callable[[str], bytes]], tuple[str, str]],
) -> tuple[str, str]:
    """A TLS server on 127.0.0.1 answering every GET with recorded subnet 7 answers."""
    url, ca_pem = tls_server(
        lambda path: (USAGE_7 if path.endswith("/usage/") else SUBNET_7).encode()
    )
    return f"{url}/api", ca_pem


def test_tls_with_ca_bundle_works_and_unknown_ca_fails(
    https_phpipam: tuple[str, str], make: Callable[..., PHPIPAMBackend]
) -> None:
    endpoint, ca_pem = https_phpipam

    info = make(endpoint=endpoint, app_code=APP_CODE, ca_pem=ca_pem).describe_subnets()[0]
    assert info.cidr == "10.20.0.0/24"

    with pytest.raises(TLSVerificationError, match="certificate verify failed") as caught:
        make(endpoint=endpoint, app_code=APP_CODE).describe_subnets()[0]
    assert not caught.value.retryable  # a person must fix it: no retry loop in the client


# ---------------------------------------------------------------- secrets


def test_secrets_never_reach_logs_errors_or_reprs(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", SUBNET_7)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", UNAUTHORIZED, 401)
    add_login(rsps, LOGIN_OK_2)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", UNAUTHORIZED, 401, token=TOKEN2)
    backend = make()

    with pytest.raises(AuthenticationFailedError) as caught:
        backend.find("default.claim-2")

    secrets = (PASSWORD, TOKEN, TOKEN2, APP_CODE)
    app_code_config = PHPIPAMConfig(
        endpoint=ENDPOINT, app_id="capi", subnet_id=7, app_code=APP_CODE
    )
    texts = {
        "log": caplog.text,
        "error": str(caught.value),
        "config": repr(backend.config),
        "config-str": str(app_code_config),
        "backend": repr(backend),
    }
    assert "logged in" in caplog.text  # the logs did see the login
    for name, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"secret in {name}"


# ---------------------------------------------------------------- config and close


@pytest.mark.parametrize(
    "fields",
    [
        {"subnet_id": 7, "subnet": "10.20.0.0/24", "app_code": APP_CODE},
        {"app_code": APP_CODE},
        {"subnet_id": 7},
        {"subnet_id": 7, "username": USERNAME},
        {"subnet_id": 7, "username": USERNAME, "password": PASSWORD, "app_code": APP_CODE},
        {"subnet": "10.20.0.5/24", "app_code": APP_CODE},
        {"subnet_id": 7, "app_code": APP_CODE, "endpoint": "http://u:p@127.0.0.1/api"},
        {"subnet_id": 7, "app_code": APP_CODE, "endpoint": "ftp://127.0.0.1/api"},
        {"subnet_id": 7, "app_code": APP_CODE, "timeout_seconds": 0},
    ],
    ids=[
        "both-subnets",
        "no-subnet",
        "no-credentials",
        "username-only",
        "both-credentials",
        "host-bits",
        "userinfo",
        "scheme",
        "timeout",
    ],
)
def test_invalid_config_is_rejected(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PHPIPAMConfig(**{"endpoint": ENDPOINT, "app_id": "capi", **fields})


def test_close_does_not_revoke_the_shared_token(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    _prime(rsps)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", SEARCH_CLAIM_2)
    backend = make()
    backend.find("default.claim-2")

    backend.close()

    assert not [c for c in rsps.calls if c.request.method == "DELETE"]


# ---------------------------------------------------------------- never handed out

# 5a / 5b: POST /addresses/ with an explicit ip
CREATED_21 = '{"code":201,"success":true,"message":"Address created","id":"21","time":0.006}'
GATEWAY_OVERRIDE = "10.20.0.1"


def subnet_7_without_gateway(**changes: Any) -> str:
    """Subnet 7 as phpIPAM reports it when no row is its gateway (no gatewayId/gateway, A.6)."""
    envelope = json.loads(SUBNET_7)
    envelope["data"].pop("gatewayId")
    envelope["data"].pop("gateway")
    envelope["data"].update(changes)
    return json.dumps(envelope, separators=(",", ":"))


def created(address_id: int, address: str) -> str:
    """A 201 of ``POST addresses/first_free/{id}/`` (3a-1) for ``address``."""
    return json.dumps(
        {
            "code": 201,
            "success": True,
            "message": "Address created",
            "id": str(address_id),
            "data": address,
            "time": 0.005,
        },
        separators=(",", ":"),
    )


def search_rows(*rows: tuple[int, int, str, str]) -> str:
    """A ``search_hostname``/``search`` answer (4a, 4h) of (id, subnetId, ip, hostname) rows."""
    tail = json.loads("{" + _ROW_TAIL)
    data = [
        {
            "id": i,
            "subnetId": sid,
            "ip": ip,
            "is_gateway": 0,
            "description": "capi claim",
            "hostname": host,
            **tail,
        }
        for i, sid, ip, host in rows
    ]
    return json.dumps({"code": 200, "success": True, "data": data, "time": 0.001})


GATEWAY_ROW_BODY = {
    "subnetId": 7,
    "ip": GATEWAY_OVERRIDE,
    "hostname": RESERVED_GATEWAY_HOSTNAME,
    "description": RESERVED_GATEWAY_DESCRIPTION,
}


def posts(rsps: responses.RequestsMock, path: str) -> int:
    return urls(rsps).count(f"POST {BASE}/{path}")


def test_gateway_override_without_row_is_registered_before_the_first_allocation(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", subnet_7_without_gateway())
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(
        rsps,
        "POST",
        "addresses/",
        CREATED_21,
        201,
        headers={"Location": "/api/capi/addresses/21/"},
        json_body=GATEWAY_ROW_BODY,
    )
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_13, 201)

    backend = make(gateway=GATEWAY_OVERRIDE)
    first = backend.allocate("default.claim-1", OWNER)
    second = backend.allocate("default.claim-2", OWNER)

    assert first == Allocation(
        address="10.20.0.2",
        prefix=24,
        gateway="10.20.0.1",
        hostname="default.claim-1",
        ref="12",
        subnet="10.20.0.0/24",
        description="ipam-bridge default/claim-1",
        owner=OWNER,
    )
    assert (second.address, second.gateway) == ("10.20.0.3", "10.20.0.1")
    assert urls(rsps)[2:5] == [
        f"GET {BASE}/addresses/search_hostname/default.claim-1/",
        f"POST {BASE}/addresses/",
        f"POST {BASE}/addresses/first_free/7/",
    ]
    assert posts(rsps, "addresses/") == 1  # once per client, not per allocation
    assert len(RESERVED_GATEWAY_DESCRIPTION) <= 64


@pytest.mark.parametrize(
    ("answer", "status"), [(IP_EXISTS, 409), (DUPLICATE_ENTRY, 500)], ids=["409", "500-duplicate"]
)
def test_gateway_registered_by_someone_else_is_left_alone(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    sleeps: list[float],
    answer: str,
    status: int,
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", subnet_7_without_gateway())
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/", answer, status, json_body=GATEWAY_ROW_BODY)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)
    add(rsps, "GET", "addresses/search_hostname/default.claim-2/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_13, 201)

    backend = make(gateway=GATEWAY_OVERRIDE)
    assert backend.allocate("default.claim-1", OWNER).address == "10.20.0.2"
    assert backend.allocate("default.claim-2", OWNER).address == "10.20.0.3"

    assert posts(rsps, "addresses/") == 1
    assert sleeps == []  # a registered gateway is not a failure to retry
    assert not [c for c in rsps.calls if c.request.method in ("PATCH", "DELETE")]


@pytest.mark.parametrize(
    ("gateway", "subnet"),
    [
        ("10.20.0.1", SUBNET_7),  # phpIPAM's own gateway: already a row (is_gateway)
        ("10.99.0.1", subnet_7_without_gateway()),  # outside the subnet: never offered
        ("10.20.0.0", subnet_7_without_gateway()),  # network address: never offered
        ("10.20.0.255", subnet_7_without_gateway()),  # broadcast address: never offered
    ],
    ids=["phpipam-gateway", "outside", "network", "broadcast"],
)
def test_gateway_that_first_free_never_offers_is_not_registered(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend], gateway: str, subnet: str
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", subnet)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)

    allocation = make(gateway=gateway).allocate("default.claim-1", OWNER)

    assert (allocation.address, allocation.gateway) == ("10.20.0.2", gateway)
    assert posts(rsps, "addresses/") == 0


def test_no_gateway_at_all_registers_nothing(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", subnet_7_without_gateway())
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", created(12, "10.20.0.1"), 201)

    allocation = make().allocate("default.claim-1", OWNER)

    assert (allocation.address, allocation.gateway) == ("10.20.0.1", None)
    assert posts(rsps, "addresses/") == 0


def test_gateway_handed_out_by_first_free_is_kept_as_the_gateway_row(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    """A 409 said the gateway had a row, but the row went (deleted by a person) meanwhile."""
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", subnet_7_without_gateway())
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/", IP_EXISTS, 409)
    add(rsps, "POST", "addresses/first_free/7/", created(30, "10.20.0.1"), 201)
    add(
        rsps,
        "PATCH",
        "addresses/30/",
        UPDATED,
        json_body={
            "hostname": RESERVED_GATEWAY_HOSTNAME,
            "description": RESERVED_GATEWAY_DESCRIPTION,
        },
    )
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)

    allocation = make(gateway=GATEWAY_OVERRIDE).allocate("default.claim-1", OWNER)

    assert (allocation.address, allocation.ref) == ("10.20.0.2", "12")
    assert urls(rsps)[-3:] == [
        f"POST {BASE}/addresses/first_free/7/",
        f"PATCH {BASE}/addresses/30/",
        f"POST {BASE}/addresses/first_free/7/",
    ]
    assert not [c for c in rsps.calls if c.request.method == "DELETE"]


@pytest.mark.parametrize(
    ("address", "hostname", "fragment"),
    [
        ("10.20.0.0", RESERVED_NETWORK_HOSTNAME, "network address"),
        ("10.20.0.255", RESERVED_BROADCAST_HOSTNAME, "broadcast address"),
    ],
)
def test_network_and_broadcast_of_a_pool_subnet_are_never_assigned(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    address: str,
    hostname: str,
    fragment: str,
) -> None:
    """An "is pool" subnet hands out its network and broadcast addresses (A.5)."""
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", SUBNET_7.replace('"isPool":0', '"isPool":1'))
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", created(40, address), 201)
    add(rsps, "PATCH", "addresses/40/", UPDATED)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)

    allocation = make().allocate("default.claim-1", OWNER)

    assert allocation.address == "10.20.0.2"
    patch = next(c.request for c in rsps.calls if c.request.method == "PATCH")
    sent = json.loads(patch.body or b"{}")
    assert sent["hostname"] == hostname
    assert fragment in sent["description"]
    assert len(sent["description"]) <= 64


def test_slash_31_hands_out_both_addresses(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    """/31 and /32 have no network or broadcast address (RFC 3021; A.5)."""
    subnet = subnet_7_without_gateway(subnet="10.20.5.0", mask="31")
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", subnet)
    add(rsps, "GET", "addresses/search_hostname/p2p.a/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", created(50, "10.20.5.0"), 201)

    allocation = make().allocate("p2p.a", OWNER)

    assert (allocation.address, allocation.prefix) == ("10.20.5.0", 31)
    assert not [c for c in rsps.calls if c.request.method == "PATCH"]


def test_offering_only_reserved_addresses_ends_in_an_error(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", SUBNET_7)
    add(rsps, "GET", "addresses/search_hostname/default.claim-1/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/first_free/7/", created(60, "10.20.0.1"), 201)
    add(rsps, "PATCH", "addresses/60/", UPDATED)

    with pytest.raises(BackendUnavailableError, match="never assigned"):
        make(retry=RetryPolicy(attempts=1)).allocate("default.claim-1", OWNER)
    # network, broadcast and gateway: one POST per reserved address, plus one.
    assert posts(rsps, "addresses/first_free/7/") == 4


def test_row_of_the_hostname_at_the_gateway_is_renamed_not_adopted(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", subnet_7_without_gateway())
    search = "addresses/search_hostname/default.claim-1/"
    add(rsps, "GET", search, search_rows((30, 7, "10.20.0.1", "default.claim-1")))

    backend = make(gateway=GATEWAY_OVERRIDE)
    assert backend.find("default.claim-1") is None

    add(rsps, "PATCH", "addresses/30/", UPDATED)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)
    allocation = backend.allocate("default.claim-1", OWNER)

    assert allocation.address == "10.20.0.2"
    patch = next(c.request for c in rsps.calls if c.request.method == "PATCH")
    assert json.loads(patch.body or b"{}")["hostname"] == RESERVED_GATEWAY_HOSTNAME
    # The renamed row is the gateway's row now: nothing more to register.
    assert posts(rsps, "addresses/") == 0


@pytest.mark.parametrize(
    "hostname",
    [RESERVED_GATEWAY_HOSTNAME, RESERVED_NETWORK_HOSTNAME, RESERVED_BROADCAST_HOSTNAME.upper()],
)
def test_reserved_hostnames_are_never_a_claims_key(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend], hostname: str
) -> None:
    _prime(rsps)
    backend = make()

    for call in (
        backend.find,
        lambda h: backend.release(h, OWNER),
        lambda h: backend.allocate(h, OWNER),
    ):
        with pytest.raises(InvalidRequestError, match="reserved"):
            call(hostname)
    assert not [u for u in urls(rsps) if "/addresses/" in u]


def test_describe_counts_an_unregistered_gateway_as_used(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    usage_empty = USAGE_7.replace('"Used":1', '"Used":0').replace('"used":"1"', '"used":0')
    usage_empty = usage_empty.replace('"freehosts":"253"', '"freehosts":"254"')
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", subnet_7_without_gateway())
    add(rsps, "GET", "subnets/7/usage/", usage_empty)
    add(rsps, "GET", f"addresses/search/{GATEWAY_OVERRIDE}/", ADDRESS_NOT_FOUND, 404)

    backend = make(gateway=GATEWAY_OVERRIDE)
    before = backend.describe_subnets()[0]

    assert before == SubnetInfo(
        cidr="10.20.0.0/24", prefix=24, gateway="10.20.0.1", total=254, used=1, free=253
    )

    # Registered by someone meanwhile: phpIPAM counts it now, and the row is remembered.
    rsps.replace(
        "GET",
        f"{BASE}/addresses/search/{GATEWAY_OVERRIDE}/",
        body=search_gateway(7),
        content_type=JSON,
    )
    rsps.replace("GET", f"{BASE}/subnets/7/usage/", body=USAGE_7, content_type=JSON)
    after = backend.describe_subnets()[0]
    again = backend.describe_subnets()[0]

    assert after == again == before
    assert urls(rsps).count(f"GET {BASE}/addresses/search/{GATEWAY_OVERRIDE}/") == 2


def test_describe_does_not_look_up_phpipams_own_gateway(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", SUBNET_7)
    add(rsps, "GET", "subnets/7/usage/", USAGE_7)

    info = make().describe_subnets()[0]

    assert (info.gateway, info.used, info.free) == ("10.20.0.1", 1, 253)
    assert not [u for u in urls(rsps) if "addresses/search/" in u]


def test_describe_ignores_a_gateway_row_of_another_subnet(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", subnet_7_without_gateway())
    add(rsps, "GET", "subnets/7/usage/", USAGE_7)
    add(rsps, "GET", f"addresses/search/{GATEWAY_OVERRIDE}/", search_gateway(3))

    info = make(gateway=GATEWAY_OVERRIDE).describe_subnets()[0]

    assert (info.used, info.free) == (2, 252)


ADDRESS_NOT_FOUND = '{"code":404,"success":false,"message":"Address not found","time":0.002}'


def search_gateway(subnet_id: int) -> str:
    """``GET addresses/search/{ip}/`` (4h) finding the gateway row in ``subnet_id``."""
    return search_rows((21, subnet_id, GATEWAY_OVERRIDE, RESERVED_GATEWAY_HOSTNAME))


def test_parallel_allocations_register_the_gateway_once(
    rsps: responses.RequestsMock, make: Callable[..., PHPIPAMBackend]
) -> None:
    add_login(rsps)
    add(rsps, "GET", "subnets/7/", subnet_7_without_gateway())
    for i in range(8):
        add(rsps, "GET", f"addresses/search_hostname/default.c{i}/", HOSTNAME_NOT_FOUND, 404)
    add(rsps, "POST", "addresses/", CREATED_21, 201, json_body=GATEWAY_ROW_BODY)
    add(rsps, "POST", "addresses/first_free/7/", CREATED_12, 201)

    backend = make(gateway=GATEWAY_OVERRIDE)
    counter = iter(range(8))
    lock = threading.Lock()

    def one() -> str:
        with lock:
            i = next(counter)
        return backend.allocate(f"default.c{i}", OWNER).address

    assert set(_in_threads(one, 8)) == {"10.20.0.2"}
    assert posts(rsps, "addresses/") == 1


@pytest.mark.parametrize(
    ("fields", "gateway"),
    [
        ({"subnet_id": 7, "gateway": " 10.20.0.1 "}, "10.20.0.1"),
        ({"subnet": "2001:db8:20::/64", "gateway": "2001:DB8:20:0::1"}, "2001:db8:20::1"),
        ({"subnet_id": 7}, None),
    ],
)
def test_gateway_override_is_normalised(fields: dict[str, Any], gateway: str | None) -> None:
    config = PHPIPAMConfig(
        endpoint=ENDPOINT, app_id="capi", username=USERNAME, password=PASSWORD, **fields
    )
    assert config.gateway == gateway


@pytest.mark.parametrize(
    "fields",
    [
        {"subnet_id": 7, "gateway": "10.20.0.300"},
        {"subnet_id": 7, "gateway": "gw.example.com"},
        {"subnet": "10.20.0.0/24", "gateway": "2001:db8::1"},
    ],
    ids=["bad-ipv4", "name", "other-family"],
)
def test_invalid_gateway_override_is_rejected(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="gateway"):
        PHPIPAMConfig(
            endpoint=ENDPOINT, app_id="capi", username=USERNAME, password=PASSWORD, **fields
        )


# ---------------------------------------------------------------- the concurrency limit

LOCK_TIMEOUT = (
    '{"code":500,"success":false,"message":"Cannot obtain lock for API request","time":30.0}'
)


@pytest.mark.parametrize(
    ("body", "status", "content_type", "lowered"),
    [
        (DUPLICATE_ENTRY, 500, JSON, False),  # a lost first-free race
        (WRONG_PASSWORD, 500, JSON, False),  # wrong credentials
        (
            '{"code":500,"success":false,"message":"10.30.0.5 is not a valid address for '
            'subnet 10.20.0.0\\/24","time":0.002}',
            500,
            JSON,
            False,
        ),
        (LOCK_TIMEOUT, 500, JSON, True),  # the server's API lock: it is busy
        ("", 500, "text/html; charset=UTF-8", True),  # a PHP fatal error
        ('{"code":503,"success":false,"message":"x","time":0}', 503, JSON, True),
        (HOSTNAME_NOT_FOUND, 404, JSON, False),
    ],
    ids=["duplicate-entry", "login-refused", "invalid-address", "lock", "fatal", "503", "404"],
)
def test_only_answers_of_a_busy_or_failing_phpipam_lower_its_concurrency_limit(
    rsps: responses.RequestsMock,
    make: Callable[..., PHPIPAMBackend],
    body: str,
    status: int,
    content_type: str,
    lowered: bool,
) -> None:
    flow = FlowControl(max_concurrent=4, failure_threshold=100)
    _prime(rsps)
    add(
        rsps, "GET", "addresses/search_hostname/default.c/", body, status, content_type=content_type
    )
    backend = make(endpoints=flow, retry=RetryPolicy(attempts=1, sleep=lambda _: None))

    with contextlib.suppress(BackendError):
        backend.find("default.c")

    assert flow.endpoint(endpoint_key(ENDPOINT)).limit == (2 if lowered else 4)
