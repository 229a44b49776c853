"""Checks of the CRDs in crds/ (our pools) and crds/capi/ (copies of CAPI's IPAM CRDs).

What an API server would check, without one:

- every file is an ``apiextensions.k8s.io/v1`` CRD and every version's schema is *structural*
  (the rules of "Specifying a structural schema" in the Kubernetes CRD docs);
- printer-column JSONPaths name fields of the schema, with a matching type;
- every ``default`` validates against the schema it sits in;
- example objects (``tests/data/*.yaml`` and variations of them) are accepted or rejected as the API
  server would: defaults applied first (like the API server does on decode), then the OpenAPI schema
  with ``jsonschema`` (unknown fields rejected, as with ``kubectl``'s default strict field
  validation), then the ``x-kubernetes-validations`` CEL rules, evaluated by
  ``mock_kubernetes.cel`` (cel-python), the implementation the in-memory API enforces them with;
- updates: transition rules (those that use ``oldSelf``) are evaluated as the API server does,
  only on an update and only where the old object has a value at the rule's place (for an object
  property, whether it exists; items of lists other than ``list-type: map`` are not correlated,
  and no transition rule sits below a list); a rule without ``oldSelf`` that fails on a value
  unchanged since the old object is ratcheted (a warning, not an error), as on the API server.

The CEL rules only use standard CEL functions (a test enforces it), so celpy evaluates them with the
same semantics as the API server (regular expressions are RE2 in both). What is not checked here:
CEL type checking and cost estimation, which only a real API server does (tests/e2e).
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from mock_kubernetes import cel

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"
CAPI_DIR = CRD_DIR / "capi"
DATA_DIR = REPO / "tests" / "data"

GROUP = "ipam.cluster.x-k8s.io"
POOL_FILES = {
    "PHPIPAMIPPool": CRD_DIR / "ipam.cluster.x-k8s.io_phpipamippools.yaml",
    "InfobloxIPPool": CRD_DIR / "ipam.cluster.x-k8s.io_infobloxippools.yaml",
    "GlobalPHPIPAMIPPool": CRD_DIR / "ipam.cluster.x-k8s.io_globalphpipamippools.yaml",
    "GlobalInfobloxIPPool": CRD_DIR / "ipam.cluster.x-k8s.io_globalinfobloxippools.yaml",
}
#: The cluster-scoped pool kinds and their namespaced twins (same spec).
GLOBAL_TWINS = {"GlobalPHPIPAMIPPool": "PHPIPAMIPPool", "GlobalInfobloxIPPool": "InfobloxIPPool"}
CAPI_FILES = {
    "IPAddressClaim": CAPI_DIR / "ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
    "IPAddress": CAPI_DIR / "ipam.cluster.x-k8s.io_ipaddresses.yaml",
}
#: Every CRD file of ours and our IPAM copies; CAPI's Cluster CRDs (crds/capi/cluster.x-k8s.io_*,
#: upstream files kept unchanged: tests/unit/bridge/test_control_plane_endpoints.py) are not.
ALL_CRD_FILES = sorted(
    p
    for p in CRD_DIR.rglob("*.yaml")
    if p.name != "kustomization.yaml" and not p.name.startswith("cluster.x-k8s.io_")
)

Schema = dict[str, Any]
Obj = dict[str, Any]


# --------------------------------------------------------------------------- loading


def load_crd(path: Path) -> Obj:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert len(docs) == 1, f"{path.name}: expected one document, found {len(docs)}"
    crd: Obj = docs[0]
    return crd


def version_of(crd: Obj, name: str) -> Obj:
    for version in crd["spec"]["versions"]:
        if version["name"] == name:
            v: Obj = version
            return v
    raise KeyError(f"{crd['metadata']['name']} has no version {name}")


def schema_of(crd: Obj, version: str) -> Schema:
    s: Schema = version_of(crd, version)["schema"]["openAPIV3Schema"]
    return s


def all_versions() -> Iterator[tuple[str, Obj, Obj]]:
    for path in ALL_CRD_FILES:
        crd = load_crd(path)
        for version in crd["spec"]["versions"]:
            yield f"{path.relative_to(CRD_DIR)}:{version['name']}", crd, version


VERSIONS = list(all_versions())
VERSION_IDS = [v[0] for v in VERSIONS]


def load_docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def example(kind: str) -> Obj:
    """The example object of ``kind`` from tests/data (a fresh copy).

    A Global kind's example is its twin's, cluster-scoped: no namespace, and the Secret
    references name the Secrets' namespace (required there).
    """
    if kind in GLOBAL_TWINS:
        pool = example(GLOBAL_TWINS[kind])
        pool["kind"] = kind
        pool["metadata"].pop("namespace", None)
        pool["spec"]["credentialsRef"]["namespace"] = "capi-credentials"
        ca = pool["spec"].get("tls", {}).get("caSecretRef")
        if ca is not None:
            ca["namespace"] = "capi-credentials"
        return pool
    for path in sorted(DATA_DIR.glob("*.yaml")):
        for doc in load_docs(path):
            if doc.get("kind") == kind:
                return copy.deepcopy(doc)
    raise LookupError(kind)


# --------------------------------------------------------------------------- schema walking

JUNCTORS = ("allOf", "anyOf", "oneOf", "not")


def child_schemas(node: Schema) -> Iterator[tuple[str, Schema]]:
    """Direct sub-schemas of ``node`` that describe data (not the junctor branches)."""
    for name, sub in node.get("properties", {}).items():
        yield f".{name}", sub
    if isinstance(node.get("items"), dict):
        yield "[]", node["items"]
    if isinstance(node.get("additionalProperties"), dict):
        yield ".*", node["additionalProperties"]


def junctor_schemas(node: Schema) -> Iterator[Schema]:
    for key in JUNCTORS:
        value = node.get(key)
        if isinstance(value, list):
            yield from value
        elif isinstance(value, dict):
            yield value


def walk(node: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    yield path, node
    for suffix, sub in child_schemas(node):
        yield from walk(sub, path + suffix)


# --------------------------------------------------------------------------- structural checker

FORBIDDEN_KEYS = {
    "$ref",
    "$schema",
    "definitions",
    "dependencies",
    "patternProperties",
    "additionalItems",
    "id",
}
NOT_IN_JUNCTORS = {"description", "type", "default", "additionalProperties", "nullable"}


def _junctor_errors(branch: Schema, outer: Schema, path: str) -> list[str]:
    errors = []
    for key in NOT_IN_JUNCTORS & branch.keys():
        errors.append(f"{path}: '{key}' inside a logical junctor")
    errors += [
        f"{path}: '{k}' inside a logical junctor" for k in branch if k.startswith("x-kubernetes-")
    ]
    for name, sub in branch.get("properties", {}).items():
        if name not in outer.get("properties", {}):
            errors.append(f"{path}.{name}: in a junctor but not in the structural schema")
        else:
            errors += _junctor_errors(sub, outer["properties"][name], f"{path}.{name}")
    if isinstance(branch.get("items"), dict):
        if not isinstance(outer.get("items"), dict):
            errors.append(f"{path}[]: items in a junctor but not in the structural schema")
        else:
            errors += _junctor_errors(branch["items"], outer["items"], f"{path}[]")
    for nested in junctor_schemas(branch):
        errors += _junctor_errors(nested, outer, path)
    return errors


def structural_errors(root: Schema) -> list[str]:
    """Reasons why ``root`` is not a structural schema (empty when it is one)."""
    errors: list[str] = []
    if root.get("type") != "object":
        errors.append("<root>: type must be object")
    metadata = root.get("properties", {}).get("metadata")
    if metadata is not None and set(metadata.get("properties", {})) - {"name", "generateName"}:
        errors.append(".metadata: only name and generateName may be restricted")
    for path, node in walk(root):
        where = path or "<root>"
        exempt = node.get("x-kubernetes-int-or-string") or node.get(
            "x-kubernetes-preserve-unknown-fields"
        )
        if not node.get("type") and not exempt:
            errors.append(f"{where}: no type")
        if node.get("type") == "array" and "items" not in node:
            errors.append(f"{where}: array without items")
        if "properties" in node and "additionalProperties" in node:
            errors.append(f"{where}: properties and additionalProperties together")
        if node.get("additionalProperties") is False:
            errors.append(f"{where}: additionalProperties: false is not allowed")
        if node.get("uniqueItems") is True:
            errors.append(f"{where}: uniqueItems: true is not allowed")
        errors += [f"{where}: '{k}' is not allowed" for k in FORBIDDEN_KEYS & node.keys()]
        for required in node.get("required", []):
            if required not in node.get("properties", {}):
                errors.append(f"{where}: required field {required!r} is not a property")
        if node.get("x-kubernetes-list-type") == "map":
            item = node.get("items", {})
            keys = node.get("x-kubernetes-list-map-keys") or []
            if not keys:
                errors.append(f"{where}: list-type map without list-map-keys")
            for key in keys:
                sub = item.get("properties", {}).get(key)
                if sub is None or (key not in item.get("required", []) and "default" not in sub):
                    errors.append(
                        f"{where}: map key {key!r} must be a required or defaulted property"
                    )
        for branch in junctor_schemas(node):
            errors += _junctor_errors(branch, node, where)
    return errors


# --------------------------------------------------------------------------- OpenAPI -> JSON Schema

FORMATS = jsonschema.FormatChecker(formats=())


def _checks(
    name: str, raises: tuple[type[Exception], ...] = (ValueError,)
) -> Callable[[Callable[[object], object]], Callable[[object], object]]:
    decorator: Callable[[Callable[[object], object]], Callable[[object], object]]
    decorator = FORMATS.checks(name, raises=raises)
    return decorator


@_checks("ipv4")
def _is_ipv4(value: object) -> bool:
    return not isinstance(value, str) or bool(ipaddress.IPv4Address(value))


@_checks("ipv6")
def _is_ipv6(value: object) -> bool:
    return not isinstance(value, str) or bool(ipaddress.IPv6Address(value))


@_checks("cidr")
def _is_cidr(value: object) -> bool:
    # Like Go's net.ParseCIDR, which the API server uses: host bits may be set, "/n" is required.
    if isinstance(value, str):
        if "/" not in value:
            raise ValueError(f"{value!r} has no prefix length")
        ipaddress.ip_interface(value)
    return True


@_checks("date-time")
def _is_date_time(value: object) -> bool:
    return not isinstance(value, str) or bool(datetime.fromisoformat(value.replace("Z", "+00:00")))


@_checks("int32")
def _is_int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@_checks("int64")
def _is_int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


def to_json_schema(node: Schema) -> Schema:
    """Convert a structural OpenAPI v3 schema node into JSON Schema (draft 7).

    Objects with ``properties`` reject unknown fields, like kubectl's strict field validation (the
    API server alone would prune them silently).
    """
    out: Schema = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "description"):
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(sub) for sub in value]
        else:
            out[key] = value
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [*out.get("anyOf", []), {"type": "integer"}, {"type": "string"}]
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def apply_defaults(node: Schema, value: Any) -> Any:
    """Return ``value`` with the schema's defaults filled in, as the API server does on decode."""
    if isinstance(value, dict):
        value = dict(value)
        for name, sub in node.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            value = {k: apply_defaults(extra, v) for k, v in value.items()}
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        value = [apply_defaults(node["items"], item) for item in value]
    return value


