"""The WAPI object types the mock serves: their fields, basic fields and searchable fields.

Searchable fields, known fields and body fields come from ``wapi/wapi-2.12.json``, extracted
by ``wapi/generate.py`` from the WAPI 2.12 OpenAPI description Infoblox generated from a
grid (public repository infobloxopen/infoblox-swagger-wapi): a search on a field a grid
does not search, or a field a grid does not know, is refused as a grid refuses it. That
description lists object fields only; WAPI's search-only fields that Infoblox's own clients
send are added from `SEARCH_ONLY`, each with its public source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = ["OBJECT_TYPES", "SEARCH_ONLY", "WAPI_SCHEMA", "ObjectType"]

#: The extracted WAPI 2.12 schema: ``{"objects": {<type>: {"search", "fields", "create",
#: "update", "functions"}}, "version", "source"}`` (lists of field names).
WAPI_SCHEMA: dict[str, Any] = json.loads(
    (Path(__file__).with_name("wapi") / "wapi-2.12.json").read_text()
)


#: WAPI's search-only fields: arguments a grid accepts in a GET to search, which are never
#: returned under that name, so the OpenAPI description in ``wapi/`` (object fields only) omits
#: them. Each is listed with the public source that shows a grid accepting it; ``fixedaddress``
#: keeps refusing ``name`` (not searchable at WAPI 2.12, the schema's search list).
SEARCH_ONLY: dict[str, dict[str, str]] = {
    "record:host": {
        # Infoblox WAPI reference, record:host: "ipv4addr", "ipv6addr" and "mac" are
        # search-only fields (infobloxopen/infoblox-go-client issue #59 quotes
        # wapidoc/objects/record.host.html#ipv4addr: searchable, unlike "ipv4addrs").
        # infobloxopen/infoblox-client 0.6.2: objects.py HostRecordV4 / HostRecordV6 list
        # "ipv4addr" / "ipv6addr" and "mac" in _all_searchable_fields and
        # _search_for_update_fields; object_manager.py get_host_record, find_hostname,
        # delete_host_record and update_host_record_eas search with them
        # (objects.HostRecord.search(ip=...) sends ipv4addr= or ipv6addr= by family).
        # infobloxopen/infoblox-go-client GetHostRecord: record:host?name=&ipv4addr=&ipv6addr=.
        "ipv4addr": "the address of one of the record's ipv4addrs",
        "ipv6addr": "the address of one of the record's ipv6addrs",
        # infoblox-client 0.6.2 object_manager.py find_host_records_by_mac:
        # objects.HostRecord.search_all(mac=...) (changelog 0.4.12 "Add search HostRecords by
        # MAC").
        "mac": "the MAC address of one of the record's ipv4addrs",
    },
    "network": {
        # Infoblox WAPI reference, wapidoc/objects/network.html#contains-address: search-only,
        # the network that holds an address. infobloxopen/infoblox-client issue #372 and pull
        # request #373 (searched on a real grid, WAPI 2.10.3; connector.get_object sends it as
        # is in 0.6.2). IPv6 networks have no such field (same thread), so ipv6network refuses it.
        "contains_address": "an IPv4 address inside the network",
    },
}


@dataclass(frozen=True)
class ObjectType:
    """What WAPI allows for one object type.

    Attributes
    ----------
    name:
        The WAPI object type, e.g. ``"record:host"``.
    basic:
        The "basic object" fields returned when no ``_return_fields`` is given, and the base
        that ``_return_fields+`` extends (WAPI reference, each object's "Fields" table).
    fields:
        Every field the mock can return for the type (a subset of the real object).
    writable:
        Fields a POST or PUT body may carry; any other key is a ``Client.Ibap.Proto`` error.
    searchable:
        Fields that may appear as search arguments (``name=...``, ``name~=...``).
    required:
        Fields a POST body must carry.
    read_only:
        True for computed views (``ipv4address``, ``ipv6address``) that cannot be created.
    """

    name: str
    basic: tuple[str, ...]
    fields: frozenset[str]
    writable: frozenset[str]
    searchable: frozenset[str]
    required: tuple[str, ...] = ()
    read_only: bool = False
    updatable: frozenset[str] | None = None


def _from_schema(otype: ObjectType) -> ObjectType:
    """Return ``otype`` with the searchable, known and body fields of the WAPI 2.12 schema.

    Searchable: the schema's search fields plus the type's `SEARCH_ONLY` fields.

    Types the schema does not describe are returned unchanged.
    """
    data = WAPI_SCHEMA["objects"].get(otype.name)
    if data is None:
        return otype
    return replace(
        otype,
        fields=frozenset(data["fields"]) | frozenset(otype.basic),
        searchable=frozenset(data["search"]) | frozenset(SEARCH_ONLY.get(otype.name, ())),
        writable=frozenset(data["create"]),
        updatable=frozenset(data["update"]),
    )


def _type(
    name: str,
    basic: tuple[str, ...],
    extra: tuple[str, ...],
    writable: tuple[str, ...],
    searchable: tuple[str, ...],
    required: tuple[str, ...] = (),
    read_only: bool = False,
) -> ObjectType:
    return ObjectType(
        name=name,
        basic=basic,
        fields=frozenset(basic + extra),
        writable=frozenset(writable),
        searchable=frozenset(searchable),
        required=required,
        read_only=read_only,
    )


_NETWORK_EXTRA = ("netmask", "options", "extattrs", "utilization", "total_hosts", "disable")
_NETWORK_WRITABLE = ("network", "network_view", "comment", "options", "extattrs", "disable")
_NETWORK_SEARCH = ("network", "network_view", "comment")
_ADDRESS_SEARCH = (
    "ip_address",
    "network",
    "network_view",
    "status",
    "names",
    "types",
    "usage",
)

#: Every object type the mock knows, by WAPI name. Field names follow the WAPI 2.12
#: reference (and the infobloxopen/infoblox-nios-go-client OpenAPI specs of WAPI 2.13.6).
OBJECT_TYPES: dict[str, ObjectType] = {
    t.name: _from_schema(t)
    for t in (
        _type(
            "network",
            ("comment", "network", "network_view"),
            _NETWORK_EXTRA,
            _NETWORK_WRITABLE,
            _NETWORK_SEARCH,
            required=("network",),
        ),
        _type(
            "ipv6network",
            ("comment", "network", "network_view"),
            _NETWORK_EXTRA,
            _NETWORK_WRITABLE,
            _NETWORK_SEARCH,
            required=("network",),
        ),
        _type(
            "record:host",
            ("ipv4addrs", "ipv6addrs", "name", "view"),
            ("comment", "configure_for_dns", "extattrs", "zone", "network_view", "disable"),
            (
                "name",
                "view",
                "ipv4addrs",
                "ipv6addrs",
                "comment",
                "configure_for_dns",
                "extattrs",
                "network_view",
                "disable",
            ),
            (
                "name",
                "view",
                "zone",
                "comment",
                "network_view",
                "ipv4addr",
                "ipv6addr",
                "mac",
                "network",
            ),
            required=("name",),
        ),
        _type(
            "fixedaddress",
            ("ipv4addr", "network_view"),
            ("name", "comment", "mac", "match_client", "extattrs", "network", "disable"),
            (
                "ipv4addr",
                "network_view",
                "name",
                "comment",
                "mac",
                "match_client",
                "extattrs",
                "disable",
            ),
            ("ipv4addr", "network_view", "name", "comment", "mac", "network"),
            required=("ipv4addr",),
        ),
        _type(
            "ipv6fixedaddress",
            ("duid", "ipv6addr", "network_view"),
            ("name", "comment", "extattrs", "network", "disable"),
            ("ipv6addr", "duid", "network_view", "name", "comment", "extattrs", "disable"),
            ("ipv6addr", "duid", "network_view", "name", "comment", "network"),
            required=("ipv6addr", "duid"),
        ),
        *(
            _type(
                range_type,
                ("comment", "end_addr", "network", "network_view", "start_addr"),
                ("extattrs", "disable", "name", "server_association_type"),
                (
                    "start_addr",
                    "end_addr",
                    "network",
                    "network_view",
                    "comment",
                    "extattrs",
                    "disable",
                    "name",
                    "server_association_type",
                ),
                ("start_addr", "end_addr", "network", "network_view", "comment", "name"),
                required=("start_addr", "end_addr"),
            )
            for range_type in ("range", "ipv6range")
        ),
        _type(
            "extensibleattributedef",
            ("comment", "default_value", "name", "type"),
            ("list_values", "flags", "allowed_object_types"),
            (
                "name",
                "type",
                "comment",
                "default_value",
                "list_values",
                "flags",
                "allowed_object_types",
            ),
            ("name", "type", "comment"),
            required=("name", "type"),
        ),
        _type(
            "networkview",
            ("comment", "is_default", "name"),
            ("extattrs",),
            ("name", "comment", "extattrs"),
            ("name", "comment", "is_default"),
            required=("name",),
        ),
        _type(
            "view",
            ("comment", "is_default", "name"),
            ("network_view", "extattrs"),
            ("name", "comment", "network_view", "extattrs"),
            ("name", "comment", "is_default", "network_view"),
            required=("name",),
        ),
        _type(
            "zone_auth",
            ("fqdn", "view"),
            ("comment", "extattrs"),
            ("fqdn", "view", "comment", "extattrs"),
            ("fqdn", "view", "comment"),
            required=("fqdn",),
        ),
        _type(
            "ipv4address",
            (
                "dhcp_client_identifier",
                "ip_address",
                "is_conflict",
                "lease_state",
                "mac_address",
                "names",
                "network",
                "network_view",
                "objects",
                "status",
                "types",
                "usage",
                "username",
            ),
            (),
            (),
            (*_ADDRESS_SEARCH, "mac_address"),
            read_only=True,
        ),
        _type(
            "ipv6address",
            (
                "duid",
                "ip_address",
                "is_conflict",
                "lease_state",
                "names",
                "network",
                "network_view",
                "objects",
                "status",
                "types",
                "usage",
            ),
            (),
            (),
            (*_ADDRESS_SEARCH, "duid"),
            read_only=True,
        ),
    )
}
