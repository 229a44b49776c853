"""The one interface every IPAM backend implements, and the values it returns.

Semantics (DESIGN.md section 4): the key of a claim in the IPAM is its hostname; every
operation is limited to the pool's subnet; every write is safe to repeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Allocation", "IPAMBackend", "SubnetInfo"]


@dataclass(frozen=True)
class SubnetInfo:
    """Facts about the pool's subnet as the IPAM reports them.

    Attributes
    ----------
    cidr:
        The subnet in CIDR notation, e.g. ``"10.20.0.0/24"`` or ``"2001:db8:20::/64"``.
    prefix:
        The prefix length in bits (0-32 for IPv4, 0-128 for IPv6).
    gateway:
        The subnet's gateway: the pool's override when the backend was given one, else what
        the IPAM records for the subnet, or None when neither is known.
    total:
        Addresses in the range the IPAM allocates from (IPv4 excludes network and broadcast
        below /31).
    used:
        Addresses registered in the IPAM, whoever registered them, plus a gateway in that
        range that nothing registers yet (it is never handed out either).
    free:
        ``total - used`` (never negative): what allocations can still get.
    """

    cidr: str
    prefix: int
    gateway: str | None
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class Allocation:
    """An address registered in the IPAM under a hostname.

    Attributes
    ----------
    address:
        The IP address, normalised (``"10.20.0.2"``, ``"2001:db8:20::1"``).
    prefix:
        Prefix length of the subnet the address is in.
    gateway:
        The subnet's gateway (the pool's override, else the IPAM's), or None.
    hostname:
        The hostname the address is registered under (the claim's key).
    ref:
        The IPAM's own identifier of the entry (phpIPAM address id, WAPI ``_ref``).
    """

    address: str
    prefix: int
    gateway: str | None
    hostname: str
    ref: str


@runtime_checkable
class IPAMBackend(Protocol):
    """A client for one pool's subnet in one external IPAM.

    Implementations are synchronous (they run in kopf's thread pool), thread-safe, and
    retry transient failures themselves (`backends.retry`). Every method raises only
    `backends.errors.BackendError` subclasses.
    """

    def describe_subnet(self) -> SubnetInfo:
        """Return the subnet's CIDR, prefix, gateway and usage.

        Raises
        ------
        SubnetNotFoundError, AuthenticationFailedError, BackendUnavailableError
        """
        ...

    def find(self, hostname: str) -> Allocation | None:
        """Return the address registered under ``hostname`` in this subnet, or None.

        The match is exact (the IPAM may compare case-insensitively); entries with the
        same hostname in other subnets are ignored, and so are entries at an address that
        is never handed out (the gateway, the network or broadcast address). When several
        entries match, the oldest one wins.
        """
        ...

    def allocate(self, hostname: str, description: str) -> Allocation:
        """Register the first free address of the subnet under ``hostname``.

        Looks the hostname up first and returns the existing entry if there is one, so a
        repeated call never creates a second entry. The reservation itself is atomic on
        the IPAM side; a lost race is retried. Never returns the gateway (the pool's or
        the IPAM's), nor the network or broadcast address of an IPv4 subnet below /31.

        Parameters
        ----------
        hostname:
            The claim's key (see `bridge.claims.hostname_for`).
        description:
            Provenance text stored with the entry (truncated to what the IPAM accepts).

        Raises
        ------
        SubnetExhaustedError
            When the subnet has no free address.
        """
        ...

    def release(self, hostname: str) -> bool:
        """Delete every entry registered under ``hostname`` in this subnet.

        Idempotent: returns True when something was deleted, False when nothing was
        registered (which is success, not an error).
        """
        ...

    def close(self) -> None:
        """Release the HTTP session (and log out where the IPAM has sessions)."""
        ...