def _json_path(path: Any) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def is_transition_rule(rule: Obj) -> bool:
    return cel.is_transition_rule(rule)


def cel_errors(schema: Schema, obj: Obj, old: Obj | None = None) -> list[str]:
    """The failed ``x-kubernetes-validations`` rules of ``obj``, ``.<field>: <message>`` each.

    With ``old`` (the stored object) ``obj`` is an update: transition rules run where the old
    object has a value, and failures on unchanged values are ratcheted away.
    """
    errors, _ratcheted = cel.Validator(schema).validate(obj, old)
    return [f"{'.' + e.field if e.field else ''}: {e.detail}" for e in errors]


def validation_errors(schema: Schema, obj: Obj, old: Obj | None = None) -> list[str]:
    """All errors the API server would report for ``obj``: OpenAPI first, then CEL.

    With ``old`` (the stored object, defaulted as the API server reads it) ``obj`` is an
    update and the transition rules are evaluated too.
    """
    defaulted = apply_defaults(schema, obj)
    validator = jsonschema.Draft7Validator(to_json_schema(schema), format_checker=FORMATS)
    errors = [
        f"{_json_path(e.absolute_path)}: {e.message}" for e in validator.iter_errors(defaulted)
    ]
    # The API server skips CEL rules when the object does not even have the right types.
    if not any("is not of type" in e for e in errors):
        stored = None if old is None else apply_defaults(schema, old)
        errors += cel_errors(schema, defaulted, stored)
    return errors


def pool_errors(obj: Obj, old: Obj | None = None) -> list[str]:
    """Errors of creating ``obj``, or of updating ``old`` to ``obj``."""
    return validation_errors(schema_of(load_crd(POOL_FILES[obj["kind"]]), "v1alpha1"), obj, old)


# =========================================================================== tests: every CRD


@pytest.mark.parametrize("path", ALL_CRD_FILES, ids=lambda p: str(p.relative_to(CRD_DIR)))
def test_file_is_a_crd_of_our_group(path: Path) -> None:
    crd = load_crd(path)
    names = crd["spec"]["names"]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["spec"]["group"] == GROUP
    assert crd["metadata"]["name"] == f"{names['plural']}.{GROUP}"
    assert path.name == f"{GROUP}_{names['plural']}.yaml"
    assert names["singular"] == names["kind"].lower()
    assert names["listKind"] == names["kind"] + "List"
    global_kind = names["kind"].startswith("Global") and crd["spec"]["group"] == GROUP
    assert crd["spec"]["scope"] == ("Cluster" if global_kind else "Namespaced")
    assert names["categories"] == ["cluster-api"]
    versions = crd["spec"]["versions"]
    assert [v["name"] for v in versions if v["storage"]] == [v["name"] for v in versions][-1:]
    assert all(v["served"] for v in versions)


@pytest.mark.parametrize(("vid", "crd", "version"), VERSIONS, ids=VERSION_IDS)
def test_schema_is_structural(vid: str, crd: Obj, version: Obj) -> None:
    assert structural_errors(version["schema"]["openAPIV3Schema"]) == []


def test_structural_checker_finds_violations() -> None:
    bad: Schema = {
        "type": "object",
        "properties": {
            "untyped": {"description": "no type"},
            "both": {
                "type": "object",
                "properties": {},
                "additionalProperties": {"type": "string"},
            },
            "list": {"type": "array"},
            "m": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["k"],
                "items": {"type": "object", "properties": {"k": {"type": "string"}}},
            },
            "ip": {"type": "string", "anyOf": [{"type": "string", "format": "ipv4"}]},
            "ref": {"$ref": "#/definitions/x", "type": "object"},
        },
    }
    errors = "\n".join(structural_errors(bad))
    for fragment in (
        ".untyped: no type",
        ".both: properties and additionalProperties",
        ".list: array without items",
        ".m: map key 'k'",
        ".ip: 'type' inside a logical junctor",
        ".ref: '$ref' is not allowed",
    ):
        assert fragment in errors


METADATA_FIELDS = {"name", "namespace", "creationTimestamp", "labels", "annotations", "generation"}


