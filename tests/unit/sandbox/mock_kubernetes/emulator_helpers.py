"""Helpers shared by the in-memory Kubernetes API tests."""

from __future__ import annotations

from typing import Any

import requests

GROUP = "example.com"


def make_crd(
    plural: str,
    kind: str,
    *,
    scope: str = "Namespaced",
    status: bool = True,
    versions: tuple[str, ...] = ("v1",),
    storage: str = "v1",
) -> dict[str, Any]:
    """A minimal apiextensions.k8s.io/v1 CRD, as a colleague's crds/*.yaml would hold."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "shortNames": [kind.lower()[:2]],
                "categories": ["test"],
            },
            "versions": [
                {
                    "name": v,
                    "served": True,
                    "storage": v == storage,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                    **({"subresources": {"status": {}}} if status else {}),
                }
                for v in versions
            ],
        },
    }


WIDGETS = make_crd("widgets", "Widget", versions=("v1", "v2"), storage="v2")
GADGETS = make_crd("gadgets", "Gadget", scope="Cluster", status=False)


class Api:
    """A tiny HTTP client for the emulator: JSON in, (status, JSON) out."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()

    def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        **params: Any,
    ) -> tuple[int, Any]:
        response = self.session.request(
            method,
            self.url + path,
            json=body,
            params=params or None,
            headers={"Content-Type": content_type},
            timeout=5,
        )
        return response.status_code, response.json()


WIDGETS_PATH = f"/apis/{GROUP}/v2/namespaces/default/widgets"


def widget(name: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v2", "kind": "Widget", "metadata": {"name": name}, **fields}
