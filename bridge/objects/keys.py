"""Work-queue keys and wake tokens: one typed, hashable value each.

A key names what a reconcile is about (`ClaimKey`: a claim, `PoolKey`: a pool,
`ClusterKey`: a Cluster's control-plane endpoint); the work queue runs one reconcile per
key at a time (`bridge.runtime.workqueue`). A wake token names what parked keys wait for
(`ClusterToken`: the claims of a paused or missing Cluster, `PoolToken`: the claims waiting
for a pool to be Ready or to have a free address, `EndpointToken`: the claims waiting for a
place at an IPAM server).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ClaimKey",
    "ClusterKey",
    "ClusterToken",
    "EndpointToken",
    "PoolKey",
    "PoolToken",
    "claim_key",
    "cluster_key",
    "cluster_token",
    "endpoint_token",
    "pool_key",
    "pool_token",
]


@dataclass(frozen=True)
class ClaimKey:
    """The work-queue key of an IPAddressClaim."""

    namespace: str
    name: str


@dataclass(frozen=True)
class PoolKey:
    """The work-queue key of a pool (``namespace`` empty for a Global pool)."""

    namespace: str
    kind: str
    name: str


@dataclass(frozen=True)
class ClusterKey:
    """The work-queue key of a CAPI Cluster's control-plane endpoint."""

    namespace: str
    name: str


@dataclass(frozen=True)
class ClusterToken:
    """The wake token of the claims waiting for a Cluster (unpaused, created or deleted)."""

    namespace: str
    name: str


@dataclass(frozen=True)
class PoolToken:
    """The wake token of the claims waiting for a pool (Ready, or an address freed)."""

    namespace: str
    kind: str
    name: str


@dataclass(frozen=True)
class EndpointToken:
    """The wake token of the claims waiting for a place at an IPAM server.

    ``endpoint``: ``scheme://host:port`` (`backends.flowcontrol.endpoint_key`).
    """

    endpoint: str


def endpoint_token(endpoint: str) -> EndpointToken:
    """Return the wake token of the claims waiting for a place at ``endpoint``."""
    return EndpointToken(endpoint)


def claim_key(namespace: str, name: str) -> ClaimKey:
    """Return the work-queue key of a claim."""
    return ClaimKey(namespace, name)


def pool_key(namespace: str, kind: str, name: str) -> PoolKey:
    """Return the work-queue key of a pool."""
    return PoolKey(namespace, kind, name)


def cluster_key(namespace: str, name: str) -> ClusterKey:
    """Return the work-queue key of a Cluster's control-plane endpoint."""
    return ClusterKey(namespace, name)


def cluster_token(namespace: str, name: str) -> ClusterToken:
    """Return the wake token of the claims waiting for a Cluster."""
    return ClusterToken(namespace, name)


def pool_token(namespace: str, kind: str, name: str) -> PoolToken:
    """Return the wake token of the claims waiting for a pool."""
    return PoolToken(namespace, kind, name)
