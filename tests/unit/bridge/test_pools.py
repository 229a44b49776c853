import json
from pathlib import Path

import pytest
import trustme
import yaml

from backends.base import SubnetInfo, SubnetRef
from backends.infoblox import InfobloxBackend
from backends.phpipam import PHPIPAMBackend
from backends.retry import RetryPolicy
from bridge.models import Condition, PoolStatus, wire
from bridge.reconcilers.errors import PoolError
from bridge.reconcilers.pool_backends import (
    LOCATION_FIELDS,
    build_backend,
    fingerprint,
    location_of,
    parse_pool,
    pool_conditions,
    pool_failed_status,
    pool_status,
    status_patch,
    subnet_refs,
    with_location,
)


def shown(status: PoolStatus) -> dict:
    """A status as the API shows it, ``gateway`` None when it holds none."""
    return {"gateway": None, **wire(status)}


def wire_all(conditions) -> list:
    return [wire(c) for c in conditions]


def php_pool(**spec):
    base = {
        "endpoint": "https://ipam.example.com/api",
        "appId": "capi",
        "subnetId": 7,
        "credentialsRef": {"name": "creds"},
    }
    base.update(spec)
    return {
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
        "kind": "PHPIPAMIPPool",
        "metadata": {"name": "pool", "namespace": "ns", "uid": "u1", "generation": 2},
        "spec": {k: v for k, v in base.items() if v is not None},
    }


def ib_pool(**spec):
    base = {
        "endpoint": "https://gm.example.com",
        "subnet": "10.30.0.0/24",
        "credentialsRef": {"name": "creds"},
    }
    base.update(spec)
    return {"kind": "InfobloxIPPool", "metadata": {"name": "ib", "namespace": "ns"}, "spec": base}


def test_parse_phpipam_pool():
    pool = parse_pool(
        php_pool(
            gateway="10.0.0.254",
            prefix=23,
            hostnameSuffix="mgmt",
            tls={"caSecretRef": {"name": "ca"}},
        )
    )
    assert pool.key == ("ns", "PHPIPAMIPPool", "pool")
    assert (pool.gateway, pool.prefix, pool.hostname_suffix) == ("10.0.0.254", 23, "mgmt")
    assert pool.tls.ca_secret_name == "ca" and pool.tls.ca_secret_key == "ca.crt"
    assert not pool.tls.insecure_skip_verify
    assert pool.generation == 2 and not pool.deleting


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (php_pool(endpoint="ftp://x"), "endpoint"),
        (php_pool(credentialsRef={}), "credentialsRef"),
        (php_pool(credentialsRef={"name": "c", "namespace": "other"}), "another namespace"),
        (php_pool(subnet="10.0.0.0/24"), "exactly one"),
        (php_pool(subnetId=None), "exactly one"),
        (php_pool(subnetId=None, subnet="10.0.0.1/24"), "CIDR"),
        (php_pool(appId=None), "appId"),
        (php_pool(gateway="not-an-ip"), "gateway"),
        (php_pool(prefix=129), "prefix"),
        (ib_pool(subnet=None), "subnet"),
        ({"kind": "Other", "metadata": {}, "spec": {}}, "kind"),
    ],
)
def test_invalid_pools_say_what_is_wrong(body, fragment):
    with pytest.raises(PoolError) as info:
        parse_pool(body)
    assert info.value.reason == "InvalidSpec"
    assert fragment in info.value.message
    assert info.value.needs_person


