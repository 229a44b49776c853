"""Shared pieces of the benchmarks: a sized mock phpIPAM seed, percentiles, tables, journals."""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mock_phpipam.store import JournalEntry

__all__ = [
    "CREDENTIALS",
    "SUBNET_ID",
    "classify",
    "cpu_seconds",
    "memory_kib",
    "percentile",
    "seed_for",
    "table",
]

CREDENTIALS = {"username": "bench", "password": "bench-password-not-secret"}
SUBNET_ID = 7


def seed_for(hosts: int) -> dict[str, Any]:
    """A mock phpIPAM seed with user `CREDENTIALS`, app ``capi`` and one IPv4 subnet (id 7).

    The subnet is the smallest ``10.64.0.0/n`` holding ``hosts`` addresses plus the gateway
    and some headroom.
    """
    prefix = 32 - max(8, math.ceil(math.log2(hosts + 16)))
    network = ipaddress.ip_network(f"10.64.0.0/{prefix}")
    return {
        "users": [dict(CREDENTIALS)],
        "apps": [{"id": "capi", "permissions": 2, "security": "none"}],
        "sections": [
            {
                "id": 3,
                "name": "bench",
                "subnets": [
                    {
                        "id": SUBNET_ID,
                        "cidr": str(network),
                        "gateway": str(network.network_address + 1),
                    },
                ],
            }
        ],
    }


def cpu_seconds(pid: int) -> float:
    """Return the CPU seconds (user + system) a process has used so far, from ``/proc``.

    Fields 14 and 15 (``utime``, ``stime``, in clock ticks) of ``/proc/<pid>/stat``
    (https://man7.org/linux/man-pages/man5/proc.5.html); the threads of the process are
    counted, its children are not. Resolution: one clock tick (usually 10 ms).
    """
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    fields = stat.rsplit(")", 1)[1].split()  # after "(comm)", which may contain spaces
    ticks = int(fields[11]) + int(fields[12])  # fields 14 and 15 of the whole line
    return ticks / os.sysconf("SC_CLK_TCK")


def memory_kib(pid: int) -> dict[str, int]:
    """Return ``VmRSS`` and ``VmHWM`` (peak RSS) of a process in KiB (Linux ``/proc``)."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def percentile(values: Sequence[float], share: float) -> float:
    """The ``share`` (0..1) percentile of ``values``, nearest rank; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


_ID = re.compile(r"/\d+(?=/|$)")
_HOST = re.compile(r"(search_hostname/)[^/]+")


def classify(entries: Iterable[JournalEntry]) -> Counter[str]:
    """Count journal entries by ``METHOD controller/action`` (ids and hostnames elided)."""
    counts: Counter[str] = Counter()
    for entry in entries:
        path = entry.path.split("?", 1)[0]
        path = re.sub(r"^/api/[^/]+/", "", path)
        path = _HOST.sub(r"\1{hostname}", path)
        path = _ID.sub("/{id}", path).rstrip("/")
        counts[f"{entry.method} {path}"] += 1
    return counts


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Format rows as a plain-text table (floats with 3 significant digits)."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return "-" if math.isnan(value) else f"{value:.3g}" if value < 1000 else f"{value:.0f}"
        return str(value)

    body = [[cell(v) for v in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)
    ]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)