def resolve_json_path(root: Schema, json_path: str) -> Schema | None:
    """The schema node a printer-column JSONPath reads (None when it names no field)."""
    filters = re.findall(r"\[\?\(@\.(\w+)==\"[^\"]*\"\)\]", json_path)
    segments = re.sub(r"\[[^\]]*\]", "", json_path).lstrip(".").split(".")
    if segments[0] == "metadata":
        ok = len(segments) == 2 and segments[1] in METADATA_FIELDS
        return {"type": "string", "format": "date-time"} if ok else None
    node = root
    for segment in segments:
        while node.get("type") == "array":
            for key in filters:
                if key not in node["items"].get("properties", {}):
                    return None
            node = node["items"]
        if segment not in node.get("properties", {}):
            return None
        node = node["properties"][segment]
    return node


@pytest.mark.parametrize(("vid", "crd", "version"), VERSIONS, ids=VERSION_IDS)
def test_printer_columns_read_schema_fields(vid: str, crd: Obj, version: Obj) -> None:
    columns = version.get("additionalPrinterColumns", [])
    assert columns, "every version has printer columns"
    for column in columns:
        node = resolve_json_path(version["schema"]["openAPIV3Schema"], column["jsonPath"])
        assert node is not None, column
        if column["type"] == "date":
            assert node.get("format") == "date-time", column
        else:
            assert node.get("type") == column["type"], column


def test_json_path_resolver_rejects_unknown_fields() -> None:
    schema = schema_of(load_crd(POOL_FILES["PHPIPAMIPPool"]), "v1alpha1")
    assert resolve_json_path(schema, ".status.ipAddresses.total") is not None
    assert resolve_json_path(schema, ".status.ipAddresses.count") is None
    assert resolve_json_path(schema, '.status.conditions[?(@.kind=="Ready")].status') is None
    assert resolve_json_path(schema, ".metadata.uid2") is None


@pytest.mark.parametrize(("vid", "crd", "version"), VERSIONS, ids=VERSION_IDS)
def test_defaults_validate_against_their_schema(vid: str, crd: Obj, version: Obj) -> None:
    for path, node in walk(version["schema"]["openAPIV3Schema"]):
        if "default" in node:
            defaulted = apply_defaults(node, copy.deepcopy(node["default"]))
            validator = jsonschema.Draft7Validator(to_json_schema(node), format_checker=FORMATS)
            assert list(validator.iter_errors(defaulted)) == [], path


# Functions of standard CEL: rules that use only these compile on every Kubernetes version with
# CRD validation rules (1.25+); isURL, ip(), cidr() etc. would need newer API servers.
STANDARD_CEL_FUNCTIONS = {
    "has",
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "type",
}


@pytest.mark.parametrize(("vid", "crd", "version"), VERSIONS, ids=VERSION_IDS)
def test_cel_rules_parse_and_name_schema_fields(vid: str, crd: Obj, version: Obj) -> None:
    for path, node in walk(version["schema"]["openAPIV3Schema"]):
        for rule in node.get("x-kubernetes-validations", []):
            expression = rule["rule"]
            cel.compile_rule(expression)  # raises CELParseError on a syntax error
            assert rule.get("message") and "\n" not in rule["message"], (path, rule)
            if is_transition_rule(rule):
                # The API server has no old value below a list without list-type map/set.
                assert "[]" not in path, (path, "transition rule below a list")
            called = set(re.findall(r"([A-Za-z_]\w*)\s*\(", expression))
            assert called <= STANDARD_CEL_FUNCTIONS, (path, called - STANDARD_CEL_FUNCTIONS)
            for chain in re.findall(r"\b(?:self|oldSelf)((?:\.[A-Za-z_]\w*)+)", expression):
                current = node
                for field in chain.lstrip(".").split("."):
                    if current.get("type") != "object":
                        break  # a method call on a scalar, such as self.subnet.contains
                    assert field in current.get("properties", {}), (path, expression, field)
                    current = current["properties"][field]


# =========================================================================== tests: our pool CRDs

PRINTER_COLUMNS = ["Subnet", "Gateway", "Total", "Used", "Free", "Ready", "Age"]