def test_build_backend_picks_the_client_and_credential_mode():
    retry = RetryPolicy(sleep=lambda _: None)
    backend = build_backend(
        parse_pool(php_pool()), {"token": "app-code"}, None, timeout_seconds=3, retry=retry
    )
    assert isinstance(backend, PHPIPAMBackend)
    assert backend.config.app_code == "app-code" and backend.config.username is None
    assert backend.config.verify is True and backend.config.timeout_seconds == 3
    ca_pem = trustme.CA().cert_pem.bytes().decode()
    backend = build_backend(
        parse_pool(php_pool()),
        {"username": "u", "password": "p"},
        ca_pem,
        timeout_seconds=3,
        retry=retry,
    )
    assert backend.config.username == "u" and backend.config.app_code is None
    # The CA goes to the client as PEM text (an ssl.SSLContext), never through a file.
    assert backend.config.verify is True and backend.config.ca_pem == ca_pem
    with pytest.raises(PoolError, match="CA bundle") as caught:
        build_backend(
            parse_pool(php_pool()),
            {"username": "u", "password": "p"},
            "-----BEGIN CERTIFICATE-----\n",
            timeout_seconds=3,
            retry=retry,
        )
    assert caught.value.reason == "InvalidSpec"
    backend = build_backend(
        parse_pool(ib_pool(tls={"insecureSkipVerify": True})),
        {"username": "u", "password": "p"},
        None,
        timeout_seconds=3,
        retry=retry,
    )
    assert isinstance(backend, InfobloxBackend) and backend.config.verify is False
    assert backend.config.owner_extensible_attribute is None


def test_build_backend_gives_the_infoblox_client_the_pools_owner_ea():
    backend = build_backend(
        parse_pool(ib_pool(ownerExtensibleAttribute="CAPI-Owner")),
        {"username": "u", "password": "p"},
        None,
        timeout_seconds=3,
        retry=RetryPolicy(sleep=lambda _: None),
    )
    assert isinstance(backend, InfobloxBackend)
    assert backend.config.owner_extensible_attribute == "CAPI-Owner"


@pytest.mark.parametrize(
    ("body", "secret"),
    [
        (php_pool(), {}),
        (php_pool(), {"username": "u"}),
        (ib_pool(), {"token": "t"}),
    ],
)
def test_build_backend_names_the_missing_secret_keys(body, secret):
    with pytest.raises(PoolError) as info:
        build_backend(parse_pool(body), secret, None, timeout_seconds=1, retry=RetryPolicy())
    assert info.value.reason == "CredentialsNotFound"
    assert "ns/creds" in info.value.message


def test_fingerprint_changes_with_spec_secret_and_ca():
    pool = parse_pool(php_pool())
    secret = {"password": "hunter2-Secret"}
    base = fingerprint(pool, secret, None)
    assert base == fingerprint(parse_pool(php_pool()), dict(secret), None)
    assert base != fingerprint(pool, {"password": "other"}, None)
    assert base != fingerprint(pool, secret, "pem")
    assert base != fingerprint(parse_pool(php_pool(subnetId=8)), secret, None)
    assert "hunter2" not in base


def test_pool_status_uses_overrides_and_saturates_ipv6_counts():
    info = SubnetInfo(
        cidr="10.0.0.0/24", prefix=24, gateway="10.0.0.1", total=254, used=4, free=250
    )
    status = shown(pool_status(parse_pool(php_pool()), [info]))
    assert status["subnet"] == "10.0.0.0/24" and status["prefix"] == 24
    assert status["gateway"] == "10.0.0.1"
    assert status["ipAddresses"] == {"total": 254, "used": 4, "free": 250}
    assert status["observedGeneration"] == 2
    (ready,) = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("True", "PoolReady")
    override = shown(pool_status(parse_pool(php_pool(gateway="10.0.0.254", prefix=23)), [info]))
    assert (override["gateway"], override["prefix"]) == ("10.0.0.254", 23)
    v6 = SubnetInfo(
        cidr="2001:db8::/64", prefix=64, gateway=None, total=2**64, used=3, free=2**64 - 3
    )
    status = shown(pool_status(parse_pool(php_pool()), [v6]))
    assert status["ipAddresses"]["total"] == 2**63 - 1
    assert status["gateway"] is None


