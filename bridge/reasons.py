"""Every reason ipam-bridge writes in a condition or an Event, in one place.

The reasons are enumerations (`enum.StrEnum`) next to the code that writes them:
`bridge.capi.Reason` (claims' and pools' conditions and Events, the drift audit's),
`bridge.reconcilers.control_plane.EndpointReason` (Events on Clusters) and
`bridge.runtime.leader.LeaseReason` (Events on the leader election Lease). `ENUMERATIONS`
lists them all: ``docs/gen_reference.py`` prints ``docs/reference/reasons.md`` from it, and
the tests check that the code writes no reason outside it and that ``docs/troubleshooting.md``
explains each one. Nothing of the operator imports this module.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from bridge.capi import Reason
from bridge.reconcilers.control_plane import EndpointReason
from bridge.runtime.leader import LeaseReason

__all__ = ["ENUMERATIONS", "Enumeration", "all_reasons"]


@dataclass(frozen=True)
class Enumeration:
    """One enumeration of reasons and the objects whose conditions or Events carry them.

    Attributes
    ----------
    reasons:
        The `enum.StrEnum` class; its members' values are the reasons as the API stores them.
    objects:
        Where they appear, for a person (``"IPAddressClaims and pools: ..."``).
    """

    reasons: type[enum.StrEnum]
    objects: str


#: Every enumeration of reasons the operator writes, in the order the reference lists them.
ENUMERATIONS: tuple[Enumeration, ...] = (
    Enumeration(
        Reason,
        "IPAddressClaims and pools: the Ready condition, the pools' InSync condition "
        "(drift audit) and the Events about them",
    ),
    Enumeration(EndpointReason, "Clusters: Events of the control-plane endpoint"),
    Enumeration(LeaseReason, "The leader election Lease: Events"),
)


def all_reasons() -> list[str]:
    """Return every reason the operator may write, in `ENUMERATIONS` order, each once."""
    seen: dict[str, None] = {}
    for enumeration in ENUMERATIONS:
        seen.update((str(member), None) for member in enumeration.reasons)
    return list(seen)