@pytest.mark.parametrize(
    ("kind", "plural", "short_name"),
    [
        ("PHPIPAMIPPool", "phpipamippools", "phpipampool"),
        ("InfobloxIPPool", "infobloxippools", "ibpool"),
        ("GlobalPHPIPAMIPPool", "globalphpipamippools", "gphpipampool"),
        ("GlobalInfobloxIPPool", "globalinfobloxippools", "gibpool"),
    ],
)
def test_pool_crd_names_labels_and_version(kind: str, plural: str, short_name: str) -> None:
    crd = load_crd(POOL_FILES[kind])
    assert crd["spec"]["names"]["kind"] == kind
    assert crd["spec"]["names"]["plural"] == plural
    assert crd["spec"]["names"]["shortNames"] == [short_name]
    assert crd["metadata"]["labels"] == {
        "clusterctl.cluster.x-k8s.io": "",
        "clusterctl.cluster.x-k8s.io/move-hierarchy": "",
    }
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = version["additionalPrinterColumns"]
    assert [c["name"] for c in columns] == PRINTER_COLUMNS
    ready = next(c for c in columns if c["name"] == "Ready")
    assert ready["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'


SHARED_SPEC = {
    "endpoint",
    "credentialsRef",
    "gateway",
    "prefix",
    "hostnameSuffix",
    "tls",
    "subnets",
    "addressReuseGracePeriodSeconds",
}
SPEC_FIELDS = {
    "PHPIPAMIPPool": SHARED_SPEC | {"appId", "subnetId", "subnet", "sectionId"},
    "InfobloxIPPool": SHARED_SPEC
    | {
        "wapiVersion",
        "networkView",
        "subnet",
        "recordType",
        "dnsView",
        "dnsZone",
        "extensibleAttributes",
        "ownerExtensibleAttribute",
    },
}
SPEC_FIELDS |= {kind: SPEC_FIELDS[twin] for kind, twin in GLOBAL_TWINS.items()}


@pytest.mark.parametrize("kind", sorted(POOL_FILES))
def test_pool_fields_are_the_designed_ones(kind: str) -> None:
    schema = schema_of(load_crd(POOL_FILES[kind]), "v1alpha1")
    spec = schema["properties"]["spec"]
    status = schema["properties"]["status"]
    assert set(spec["properties"]) == SPEC_FIELDS[kind]
    assert set(spec["properties"]["credentialsRef"]["properties"]) == {"name", "namespace"}
    assert set(status["properties"]) == {
        "conditions",
        "subnets",
        "subnet",
        "prefix",
        "gateway",
        "ipAddresses",
        "observedGeneration",
    }
    counts = status["properties"]["ipAddresses"]["properties"]
    assert {k: (v["type"], v["format"]) for k, v in counts.items()} == {
        k: ("integer", "int64") for k in ("total", "used", "free")
    }
    condition = status["properties"]["conditions"]["items"]
    assert set(condition["properties"]) == {
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
        "observedGeneration",
    }


@pytest.mark.parametrize("kind", sorted(POOL_FILES))
def test_pool_schema_is_documented_and_bounded(kind: str) -> None:
    """Descriptions are the user docs; bounds keep the API server's CEL cost estimate small."""
    schema = schema_of(load_crd(POOL_FILES[kind]), "v1alpha1")
    for path, node in walk(schema):
        if path in ("", ".apiVersion", ".kind", ".metadata"):
            continue
        if not path.endswith(".*") and not path.endswith("[]"):
            assert node.get("description"), f"{path} has no description"
        if node.get("type") == "string":
            assert "maxLength" in node or "enum" in node or node.get("format") == "date-time", path
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if isinstance(node.get("additionalProperties"), dict):
            assert "maxProperties" in node, path


def test_kustomization_lists_exactly_the_pool_crds() -> None:
    kustomization = yaml.safe_load((CRD_DIR / "kustomization.yaml").read_text())
    resources = kustomization["resources"]
    assert sorted(resources) == sorted(p.name for p in POOL_FILES.values())
    assert sorted(resources) == sorted(
        p.name for p in CRD_DIR.glob("*.yaml") if p.name != "kustomization.yaml"
    )


# ---------------------------------------------------------------- examples in tests/data


@pytest.mark.parametrize(
    ("path", "kind", "secret_keys"),
    [
        ("phpipam-pool.yaml", "PHPIPAMIPPool", {"username", "password"}),
        ("infoblox-pool.yaml", "InfobloxIPPool", {"username", "password"}),
    ],
)
def test_examples_are_valid_and_consistent(path: str, kind: str, secret_keys: set[str]) -> None:
    docs = load_docs(DATA_DIR / path)
    assert [d["kind"] for d in docs] == ["Secret", kind]
    secret, pool = docs
    assert pool["apiVersion"] == f"{GROUP}/v1alpha1"
    assert pool_errors(pool) == []
    assert pool["spec"]["credentialsRef"]["name"] == secret["metadata"]["name"]
    assert set(secret["stringData"]) == secret_keys
    assert "namespace" not in pool["metadata"], "examples apply to the namespace given with -n"


def test_defaults_are_applied() -> None:
    schema = schema_of(load_crd(POOL_FILES["InfobloxIPPool"]), "v1alpha1")
    minimal = {
        "endpoint": "https://gm.example.com",
        "credentialsRef": {"name": "ib"},
        "subnet": "10.0.0.0/24",
    }
    spec = apply_defaults(schema, {"spec": minimal})["spec"]
    assert spec == {
        **minimal,
        "wapiVersion": "2.12",
        "networkView": "default",
        "recordType": "host",
        "tls": {"insecureSkipVerify": False},
        "addressReuseGracePeriodSeconds": 0,
    }
    with_ca = apply_defaults(schema, {"spec": {**minimal, "tls": {"caSecretRef": {"name": "ca"}}}})
    assert with_ca["spec"]["tls"] == {
        "insecureSkipVerify": False,
        "caSecretRef": {"name": "ca", "key": "ca.crt"},
    }


DELETE = object()


def changed(kind: str, **spec_changes: Any) -> Obj:
    """The example pool of ``kind`` with spec fields replaced (DELETE removes one)."""
    pool = example(kind)
    for key, value in spec_changes.items():
        if value is DELETE:
            pool["spec"].pop(key, None)
        else:
            pool["spec"][key] = value
    return pool


PHP = "PHPIPAMIPPool"
IB = "InfobloxIPPool"

VALID = {
    "phpipam-subnet-id-and-token": changed(PHP, subnet=DELETE, sectionId=DELETE, subnetId=7),
    "phpipam-ipv6": changed(PHP, subnet="2001:db8:20::/64", gateway="2001:db8:20::1", prefix=64),
    "phpipam-http-port-trailing-slash": changed(PHP, endpoint="http://127.0.0.1:8080/api/"),
    "phpipam-prefix-0": changed(PHP, prefix=0),
    "phpipam-insecure": changed(PHP, tls={"insecureSkipVerify": True}),
    "phpipam-ca": changed(PHP, tls={"caSecretRef": {"name": "phpipam-ca", "key": "bundle.pem"}}),
    "infoblox-minimal": changed(
        IB,
        wapiVersion=DELETE,
        networkView=DELETE,
        recordType=DELETE,
        dnsView=DELETE,
        dnsZone=DELETE,
        gateway=DELETE,
        extensibleAttributes=DELETE,
    ),
    "infoblox-fixedaddress": changed(IB, recordType="fixedaddress", dnsView=DELETE, dnsZone=DELETE),
    "infoblox-wapi-3-part": changed(IB, wapiVersion="2.12.3"),
    "infoblox-owner-ea": changed(IB, ownerExtensibleAttribute="CAPI-Owner"),
    "infoblox-ipv6-prefix-128": changed(
        IB, subnet="2001:db8::/64", gateway="2001:db8::1", prefix=128
    ),
}


@pytest.mark.parametrize("pool", VALID.values(), ids=VALID.keys())
def test_valid_variations_are_accepted(pool: Obj) -> None:
    assert pool_errors(pool) == []


# Changes that break a field both pools share: (spec changes, field reported, message fragment).
SHARED_INVALID: dict[str, tuple[dict[str, Any], str, str]] = {
    "endpoint-ftp": (
        {"endpoint": "ftp://ipam.example.com/api"},
        ".spec.endpoint",
        "http:// or https://",
    ),
    "endpoint-no-scheme": (
        {"endpoint": "ipam.example.com/api"},
        ".spec.endpoint",
        "http:// or https://",
    ),
    "endpoint-no-host": ({"endpoint": "https:///api"}, ".spec.endpoint", "with a host"),
    "endpoint-user-info": (
        {"endpoint": "https://admin:secret@ipam.example.com"},
        ".spec.endpoint",
        "user info",
    ),
    "endpoint-query": ({"endpoint": "https://ipam.example.com/api?x=1"}, ".spec.endpoint", "query"),
    "endpoint-fragment": (
        {"endpoint": "https://ipam.example.com/api#x"},
        ".spec.endpoint",
        "fragment",
    ),
    "endpoint-space": ({"endpoint": "https://ipam.example.com/my api"}, ".spec.endpoint", "http"),
    "missing-endpoint": ({"endpoint": DELETE}, ".spec", "'endpoint' is a required property"),
    "gateway-not-ip": ({"gateway": "10.20.0.256"}, ".spec.gateway", "not valid under any"),
    "gateway-hostname": ({"gateway": "gw.example.com"}, ".spec.gateway", "not valid under any"),
    "gateway-other-family": ({"gateway": "2001:db8::1"}, ".spec", "same address family"),
    "prefix-33-ipv4": ({"prefix": 33}, ".spec", "at most 32 for an IPv4 subnet"),
    "prefix-129-ipv6": (
        {"subnet": "2001:db8::/64", "gateway": DELETE, "prefix": 129},
        ".spec.prefix",
        "maximum",
    ),
    "prefix-negative": ({"prefix": -1}, ".spec.prefix", "minimum"),
    "subnet-not-cidr": ({"subnet": "10.20.0.0"}, ".spec.subnet", "cidr"),
    "subnet-bad-address": ({"subnet": "10.20.0.300/24"}, ".spec.subnet", "cidr"),
    "credentials-namespace": (
        {"credentialsRef": {"name": "creds", "namespace": "other"}},
        ".spec.credentialsRef",
        "namespace",
    ),
    "credentials-without-name": (
        {"credentialsRef": {}},
        ".spec.credentialsRef",
        "'name' is a required",
    ),
    "credentials-missing": ({"credentialsRef": DELETE}, ".spec", "'credentialsRef' is a required"),
    "hostname-suffix-leading-dot": (
        {"hostnameSuffix": ".example.com"},
        ".spec.hostnameSuffix",
        "match",
    ),
    "hostname-suffix-upper-case": (
        {"hostnameSuffix": "Example.com"},
        ".spec.hostnameSuffix",
        "match",
    ),
    "insecure-with-ca": (
        {"tls": {"insecureSkipVerify": True, "caSecretRef": {"name": "ca"}}},
        ".spec.tls",
        "no effect",
    ),
    "insecure-not-bool": (
        {"tls": {"insecureSkipVerify": "yes"}},
        ".spec.tls.insecureSkipVerify",
        "type",
    ),
    "ca-key-with-slash": (
        {"tls": {"caSecretRef": {"name": "ca", "key": "a/b"}}},
        ".spec.tls.caSecretRef.key",
        "match",
    ),
    "unknown-field": ({"subnetName": "nodes"}, ".spec", "subnetName"),
}

# (pool, the field the error is reported on, a fragment of the message)
INVALID: dict[str, tuple[Obj, str, str]] = {
    f"{kind}-{name}": (changed(kind, **changes), field, fragment)
    for kind in (PHP, IB)
    for name, (changes, field, fragment) in SHARED_INVALID.items()
}
INVALID |= {
    "both-subnet-and-subnet-id": (
        changed(PHP, subnetId=7),
        ".spec",
        "exactly one of subnetId, subnet and subnets",
    ),
    "neither-subnet-nor-id": (
        changed(PHP, subnet=DELETE, sectionId=DELETE),
        ".spec",
        "exactly one of subnetId, subnet and subnets",
    ),
    "section-id-with-subnet-id": (
        changed(PHP, subnet=DELETE, subnetId=7),
        ".spec",
        "sectionId narrows",
    ),
    "subnet-id-zero": (
        changed(PHP, subnet=DELETE, sectionId=DELETE, subnetId=0),
        ".spec.subnetId",
        "minimum",
    ),
    "subnet-id-string": (
        changed(PHP, subnet=DELETE, sectionId=DELETE, subnetId="7"),
        ".spec.subnetId",
        "type",
    ),
    "prefix-33-ipv4-gateway": (
        changed(PHP, subnet=DELETE, sectionId=DELETE, subnetId=7, prefix=33),
        ".spec",
        "IPv4 gateway",
    ),
    "app-id-too-short": (changed(PHP, appId="ab"), ".spec.appId", "short"),
    "app-id-too-long": (changed(PHP, appId="a" * 13), ".spec.appId", "long"),
    "app-id-not-alnum": (changed(PHP, appId="capi/x"), ".spec.appId", "does not match"),
    "missing-app-id": (changed(PHP, appId=DELETE), ".spec", "'appId' is a required property"),
    "phpipam-record-type": (changed(PHP, recordType="host"), ".spec", "recordType"),
    "record-type-a": (changed(IB, recordType="a"), ".spec.recordType", "is not one of"),
    "dns-zone-with-fixedaddress": (
        changed(IB, recordType="fixedaddress", dnsView=DELETE),
        ".spec",
        "recordType host",
    ),
    "dns-view-with-fixedaddress": (
        changed(IB, recordType="fixedaddress", dnsZone=DELETE),
        ".spec",
        "recordType host",
    ),
    "dns-zone-with-space": (changed(IB, dnsZone="nodes example.com"), ".spec.dnsZone", "match"),
    "wapi-version-with-v": (
        changed(IB, wapiVersion="v2.12"),
        ".spec.wapiVersion",
        "does not match",
    ),
    "wapi-version-number": (changed(IB, wapiVersion=2.12), ".spec.wapiVersion", "type"),
    "infoblox-subnet-missing": (
        changed(IB, subnet=DELETE, gateway=DELETE),
        ".spec",
        "exactly one of subnet and subnets",
    ),
    "infoblox-subnet-id": (changed(IB, subnetId=7), ".spec", "subnetId"),
    "ea-value-not-string": (
        changed(IB, extensibleAttributes={"Rack": 12}),
        ".spec.extensibleAttributes.Rack",
        "type",
    ),
    "ea-value-empty": (
        changed(IB, extensibleAttributes={"Rack": ""}),
        ".spec.extensibleAttributes.Rack",
        "non-empty",
    ),
    "owner-ea-empty": (
        changed(IB, ownerExtensibleAttribute=""),
        ".spec.ownerExtensibleAttribute",
        "non-empty",
    ),
    "owner-ea-not-string": (
        changed(IB, ownerExtensibleAttribute=7),
        ".spec.ownerExtensibleAttribute",
        "type",
    ),
    "ea-too-many": (
        changed(IB, extensibleAttributes={f"EA{i}": "x" for i in range(33)}),
        ".spec.extensibleAttributes",
        "too many",
    ),
    "infoblox-app-id": (changed(IB, appId="capi"), ".spec", "appId"),
}


@pytest.mark.parametrize(("pool", "field", "fragment"), INVALID.values(), ids=INVALID.keys())
def test_invalid_variations_are_rejected(pool: Obj, field: str, fragment: str) -> None:
    errors = pool_errors(pool)
    assert errors, "expected the object to be rejected"
    # Every error is about the field changed (nothing else in the example broke) ...
    assert all(e.split(": ", 1)[0] == field for e in errors), errors
    # ... and says what is wrong.
    assert any(fragment in e for e in errors), errors


VALID_STATUS: Obj = {
    "observedGeneration": 3,
    "subnet": "10.20.0.0/24",
    "prefix": 24,
    "gateway": "10.20.0.1",
    "ipAddresses": {"total": 254, "used": 12, "free": 242},
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "PoolReady",
            "message": "",
            "lastTransitionTime": "2026-01-02T03:04:05Z",
            "observedGeneration": 3,
        }
    ],
}