def test_pool_failed_status():
    error = PoolError("AuthenticationFailed", "wrong password", needs_person=True)
    pool = parse_pool({**php_pool(), "metadata": {"name": "p", "namespace": "ns", "generation": 4}})
    status = shown(pool_failed_status(pool, error))
    (ready,) = status["conditions"]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "AuthenticationFailed",
        "wrong password",
    )
    assert status["observedGeneration"] == 4


@pytest.mark.parametrize(
    "endpoint", ["https://user:pw@ipam.example.com/api", "https://ipam.example.com/api?x=1"]
)
def test_client_refusals_become_invalid_spec(endpoint):
    with pytest.raises(PoolError) as info:
        build_backend(
            parse_pool(php_pool(endpoint=endpoint)),
            {"token": "t"},
            None,
            timeout_seconds=1,
            retry=RetryPolicy(),
        )
    assert info.value.reason == "InvalidSpec"
    assert "pw" not in info.value.message


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (ib_pool(recordType="a"), "spec.recordType 'a' must be 'host' or 'fixedaddress'"),
        (php_pool(subnetId="seven"), "spec.subnetId"),
        ({"kind": "PHPIPAMIPPool", "metadata": {"namespace": "ns"}}, "spec.endpoint"),
        (php_pool(credentialsRef={"name": "c", "namespace": "other"}, gateway="x"), "another"),
    ],
)
def test_invalid_pools_name_the_field(body, fragment):
    with pytest.raises(PoolError) as info:
        parse_pool(body)
    assert (info.value.reason, info.value.needs_person) == ("InvalidSpec", True)
    assert fragment in info.value.message


def test_pool_null_and_empty_fields_read_as_unset():
    pool = parse_pool(
        php_pool(gateway="", hostnameSuffix=None, tls={"caSecretRef": {"name": "", "key": ""}})
    )
    assert (pool.gateway, pool.hostname_suffix, pool.prefix) == (None, None, None)
    assert (pool.tls.ca_secret_name, pool.tls.ca_secret_key) == (None, "ca.crt")
    assert pool.spec.gateway is None
    assert parse_pool(ib_pool(recordType="", tls=None)).secret_refs == (("ns", "creds"),)


# -- several subnets, Global pools, grace period (issue 12) ---------------------------------

SUBNETS = [
    {"subnetId": 7},
    {"subnet": "10.1.0.0/29", "gateway": "10.1.0.6", "prefix": 28},
]


def test_subnets_fold_the_pool_overrides_under_each_entrys_own():
    pool = parse_pool(php_pool(subnetId=None, subnets=SUBNETS, gateway="10.0.0.254", prefix=23))
    assert subnet_refs(pool) == (
        SubnetRef(subnet_id=7, gateway="10.0.0.254", prefix=23),
        SubnetRef(cidr="10.1.0.0/29", gateway="10.1.0.6", prefix=28),
    )
    single = parse_pool(php_pool(gateway="10.0.0.254"))
    assert subnet_refs(single) == (SubnetRef(subnet_id=7, gateway="10.0.0.254"),)
    assert subnet_refs(parse_pool(ib_pool())) == (SubnetRef(cidr="10.30.0.0/24"),)


def test_grace_period_is_parsed_and_checked():
    assert parse_pool(php_pool()).grace_period_seconds == 0
    assert parse_pool(php_pool(addressReuseGracePeriodSeconds=90)).grace_period_seconds == 90
    with pytest.raises(PoolError, match="addressReuseGracePeriodSeconds"):
        parse_pool(php_pool(addressReuseGracePeriodSeconds=-1))


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (php_pool(subnets=SUBNETS), "exactly one of spec.subnetId, spec.subnet and spec.subnets"),
        (php_pool(subnetId=None), "exactly one of spec.subnetId, spec.subnet and spec.subnets"),
        (php_pool(subnetId=None, subnets=[{"gateway": "10.0.0.1"}]), "exactly one of subnetId"),
        (php_pool(subnetId=None, subnets=[{"subnet": "10.0.0.1/24"}]), "not a CIDR network"),
        (php_pool(subnetId=None, subnets=[{"subnetId": 7}] * 33), "1 to 32"),
        (ib_pool(subnets=[{"subnet": "10.31.0.0/24"}]), "exactly one of spec.subnet and"),
        (ib_pool(subnet=None, subnets=[{"subnetId": 7}]), "subnetId is phpIPAM's"),
    ],
)
def test_invalid_subnets_say_what_is_wrong(body, fragment):
    with pytest.raises(PoolError) as info:
        parse_pool(body)
    assert fragment in info.value.message


