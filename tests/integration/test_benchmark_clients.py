"""The benchmarks' IPAM client part runs against the backend interface as it is.

Benchmarks print figures and never pass or fail (`benchmarks/`); this test only runs the
client part of the hot path once with a handful of operations, so that a change of the
backend interface (e.g. `allocate`'s owner) breaks the suite rather than the next benchmark.
"""

from __future__ import annotations

from benchmarks.client_bench import run_client_bench


def test_the_client_bench_allocates_and_releases_every_hostname() -> None:
    result = run_client_bench(4, threads=2)
    assert len(result.alloc_latencies) == 4
    assert result.alloc_requests and result.release_requests
    assert result.alloc_seconds > 0 and result.release_seconds > 0
