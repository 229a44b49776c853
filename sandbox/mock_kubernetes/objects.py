"""Helpers to create and watch pools, claims and addresses, over any Kubernetes API.

`ObjectHelpers` holds the logic; a subclass supplies four primitives (`create`,
`get_object`, `list_objects`, `delete_object`) and the served CAPI `version`. The sandbox
(`mock_kubernetes.sandbox`) implements them on the in-memory API, the e2e tests on a real
cluster, so the demo, the integration tests and the e2e tests speak one vocabulary.
"""

from __future__ import annotations

import base64
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from bridge.capi import GROUP, POOL_KINDS, Reason, ready_of

__all__ = ["ObjectHelpers", "wait_for"]

POOL_VERSION = "v1alpha1"


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
) -> Any:
    """Poll ``predicate()`` until it returns a truthy value; return that value.

    Raises
    ------
    TimeoutError
        After ``timeout`` seconds, naming ``message``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class ObjectHelpers(ABC):
    """Create pools, Secrets and claims, read them back, and wait for their state.

    Attributes
    ----------
    wait_timeout:
        Seconds a ``wait_*`` helper waits when not told otherwise.
    poll_interval:
        Seconds between two looks of a ``wait_*`` helper.
    """

    wait_timeout: float = 60.0
    poll_interval: float = 0.05

    @property
    @abstractmethod
    def version(self) -> str:
        """The CAPI IPAM version claims and addresses are written and read in."""

    @abstractmethod
    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object from its ``apiVersion``, ``kind`` and ``metadata``; return it."""

    @abstractmethod
    def get_object(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """Return one object, or None when it does not exist."""

    @abstractmethod
    def list_objects(
        self, api_version: str, plural: str, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """Return the objects of a resource (all namespaces when ``namespace`` is None)."""

    @abstractmethod
    def delete_object(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> None:
        """Delete one object (it goes once its finalizers are removed)."""

    # -- creating ---------------------------------------------------------------------

    def secret(self, namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
        """Create an Opaque Secret holding ``data`` (text values, stored base64)."""
        return self.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
            }
        )

    def _pool(
        self,
        kind: str,
        namespace: str,
        name: str,
        spec: dict[str, Any],
        credentials: Mapping[str, str] | None,
        secret: str | None,
        labels: Mapping[str, str] | None,
    ) -> dict[str, Any]:
        secret = secret or f"{name}-credentials"
        if credentials is not None:
            self.secret(namespace, secret, credentials)
        return self.create(
            {
                "apiVersion": f"{GROUP}/{POOL_VERSION}",
                "kind": kind,
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
                "spec": {"credentialsRef": {"name": secret}, **spec},
            }
        )

    def phpipam_pool(
        self,
        namespace: str,
        name: str,
        *,
        endpoint: str,
        app_id: str = "capi",
        subnet_id: int | None = None,
        subnet: str | None = None,
        credentials: Mapping[str, str] | None = None,
        secret: str | None = None,
        labels: Mapping[str, str] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        """Create a ``PHPIPAMIPPool`` (and its credentials Secret when ``credentials`` is given).

        Parameters
        ----------
        endpoint:
            The API base URL (a mock's ``.url``).
        credentials:
            Secret data (``username``/``password`` or ``token``), stored as
            ``<name>-credentials`` unless ``secret`` names the Secret.
        spec:
            Further spec fields, camelCase as in the CRD (``gateway``, ``hostnameSuffix``...).
        """
        body: dict[str, Any] = {"endpoint": endpoint, "appId": app_id, **spec}
        if subnet_id is not None:
            body["subnetId"] = subnet_id
        if subnet is not None:
            body["subnet"] = subnet
        return self._pool("PHPIPAMIPPool", namespace, name, body, credentials, secret, labels)

    def infoblox_pool(
        self,
        namespace: str,
        name: str,
        *,
        endpoint: str,
        subnet: str,
        credentials: Mapping[str, str] | None = None,
        secret: str | None = None,
        labels: Mapping[str, str] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        """Create an ``InfobloxIPPool`` (and its credentials Secret); see `phpipam_pool`."""
        body = {"endpoint": endpoint, "subnet": subnet, **spec}
        return self._pool("InfobloxIPPool", namespace, name, body, credentials, secret, labels)

    def claim(
        self,
        namespace: str,
        name: str,
        pool: str,
        *,
        kind: str = "PHPIPAMIPPool",
        cluster: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """Create an IPAddressClaim for ``kind``/``pool`` (in the served version by default)."""
        version = version or self.version
        spec: dict[str, Any] = {"poolRef": {"apiGroup": GROUP, "kind": kind, "name": pool}}
        if cluster and version != "v1alpha1":
            spec["clusterName"] = cluster
        return self.create(
            {
                "apiVersion": f"{GROUP}/{version}",
                "kind": "IPAddressClaim",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": dict(labels or {}),
                    "annotations": dict(annotations or {}),
                },
                "spec": spec,
            }
        )

    # -- reading ----------------------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a claim (served version) or None."""
        return self.get_object(f"{GROUP}/{self.version}", "ipaddressclaims", name, namespace)

    def claims(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Return the claims (all namespaces when None)."""
        return self.list_objects(f"{GROUP}/{self.version}", "ipaddressclaims", namespace)

    def addresses(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Return the IPAddresses (all namespaces when None)."""
        return self.list_objects(f"{GROUP}/{self.version}", "ipaddresses", namespace)

    def pool(self, namespace: str, name: str, kind: str = "PHPIPAMIPPool") -> dict[str, Any] | None:
        """Return a pool object or None."""
        return self.get_object(f"{GROUP}/{POOL_VERSION}", POOL_KINDS[kind], name, namespace)

    def delete_claim(self, namespace: str, name: str) -> None:
        """Delete a claim (it goes once the operator has released it)."""
        self.delete_object(f"{GROUP}/{self.version}", "ipaddressclaims", name, namespace)

    def delete_pool(self, namespace: str, name: str, kind: str = "PHPIPAMIPPool") -> None:
        """Delete a pool (it goes once no IPAddress references it)."""
        self.delete_object(f"{GROUP}/{POOL_VERSION}", POOL_KINDS[kind], name, namespace)

    def events(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Return the core v1 Events (all namespaces when None)."""
        return self.list_objects("v1", "events", namespace)

    # -- waiting ----------------------------------------------------------------------

    @staticmethod
    def ready(body: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
        """Return ``(status, reason)`` of an object's Ready condition (see `bridge.capi`)."""
        return ready_of(body or {})

    def wait_pool_ready(
        self,
        namespace: str,
        name: str,
        kind: str = "PHPIPAMIPPool",
        *,
        reason: str = Reason.POOL_READY,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Wait until a pool's Ready condition has ``reason``; return the pool."""
        return dict(
            wait_for(
                lambda: (
                    (p := self.pool(namespace, name, kind)) and self.ready(p)[1] == reason and p
                ),
                timeout=timeout or self.wait_timeout,
                interval=self.poll_interval,
                message=f"{kind} {namespace}/{name} reason {reason}",
            )
        )

    def wait_claims_bound(
        self, namespace: str | None, count: int, *, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Wait until ``count`` claims have ``status.addressRef`` and Ready True; return them."""

        def bound() -> list[dict[str, Any]] | None:
            done = [
                c
                for c in self.claims(namespace)
                if (c.get("status") or {}).get("addressRef") and self.ready(c)[0] == "True"
            ]
            return done if len(done) >= count else None

        return list(
            wait_for(
                bound,
                timeout=timeout or self.wait_timeout,
                interval=self.poll_interval,
                message=f"{count} claims bound",
            )
        )

    def wait_claim_reason(
        self, namespace: str, name: str, reason: str, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Wait until a claim's Ready condition has ``reason``; return the claim."""
        return dict(
            wait_for(
                lambda: (c := self.get_claim(namespace, name)) and self.ready(c)[1] == reason and c,
                timeout=timeout or self.wait_timeout,
                interval=self.poll_interval,
                message=f"claim {namespace}/{name} reason {reason}",
            )
        )

    def wait_gone(self, namespace: str | None, *, timeout: float | None = None) -> None:
        """Wait until no claim and no IPAddress is left (in ``namespace``, or anywhere)."""
        wait_for(
            lambda: not self.claims(namespace) and not self.addresses(namespace),
            timeout=timeout or self.wait_timeout,
            interval=self.poll_interval,
            message="claims and addresses gone",
        )