def global_pool(**spec):
    body = php_pool(**spec)
    body["kind"] = "GlobalPHPIPAMIPPool"
    del body["metadata"]["namespace"]
    return body


def test_a_global_pool_has_no_namespace_and_reads_the_named_ones():
    pool = parse_pool(
        global_pool(
            credentialsRef={"name": "creds", "namespace": "ipam"},
            tls={"caSecretRef": {"name": "ca", "namespace": "pki"}},
        )
    )
    assert pool.key == ("", "GlobalPHPIPAMIPPool", "pool") and pool.is_global
    assert pool.display == "GlobalPHPIPAMIPPool pool"
    assert pool.secret_refs == (("ipam", "creds"), ("pki", "ca"))
    with pytest.raises(PoolError, match=r"credentialsRef\.namespace is required"):
        parse_pool(global_pool())
    with pytest.raises(PoolError, match=r"caSecretRef\.namespace is required"):
        parse_pool(
            global_pool(
                credentialsRef={"name": "creds", "namespace": "ipam"},
                tls={"caSecretRef": {"name": "ca"}},
            )
        )
    # A namespaced pool naming its own namespace reads it as it always did.
    own = parse_pool(php_pool(credentialsRef={"name": "c", "namespace": "ns"}))
    assert own.secret_refs == (("ns", "c"),)


def test_build_backend_gives_the_client_every_subnet():
    retry = RetryPolicy(sleep=lambda _: None)
    pool = parse_pool(php_pool(subnetId=None, subnets=SUBNETS, gateway="10.0.0.254"))
    backend = build_backend(pool, {"token": "t"}, None, timeout_seconds=3, retry=retry)
    assert tuple(backend.config.subnets) == subnet_refs(pool)
    ib = parse_pool(ib_pool(subnet=None, subnets=[{"subnet": "10.30.0.0/24"}]))
    backend = build_backend(
        ib, {"username": "u", "password": "p"}, None, timeout_seconds=3, retry=retry
    )
    assert tuple(backend.config.subnets) == (SubnetRef(cidr="10.30.0.0/24"),)


def test_a_recorded_location_brings_its_subnets():
    old = parse_pool(php_pool(subnetId=None, subnets=SUBNETS[:1]))
    grown = parse_pool(php_pool(subnetId=None, subnets=SUBNETS))
    assert json.loads(location_of(old))["subnets"] == SUBNETS[:1]
    assert subnet_refs(with_location(grown, location_of(old))) == subnet_refs(old)
    assert with_location(grown, location_of(grown)) is grown


def info(cidr, total, used, gateway=None, prefix=None):
    return SubnetInfo(
        cidr=cidr,
        prefix=prefix or int(cidr.rsplit("/", 1)[1]),
        gateway=gateway,
        total=total,
        used=used,
        free=total - used,
    )