def with_status(kind: str, status: Obj) -> Obj:
    pool = example(kind)
    pool["status"] = status
    return pool


@pytest.mark.parametrize("kind", sorted(POOL_FILES))
def test_status_as_the_operator_writes_it_is_valid(kind: str) -> None:
    assert pool_errors(with_status(kind, copy.deepcopy(VALID_STATUS))) == []
    big = copy.deepcopy(VALID_STATUS)
    big["ipAddresses"] = {"total": 2**63 - 1, "used": 1, "free": 2**63 - 2}
    assert pool_errors(with_status(kind, big)) == []


def _condition(**changes: Any) -> Obj:
    status = copy.deepcopy(VALID_STATUS)
    condition = status["conditions"][0]
    for key, value in changes.items():
        if value is DELETE:
            del condition[key]
        else:
            condition[key] = value
    return status


INVALID_STATUS: dict[str, tuple[Obj, str]] = {
    "condition-without-message": (_condition(message=DELETE), ".status.conditions[0]"),
    "condition-without-reason": (_condition(reason=DELETE), ".status.conditions[0]"),
    "reason-with-space": (_condition(reason="Pool Ready"), ".status.conditions[0].reason"),
    "status-yes": (_condition(status="Yes"), ".status.conditions[0].status"),
    "bad-timestamp": (
        _condition(lastTransitionTime="yesterday"),
        ".status.conditions[0].lastTransitionTime",
    ),
    "negative-free": (
        {**VALID_STATUS, "ipAddresses": {"total": 1, "used": 2, "free": -1}},
        ".status.ipAddresses.free",
    ),
    "count-beyond-int64": (
        {**VALID_STATUS, "ipAddresses": {"total": 2**64}},
        ".status.ipAddresses.total",
    ),
}


@pytest.mark.parametrize(("status", "field"), INVALID_STATUS.values(), ids=INVALID_STATUS.keys())
def test_invalid_status_is_rejected(status: Obj, field: str) -> None:
    for kind in POOL_FILES:
        errors = pool_errors(with_status(kind, status))
        assert errors and all(e.split(": ", 1)[0] == field for e in errors), errors


def test_cel_rules_are_evaluated_not_just_parsed() -> None:
    """A rule that cannot hold must fail in this harness (guards against a silent evaluator)."""
    schema: Schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 5}},
        "x-kubernetes-validations": [
            {"rule": "self.a.startsWith('x')", "message": "a starts with x"}
        ],
    }
    assert validation_errors(schema, {"a": "xy"}) == []
    assert validation_errors(schema, {"a": "yx"}) == [": a starts with x"]


# --------------------------------------------------------------------------- updates

IMMUTABLE = (
    "is immutable: the addresses already registered stay where they are; create a new pool to "
    "use another location"
)
PHP_BY_ID = changed(PHP, subnet=DELETE, sectionId=DELETE, subnetId=7)
IB_NO_DNS = changed(IB, dnsView=DELETE, dnsZone=DELETE)

