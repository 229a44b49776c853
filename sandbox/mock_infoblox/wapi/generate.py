"""Extract what ipam-bridge's mock and tests need from Infoblox's WAPI 2.12 OpenAPI files.

Source: ``dhcp.json``, ``dns.json`` and ``ipam.json`` of the public repository
infobloxopen/infoblox-swagger-wapi (commit ``279ffd26df14cc656abe9610227c1910b4fe15e4``,
path ``infoblox-swagger-ui/dist/v2.12/``), which Infoblox generated from the WAPI 2.12
schema of a grid. For each object the mock serves this keeps the search parameters of
``GET <object>``, the fields of the object, the body fields of ``POST <object>`` and
``PUT <ref>``, and the functions of ``POST <ref>?_function=``.

Run: ``python -m mock_infoblox.wapi.generate <directory of the three files>``; it writes
``wapi-2.12.json`` next to this script (sorted, so a re-run changes nothing).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

VERSION = "2.12"
SOURCE_FILES = ("dhcp.json", "dns.json", "ipam.json")
#: The objects the mock serves and the client uses.
OBJECTS = (
    "fixedaddress",
    "ipv4address",
    "ipv6address",
    "ipv6fixedaddress",
    "ipv6network",
    "ipv6range",
    "network",
    "networkview",
    "range",
    "record:host",
    "view",
    "zone_auth",
)
OUTPUT = Path(__file__).with_name(f"wapi-{VERSION}.json")


def _names(parameters: list[dict[str, Any]]) -> list[str]:
    # The generated files spell one control argument " _page_id" (with a space).
    return sorted({str(p["name"]).strip() for p in parameters if p.get("in") == "query"})


def _body(operation: dict[str, Any] | None) -> list[str]:
    if operation is None:
        return []
    content = operation.get("requestBody", {}).get("content", {})
    return sorted(content.get("application/json", {}).get("schema", {}).get("properties", {}))


def extract(paths: dict[str, Any], schemas: dict[str, Any], name: str) -> dict[str, Any]:
    """Return ``{"search", "fields", "create", "update", "functions"}`` of object ``name``.

    ``paths``/``schemas`` are the merged ``paths`` and ``components.schemas`` of the files.
    Raises KeyError when the files do not describe ``name``.
    """
    base = f"/wapi/v{VERSION}/{name}"
    collection = paths[base]
    by_ref = paths[f"{base}/{{{name}_reference}}"]
    functions: list[str] = []
    for parameter in (by_ref.get("post") or {}).get("parameters", []):
        if parameter.get("name") == "_function":
            functions = sorted(parameter.get("schema", {}).get("enum", []))
    schema = schemas[name.replace(":", "_")]
    return {
        "search": [n for n in _names(collection["get"]["parameters"]) if not n.startswith("_")],
        "fields": sorted(schema.get("properties", {})),
        "create": _body(collection.get("post")),
        "update": _body(by_ref.get("put")),
        "functions": functions,
    }


def main(directory: str) -> None:
    """Read the three files in ``directory`` and write `OUTPUT`."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for file_name in SOURCE_FILES:
        data = json.loads((Path(directory) / file_name).read_text())
        paths.update(data["paths"])
        schemas.update(data["components"]["schemas"])
    out = {
        "source": "Infoblox WAPI 2.12 OpenAPI description (infobloxopen/infoblox-swagger-wapi "
        "279ffd26df14cc656abe9610227c1910b4fe15e4, infoblox-swagger-ui/dist/v2.12/)",
        "version": VERSION,
        "objects": {name: extract(paths, schemas, name) for name in OBJECTS},
    }
    OUTPUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