def test_pool_status_per_subnet_and_summed():
    pool = parse_pool(php_pool(subnetId=None, subnets=SUBNETS))
    status = shown(
        pool_status(
            pool, [info("10.0.0.0/29", 6, 6, "10.0.0.1"), info("10.1.0.0/29", 6, 1, "10.1.0.1")]
        )
    )
    assert status["subnets"] == [
        {
            "cidr": "10.0.0.0/29",
            "prefix": 29,
            "gateway": "10.0.0.1",
            "ipAddresses": {"total": 6, "used": 6, "free": 0},
        },
        {
            # The entry's overrides win over what the IPAM reports.
            "cidr": "10.1.0.0/29",
            "prefix": 28,
            "gateway": "10.1.0.6",
            "ipAddresses": {"total": 6, "used": 1, "free": 5},
        },
    ]
    assert (status["subnet"], status["prefix"], status["gateway"]) == (
        "10.0.0.0/29",
        29,
        "10.0.0.1",
    )
    assert status["ipAddresses"] == {"total": 12, "used": 7, "free": 5}
    (ready,) = status["conditions"]
    assert ready["message"] == (
        "2 subnets found (10.0.0.0/29, 10.1.0.0/29); usage in status.subnets"
    )
    no_gateway = shown(pool_status(parse_pool(php_pool()), [info("10.0.0.0/29", 6, 0)]))
    assert "gateway" not in no_gateway["subnets"][0] and no_gateway["gateway"] is None


def test_pool_status_keeps_conditions_of_other_types_in_place():
    in_sync = {"type": "InSync", "status": "True", "reason": "NoDrift", "message": ""}
    old_ready = {"type": "Ready", "status": "False", "reason": "X", "message": "m"}
    previous = [old_ready, in_sync]
    pool = parse_pool({**php_pool(), "status": {"conditions": previous}})
    status = shown(pool_status(pool, [info("10.0.0.0/29", 6, 0)]))
    assert [c["type"] for c in status["conditions"]] == ["Ready", "InSync"]
    assert status["conditions"][1] == in_sync
    failed = shown(
        pool_failed_status(
            parse_pool({**php_pool(), "status": {"conditions": [in_sync]}}),
            PoolError("SubnetNotFound", "gone", needs_person=True),
        )
    )
    assert [c["type"] for c in failed["conditions"]] == ["InSync", "Ready"]
    assert wire_all(
        pool_conditions([Condition(**in_sync)], Condition(type="InSync", status="False"))
    ) == [{"type": "InSync", "status": "False"}]


# -- what the typed pool writes stays as it was -----------------------------------------------


def _location_as_written_before(kind, spec):
    """The IPAM-location annotation as earlier releases wrote it: raw spec fields, compact."""
    fields = LOCATION_FIELDS[kind]
    return json.dumps(
        {k: spec[k] for k in fields if k in spec}, sort_keys=True, separators=(",", ":")
    )


@pytest.mark.parametrize(
    "body",
    [
        php_pool(),
        php_pool(sectionId=3, hostnameSuffix="lab", gateway="10.0.0.1", prefix=24),
        php_pool(subnetId=None, subnet="10.9.0.0/24", endpoint="https://ipam.example.com/api/"),
        php_pool(subnetId=None, subnets=[*SUBNETS, {"subnet": "10.2.0.0/24", "gateway": ""}]),
        {**php_pool(), "spec": {**php_pool()["spec"], "sectionId": None}},
        ib_pool(),
        ib_pool(recordType="", dnsZone="", dnsView="", networkView="corp"),
        ib_pool(recordType="fixedaddress", dnsZone="lab.example.com.", wapiVersion="2.13"),
        ib_pool(subnet=None, subnets=[{"subnet": "10.30.0.0/24", "prefix": 25}]),
        {**ib_pool(), "kind": "GlobalInfobloxIPPool", "metadata": {"name": "g"}},
    ],
)
def test_the_location_annotation_is_written_as_before(body):
    spec = {**body["spec"]}
    if body["kind"].startswith("Global"):
        spec["credentialsRef"] = {"name": "creds", "namespace": "ipam"}
    body = {**body, "spec": spec}
    pool = parse_pool(body)
    assert location_of(pool) == _location_as_written_before(body["kind"], spec)
    # A recorded location is written back as it was recorded.
    recorded = json.dumps({**json.loads(location_of(pool)), "endpoint": "https://old.example"})
    moved = with_location(pool, recorded)
    assert location_of(moved) == _location_as_written_before(body["kind"], json.loads(recorded))