# (old pool, new pool, the fields whose change is refused)
LOCATION_CHANGES: dict[str, tuple[Obj, Obj, set[str]]] = {
    "phpipam-endpoint": (
        example(PHP),
        changed(PHP, endpoint="https://phpipam2.example.com/api"),
        {"endpoint"},
    ),
    "phpipam-endpoint-path": (
        example(PHP),
        changed(PHP, endpoint="https://phpipam.example.com/api/"),
        {"endpoint"},
    ),
    "phpipam-app-id": (example(PHP), changed(PHP, appId="capi2"), {"appId"}),
    "phpipam-subnet": (example(PHP), changed(PHP, subnet="10.20.1.0/24"), {"subnet"}),
    "phpipam-section-id": (example(PHP), changed(PHP, sectionId=4), {"sectionId"}),
    "phpipam-section-id-removed": (example(PHP), changed(PHP, sectionId=DELETE), {"sectionId"}),
    "phpipam-section-id-added": (changed(PHP, sectionId=DELETE), example(PHP), {"sectionId"}),
    "phpipam-subnet-id": (
        PHP_BY_ID,
        changed(PHP, subnet=DELETE, sectionId=DELETE, subnetId=8),
        {"subnetId"},
    ),
    "phpipam-cidr-to-id": (example(PHP), PHP_BY_ID, {"subnet", "subnetId", "sectionId"}),
    "phpipam-id-to-cidr": (PHP_BY_ID, changed(PHP, sectionId=DELETE), {"subnet", "subnetId"}),
    "infoblox-endpoint": (
        example(IB),
        changed(IB, endpoint="https://gm2.example.com"),
        {"endpoint"},
    ),
    "infoblox-subnet": (example(IB), changed(IB, subnet="10.30.1.0/24"), {"subnet"}),
    "infoblox-network-view": (example(IB), changed(IB, networkView="lab"), {"networkView"}),
    "infoblox-network-view-back-to-default": (
        changed(IB, networkView="lab"),
        changed(IB, networkView=DELETE),
        {"networkView"},
    ),
    "infoblox-record-type": (
        IB_NO_DNS,
        changed(IB, dnsView=DELETE, dnsZone=DELETE, recordType="fixedaddress"),
        {"recordType"},
    ),
    "infoblox-dns-view": (example(IB), changed(IB, dnsView="internal"), {"dnsView"}),
    "infoblox-dns-zone": (example(IB), changed(IB, dnsZone="k8s.example.com"), {"dnsZone"}),
    "infoblox-dns-zone-removed": (example(IB), changed(IB, dnsZone=DELETE), {"dnsZone"}),
    "infoblox-dns-zone-added": (changed(IB, dnsZone=DELETE), example(IB), {"dnsZone"}),
}


def refused_fields(errors: list[str]) -> set[str]:
    """The fields named by "<field> is immutable: ..." errors (every error must be one)."""
    fields = set()
    for error in errors:
        where, _, message = error.partition(": ")
        field, _, rest = message.partition(" ")
        assert rest == IMMUTABLE, error
        assert where in (".spec", f".spec.{field}"), error
        fields.add(field)
    return fields


@pytest.mark.parametrize(("old", "new", "fields"), LOCATION_CHANGES.values(), ids=LOCATION_CHANGES)
def test_ipam_location_cannot_change(old: Obj, new: Obj, fields: set[str]) -> None:
    assert pool_errors(old) == []
    assert pool_errors(new) == []  # valid as a new pool: only the change is refused
    assert refused_fields(pool_errors(new, old)) == fields
    assert pool_errors(old, old) == []


def test_every_location_field_is_immutable() -> None:
    """The rules cover exactly the IPAM location of each kind, no more."""
    location = {
        PHP: {"endpoint", "appId", "subnetId", "subnet", "sectionId"},
        IB: {"endpoint", "subnet", "networkView", "recordType", "dnsView", "dnsZone"},
    }
    for kind, fields in location.items():
        spec = schema_of(load_crd(POOL_FILES[kind]), "v1alpha1")["properties"]["spec"]
        messages = [
            r["message"] for _, node in walk(spec) for r in node.get("x-kubernetes-validations", [])
        ]
        named = {m.split(" ", 1)[0] for m in messages if m.endswith(IMMUTABLE)}
        assert named == fields, kind
        for field in fields:
            assert "Immutable" in spec["properties"][field]["description"], (kind, field)


# (old pool, new pool): updates of everything but the location, all accepted
MUTABLE_CHANGES: dict[str, tuple[Obj, Obj]] = {
    "phpipam-no-op": (example(PHP), example(PHP)),
    "phpipam-gateway-prefix-suffix": (
        example(PHP),
        changed(PHP, gateway="10.20.0.254", prefix=23, hostnameSuffix="other.example.com"),
    ),
    "phpipam-gateway-removed": (example(PHP), changed(PHP, gateway=DELETE, hostnameSuffix=DELETE)),
    "phpipam-credentials-and-tls": (
        example(PHP),
        changed(PHP, credentialsRef={"name": "rotated"}, tls={"insecureSkipVerify": True}),
    ),
    "phpipam-by-id-gateway": (
        PHP_BY_ID,
        changed(PHP, subnet=DELETE, sectionId=DELETE, subnetId=7, gateway="10.20.0.2"),
    ),
    "infoblox-no-op": (example(IB), example(IB)),
    "infoblox-wapi-version-and-eas": (
        example(IB),
        changed(IB, wapiVersion="2.13.6", extensibleAttributes={"Owner": "someone-else"}),
    ),
    "infoblox-gateway-prefix-credentials": (
        example(IB),
        changed(IB, gateway=DELETE, prefix=25, credentialsRef={"name": "rotated"}),
    ),
    "infoblox-network-view-default-spelled-out": (
        changed(IB, networkView=DELETE, recordType=DELETE),
        changed(IB, networkView="default", recordType="host"),
    ),
}


@pytest.mark.parametrize(("old", "new"), MUTABLE_CHANGES.values(), ids=MUTABLE_CHANGES)
def test_everything_but_the_location_can_change(old: Obj, new: Obj) -> None:
    assert pool_errors(new, old) == []


def test_status_and_metadata_updates_are_accepted() -> None:
    for kind in POOL_FILES:
        old = example(kind)
        new = with_status(kind, VALID_STATUS)
        new["metadata"]["labels"] = {"cluster.x-k8s.io/cluster-name": "moved"}
        assert pool_errors(new, old) == []


def test_transition_rules_need_an_old_object() -> None:
    """On create (no old object) and where the old object has no value, they do not run."""
    schema: Schema = {
        "type": "object",
        "properties": {
            "a": {
                "type": "string",
                "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "a fixed"}],
            }
        },
    }
    assert validation_errors(schema, {"a": "x"}) == []
    assert validation_errors(schema, {"a": "x"}, old={}) == []
    assert validation_errors(schema, {"a": "y"}, old={"a": "x"}) == [".a: a fixed"]


# =========================================================================== tests: CAPI copies


@pytest.mark.parametrize("kind", sorted(CAPI_FILES))
def test_capi_versions(kind: str) -> None:
    crd = load_crd(CAPI_FILES[kind])
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert list(versions) == ["v1alpha1", "v1beta1", "v1beta2"]
    assert all(v["served"] for v in versions.values())
    assert [n for n, v in versions.items() if v["storage"]] == ["v1beta2"]
    assert versions["v1beta1"].get("deprecated") is True
    assert "deprecated" not in versions["v1beta2"]
    assert crd["spec"]["conversion"] == {"strategy": "None"}
    expected_columns = ["Pool Name", "Pool Kind", "Age"]
    if kind == "IPAddress":
        expected_columns.insert(0, "Address")
    for version in versions.values():
        assert [c["name"] for c in version["additionalPrinterColumns"]] == expected_columns
        assert ("subresources" in version) == (kind == "IPAddressClaim")


