"""Names, credentials, seeds and object bodies shared by the integration tests.

A module of its own (not ``conftest``): pytest imports every folder's ``conftest.py`` under
the one name ``conftest``, so ``from conftest import ...`` picks whichever was loaded last
when several test folders run together.
"""

from __future__ import annotations

from typing import Any

NAMESPACE = "test"
CREDENTIALS = {"username": "capi-operator", "password": "Pa55-w0rd-never-logged"}

#: phpIPAM: subnet 7 is a /24 with a gateway, 8 an IPv6 /64 without one, 9 a /30 (two
#: usable hosts, for exhaustion), 10 a /28.
PHPIPAM_SEED: dict[str, Any] = {
    "users": [{"username": CREDENTIALS["username"], "password": CREDENTIALS["password"]}],
    "apps": [
        {"id": "capi", "permissions": 2, "security": "none"},
        {
            "id": "capicode",
            "permissions": 2,
            "security": "ssl_code",
            "code": "app-code-token-0123456789",
        },
    ],
    "sections": [
        {
            "id": 3,
            "name": "capi-test",
            "subnets": [
                {"id": 7, "cidr": "10.20.0.0/24", "gateway": "10.20.0.1"},
                {"id": 8, "cidr": "2001:db8:20::/64"},
                {"id": 9, "cidr": "10.20.1.0/30"},
                {"id": 10, "cidr": "10.20.2.0/28", "gateway": "10.20.2.1"},
            ],
        }
    ],
}

#: Infoblox: the same shapes as networks of the default network view.
INFOBLOX_SEED: dict[str, Any] = {
    "users": {CREDENTIALS["username"]: CREDENTIALS["password"]},
    "zones": [{"fqdn": "nodes.example.com", "view": "default"}],
    "extensible_attributes": [{"name": "Owner", "type": "STRING"}],
    "networks": [
        {"network": "10.20.0.0/24", "network_view": "default", "gateway": "10.20.0.1"},
        {"network": "2001:db8:20::/64", "network_view": "default"},
        {"network": "10.20.1.0/30", "network_view": "default"},
    ],
    "used": [{"ip": "10.20.0.1", "network_view": "default", "names": ["gateway"], "types": ["A"]}],
}


def schemaless_crd(
    group: str, version: str, kind: str, plural: str, scope: str = "Namespaced"
) -> dict[str, Any]:
    """Return a CustomResourceDefinition of one served version that takes any fields.

    Parameters
    ----------
    group, version : str
        The API group and its one (served, storage) version.
    kind, plural : str
        The kind and its plural; the singular is the kind in lower case and the list kind
        ``<kind>List``.
    scope : str
        ``Namespaced`` or ``Cluster``.

    Returns
    -------
    dict
        The ``apiextensions.k8s.io/v1`` body, its schema an object that preserves unknown
        fields.

    """
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {
                "kind": kind,
                "plural": plural,
                "listKind": f"{kind}List",
                "singular": kind.lower(),
            },
            "scope": scope,
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