def test_the_location_annotation_text_is_pinned():
    pool = parse_pool(php_pool(sectionId=3, hostnameSuffix="lab"))
    assert location_of(pool) == (
        '{"appId":"capi","endpoint":"https://ipam.example.com/api","sectionId":3,"subnetId":7}'
    )
    ib = parse_pool(
        ib_pool(recordType="", dnsZone="lab.", subnet=None, subnets=[{"subnet": "10.30.0.0/24"}])
    )
    assert location_of(ib) == (
        # As read: the empty recordType and the null subnet too.
        '{"dnsZone":"lab.","endpoint":"https://gm.example.com","recordType":"",'
        '"subnet":null,"subnets":[{"subnet":"10.30.0.0/24"}]}'
    )


def _schema_paths(schema, prefix=""):
    """Every property path a CRD's structural schema knows (``subnets[].cidr``...)."""
    paths = set()
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}{name}"
        paths.add(path)
        paths |= _schema_paths(sub, f"{path}.")
        if "items" in sub:
            paths |= _schema_paths(sub["items"], f"{path}[].")
    return paths


def _paths(value, prefix=""):
    paths = set()
    for name, sub in value.items():
        path = f"{prefix}{name}"
        paths.add(path)
        if isinstance(sub, dict):
            paths |= _paths(sub, f"{path}.")
        elif isinstance(sub, list):
            for item in sub:
                if isinstance(item, dict):
                    paths |= _paths(item, f"{path}[].")
    return paths


@pytest.mark.parametrize(
    "crd",
    sorted((Path(__file__).resolve().parents[3] / "crds").glob("ipam.cluster.x-k8s.io_*.yaml")),
    ids=lambda p: p.name,
)
def test_the_status_written_holds_only_fields_of_the_crd_schema(crd):
    document = yaml.safe_load(crd.read_text())
    (version,) = document["spec"]["versions"]
    known = _schema_paths(version["schema"]["openAPIV3Schema"]["properties"]["status"])
    pool = parse_pool(
        php_pool(subnetId=None, subnets=SUBNETS, status={"conditions": [{"type": "InSync"}]})
    )
    infos = [info("10.0.0.0/29", 6, 6, "10.0.0.1"), info("10.1.0.0/29", 6, 1)]
    status = pool_status(pool, infos)
    failed = pool_failed_status(pool, PoolError("SubnetNotFound", "gone", needs_person=True))
    for written in (
        wire(status),
        status_patch(pool.status, status),
        status_patch(pool.status, failed),
    ):
        assert _paths(written) <= known, _paths(written) - known


def test_the_status_patch_is_a_minimal_diff():
    body = php_pool(gateway="10.0.0.254")
    first = pool_status(parse_pool(body), [info("10.0.0.0/29", 6, 1)])
    written = {**body, "status": wire(first)}
    pool = parse_pool(written)
    assert status_patch(pool.status, pool_status(pool, [info("10.0.0.0/29", 6, 1)])) == {}
    assert status_patch(pool.status, pool_status(pool, [info("10.0.0.0/29", 6, 2)])) == {
        "subnets": [
            {
                "cidr": "10.0.0.0/29",
                "prefix": 29,
                "gateway": "10.0.0.254",
                "ipAddresses": {"total": 6, "used": 2, "free": 4},
            }
        ],
        "ipAddresses": {"total": 6, "used": 2, "free": 4},
    }
    # A gateway the pool no longer has is removed (null in the merge patch).
    without = parse_pool({**written, "spec": {**body["spec"], "gateway": None}})
    patch = status_patch(without.status, pool_status(without, [info("10.0.0.0/29", 6, 1)]))
    assert patch["gateway"] is None and "gateway" not in patch["subnets"][0]
    assert "conditions" not in patch  # the Ready condition did not change
    failed = pool_failed_status(pool, PoolError("SubnetNotFound", "gone", needs_person=True))
    assert set(status_patch(pool.status, failed)) == {"conditions"}