def test_capi_v1beta2_claim_conditions_follow_the_contract() -> None:
    status = schema_of(load_crd(CAPI_FILES["IPAddressClaim"]), "v1beta2")["properties"]["status"]
    condition = status["properties"]["conditions"]["items"]
    assert set(condition["required"]) == {
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
    }
    assert (
        condition["properties"]["reason"]["pattern"] == r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    )
    assert status["minProperties"] == 1


POOL_REF = {"apiGroup": GROUP, "kind": "PHPIPAMIPPool", "name": "nodes-v4"}
NOW = "2026-01-02T03:04:05Z"


def capi_errors(kind: str, version: str, obj: Obj) -> list[str]:
    return validation_errors(schema_of(load_crd(CAPI_FILES[kind]), version), obj)


def ip_address(version: str, **spec: Any) -> Obj:
    body = {
        "address": "10.20.0.2",
        "prefix": 24,
        "gateway": "10.20.0.1",
        "claimRef": {"name": "m1-eth0"},
        "poolRef": dict(POOL_REF),
    }
    body.update(spec)
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "IPAddress",
        "metadata": {"name": "m1-eth0", "namespace": "default"},
        "spec": {k: v for k, v in body.items() if v is not DELETE},
    }


def claim(version: str, status: Obj) -> Obj:
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "IPAddressClaim",
        "metadata": {"name": "m1-eth0", "namespace": "default"},
        "spec": {"clusterName": "workload-1", "poolRef": dict(POOL_REF)},
        "status": status,
    }


READY = {
    "type": "Ready",
    "status": "True",
    "reason": "AddressAllocated",
    "message": "",
    "lastTransitionTime": NOW,
}
CAPI_READY = {"type": "Ready", "status": "True", "lastTransitionTime": NOW}


@pytest.mark.parametrize("version", ["v1alpha1", "v1beta1", "v1beta2"])
def test_capi_objects_the_operator_writes_are_valid(version: str) -> None:
    assert capi_errors("IPAddress", version, ip_address(version)) == []
    assert capi_errors("IPAddress", version, ip_address(version, gateway=DELETE)) == []
    assert (
        capi_errors("IPAddress", version, ip_address(version, address="2001:db8::5", prefix=64))
        == []
    )
    if version == "v1beta2":
        status: Obj = {"addressRef": {"name": "m1-eth0"}, "conditions": [READY]}
    else:
        status = {"addressRef": {"name": "m1-eth0"}, "conditions": [CAPI_READY]}
        if version == "v1beta1":
            status["v1beta2"] = {"conditions": [READY]}
    body = claim(version, status)
    if version == "v1alpha1":
        del body["spec"]["clusterName"]
    assert capi_errors("IPAddressClaim", version, body) == []


CAPI_INVALID: dict[str, tuple[str, str, Obj, str]] = {
    "v1beta2-prefix-129": (
        "IPAddress",
        "v1beta2",
        ip_address("v1beta2", prefix=129),
        ".spec.prefix",
    ),
    "v1beta2-no-api-group": (
        "IPAddress",
        "v1beta2",
        ip_address("v1beta2", poolRef={"kind": "PHPIPAMIPPool", "name": "p"}),
        ".spec.poolRef",
    ),
    "v1beta2-empty-address": (
        "IPAddress",
        "v1beta2",
        ip_address("v1beta2", address=""),
        ".spec.address",
    ),
    "v1beta2-no-prefix": ("IPAddress", "v1beta2", ip_address("v1beta2", prefix=DELETE), ".spec"),
    "v1beta1-no-claim-ref": (
        "IPAddress",
        "v1beta1",
        ip_address("v1beta1", claimRef=DELETE),
        ".spec",
    ),
    "v1beta2-ready-without-message": (
        "IPAddressClaim",
        "v1beta2",
        claim("v1beta2", {"conditions": [{k: v for k, v in READY.items() if k != "message"}]}),
        ".status.conditions[0]",
    ),
    "v1beta2-empty-status": ("IPAddressClaim", "v1beta2", claim("v1beta2", {}), ".status"),
    "v1beta2-bad-address-ref": (
        "IPAddressClaim",
        "v1beta2",
        claim("v1beta2", {"addressRef": {"name": "M1"}}),
        ".status.addressRef.name",
    ),
    "v1beta1-severity-too-long": (
        "IPAddressClaim",
        "v1beta1",
        claim("v1beta1", {"conditions": [{**CAPI_READY, "status": "False", "severity": "x" * 33}]}),
        ".status.conditions[0].severity",
    ),
}


@pytest.mark.parametrize(
    ("kind", "version", "obj", "field"), CAPI_INVALID.values(), ids=CAPI_INVALID.keys()
)
def test_capi_invalid_objects_are_rejected(kind: str, version: str, obj: Obj, field: str) -> None:
    errors = capi_errors(kind, version, obj)
    assert errors and all(e.split(": ", 1)[0] == field for e in errors), errors


def test_capi_v1beta1_accepts_what_v1beta2_rejects() -> None:
    """v1beta1 poolRef is a TypedLocalObjectReference: apiGroup is optional there."""
    ref = {"kind": "PHPIPAMIPPool", "name": "nodes-v4"}
    assert capi_errors("IPAddress", "v1beta1", ip_address("v1beta1", poolRef=ref)) == []
    assert capi_errors("IPAddress", "v1beta2", ip_address("v1beta2", poolRef=ref)) != []


# =========================================================================== tests: issue 12
# Several subnets per pool, Global pools, the reuse grace period (DESIGN.md sections 3 and 6).

PHP_SUBNETS = changed(
    PHP,
    subnet=DELETE,
    sectionId=DELETE,
    gateway=DELETE,
    subnets=[
        {"subnetId": 7},
        {"subnet": "10.20.1.0/29", "gateway": "10.20.1.6", "prefix": 29},
        {"subnet": "2001:db8:20::/64", "prefix": 64},
    ],
)
IB_SUBNETS = changed(
    IB,
    subnet=DELETE,
    gateway=DELETE,
    subnets=[{"subnet": "10.30.0.0/24"}, {"subnet": "10.30.1.0/24", "gateway": "10.30.1.1"}],
)


def with_subnets(pool: Obj, subnets: list[Obj]) -> Obj:
    pool = copy.deepcopy(pool)
    pool["spec"]["subnets"] = subnets
    return pool


@pytest.mark.parametrize("pool", [PHP_SUBNETS, IB_SUBNETS], ids=["phpipam", "infoblox"])
def test_subnets_form_is_accepted(pool: Obj) -> None:
    assert pool_errors(pool) == []
    assert pool_errors(with_subnets(pool, pool["spec"]["subnets"][:1])) == []
    php = changed(PHP, subnet=DELETE, gateway=DELETE, subnets=[{"subnet": "10.20.0.0/24"}])
    assert pool_errors(php) == []  # sectionId narrows entries named by CIDR


SUBNETS_INVALID: dict[str, tuple[Obj, str, str]] = {
    "phpipam-both-forms": (
        changed(PHP, subnets=[{"subnetId": 7}]),
        ".spec",
        "exactly one of subnetId, subnet and subnets",
    ),
    "infoblox-both-forms": (
        changed(IB, subnets=[{"subnet": "10.30.0.0/24"}]),
        ".spec",
        "exactly one of subnet and subnets",
    ),
    "empty-list": (with_subnets(IB_SUBNETS, []), ".spec.subnets", "non-empty"),
    "too-many": (
        with_subnets(IB_SUBNETS, [{"subnet": f"10.31.{i}.0/24"} for i in range(33)]),
        ".spec.subnets",
        "too long",
    ),
    "entry-with-id-and-cidr": (
        with_subnets(PHP_SUBNETS, [{"subnetId": 7, "subnet": "10.20.0.0/24"}]),
        ".spec.subnets[0]",
        "exactly one of subnetId and subnet",
    ),
    "entry-with-neither": (
        with_subnets(PHP_SUBNETS, [{"gateway": "10.20.0.1"}]),
        ".spec.subnets[0]",
        "exactly one of subnetId and subnet",
    ),
    "entry-prefix-33": (
        with_subnets(IB_SUBNETS, [{"subnet": "10.30.0.0/24", "prefix": 33}]),
        ".spec.subnets[0]",
        "at most 32",
    ),
    "entry-gateway-family": (
        with_subnets(IB_SUBNETS, [{"subnet": "10.30.0.0/24", "gateway": "2001:db8::1"}]),
        ".spec.subnets[0]",
        "same address family",
    ),
    "entry-not-cidr": (
        with_subnets(IB_SUBNETS, [{"subnet": "10.30.0.1"}]),
        ".spec.subnets[0].subnet",
        "cidr",
    ),
    "infoblox-entry-subnet-id": (
        with_subnets(IB_SUBNETS, [{"subnet": "10.30.0.0/24", "subnetId": 7}]),
        ".spec.subnets[0]",
        "subnetId",
    ),
    "duplicate-cidr": (
        with_subnets(IB_SUBNETS, [{"subnet": "10.30.0.0/24"}, {"subnet": "10.30.0.0/24"}]),
        ".spec.subnets",
        "twice",
    ),
    "duplicate-id": (
        with_subnets(PHP_SUBNETS, [{"subnetId": 7}, {"subnetId": 7, "gateway": "10.20.0.9"}]),
        ".spec.subnets",
        "twice",
    ),
    "grace-negative": (
        changed(PHP, addressReuseGracePeriodSeconds=-1),
        ".spec.addressReuseGracePeriodSeconds",
        "minimum",
    ),
    "grace-not-integer": (
        changed(IB, addressReuseGracePeriodSeconds="60"),
        ".spec.addressReuseGracePeriodSeconds",
        "type",
    ),
}


@pytest.mark.parametrize(
    ("pool", "field", "fragment"), SUBNETS_INVALID.values(), ids=SUBNETS_INVALID.keys()
)
def test_invalid_subnets_and_grace_are_rejected(pool: Obj, field: str, fragment: str) -> None:
    errors = pool_errors(pool)
    assert errors, "expected the object to be rejected"
    assert all(e.split(": ", 1)[0] == field for e in errors), errors
    assert any(fragment in e for e in errors), errors


GROW_ONLY = "subnets can only grow at the end"


def test_subnets_may_only_be_appended() -> None:
    for pool in (PHP_SUBNETS, IB_SUBNETS):
        entries = pool["spec"]["subnets"]
        appended = with_subnets(pool, [*entries, {"subnet": "10.40.0.0/24"}])
        assert pool_errors(appended, pool) == []
        for name, changed_entries in {
            "removed-last": entries[:-1],
            "removed-first": entries[1:],
            "reordered": [entries[1], entries[0], *entries[2:]],
            "changed": [{**entries[0], "gateway": "10.99.0.1"}, *entries[1:]],
            "inserted-first": [{"subnet": "10.40.0.0/24"}, *entries],
        }.items():
            errors = pool_errors(with_subnets(pool, changed_entries), pool)
            assert errors and all(GROW_ONLY in e for e in errors), (name, errors)


def test_switching_between_the_subnet_forms_is_refused() -> None:
    one = changed(IB, subnet=DELETE, gateway=DELETE, subnets=[{"subnet": IB_SUBNET}])
    assert any("subnets cannot be added" in e for e in pool_errors(one, example(IB)))
    assert any("subnet is immutable" in e for e in pool_errors(example(IB), one))
    php_one = changed(PHP, subnet=DELETE, subnets=[{"subnet": example(PHP)["spec"]["subnet"]}])
    assert pool_errors(php_one, example(PHP)) != []


IB_SUBNET = example(IB)["spec"]["subnet"]


def test_grace_period_can_change() -> None:
    for kind in (PHP, IB):
        assert pool_errors(changed(kind, addressReuseGracePeriodSeconds=300), example(kind)) == []


# ---------------------------------------------------------------- Global pools


@pytest.mark.parametrize("kind", sorted(GLOBAL_TWINS))
def test_global_pool_names_the_secret_namespace(kind: str) -> None:
    pool = example(kind)
    assert pool_errors(pool) == []
    without = copy.deepcopy(pool)
    del without["spec"]["credentialsRef"]["namespace"]
    errors = pool_errors(without)
    assert errors and all(e.startswith(".spec.credentialsRef: ") for e in errors), errors
    assert "required on a Global pool" in errors[0]
    ca = copy.deepcopy(pool)
    ca["spec"]["tls"] = {"caSecretRef": {"name": "ca"}}
    errors = pool_errors(ca)
    assert errors and all(e.startswith(".spec.tls.caSecretRef: ") for e in errors), errors
    ca["spec"]["tls"]["caSecretRef"]["namespace"] = "capi-credentials"
    assert pool_errors(ca) == []


@pytest.mark.parametrize("kind", sorted(GLOBAL_TWINS.values()))
def test_namespaced_pool_cannot_name_another_namespace(kind: str) -> None:
    pool = changed(kind, credentialsRef={"name": "creds", "namespace": "other"})
    errors = pool_errors(pool)
    assert errors and all(e.startswith(".spec.credentialsRef: ") for e in errors), errors
    assert "only for Global pools" in errors[0]
    ca = changed(kind, tls={"caSecretRef": {"name": "ca", "namespace": "other"}})
    assert any("only for Global pools" in e for e in pool_errors(ca))


def _strip(node: Any) -> Any:
    """A schema without descriptions and without the Secret-namespace rules."""
    if isinstance(node, dict):
        out = {k: _strip(v) for k, v in node.items() if k != "description"}
        rules = [
            r for r in out.get("x-kubernetes-validations", []) if "self.namespace" not in r["rule"]
        ]
        if "x-kubernetes-validations" in out:
            out["x-kubernetes-validations"] = rules
        return out
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


@pytest.mark.parametrize(("kind", "twin"), sorted(GLOBAL_TWINS.items()))
def test_global_kind_has_its_twins_spec_and_status(kind: str, twin: str) -> None:
    crd, twin_crd = load_crd(POOL_FILES[kind]), load_crd(POOL_FILES[twin])
    schema, twin_schema = schema_of(crd, "v1alpha1"), schema_of(twin_crd, "v1alpha1")
    for part in ("spec", "status"):
        assert _strip(schema["properties"][part]) == _strip(twin_schema["properties"][part])
    (version,), (twin_version,) = crd["spec"]["versions"], twin_crd["spec"]["versions"]
    assert version["additionalPrinterColumns"] == twin_version["additionalPrinterColumns"]
    assert crd["metadata"]["labels"] == twin_crd["metadata"]["labels"]


def test_status_per_subnet_is_valid() -> None:
    status = copy.deepcopy(VALID_STATUS)
    status["subnets"] = [
        {
            "cidr": "10.20.0.0/24",
            "prefix": 24,
            "gateway": "10.20.0.1",
            "ipAddresses": {"total": 254, "used": 12, "free": 242},
        },
        {"cidr": "2001:db8::/64", "prefix": 64, "ipAddresses": {"total": 2**63 - 1, "used": 0}},
    ]
    for kind in POOL_FILES:
        assert pool_errors(with_status(kind, status)) == []
    status["subnets"][1]["ipAddresses"]["free"] = -1
    assert pool_errors(with_status(PHP, status)) != []
