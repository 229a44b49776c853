"""``python -m benchmarks``: the operator's throughput and latency, and what each claim costs.

Parts (``--only NAME`` runs one): ``operator`` (throughput/latency, backend calls per
claim), ``client`` (the IPAM client's ops/s), ``writes`` (API writes per allocation, per
release and per waiting claim-minute), ``hot`` (the hot path of a claim: the operator's CPU
seconds per allocation and per release next to a bare client's sending the same requests,
rates vs the raw IPAM and the bare client, API requests by verb, a yappi CPU profile of the
operator), ``trace-release`` (claims deleted at once, each release traced step by step from
its deletion to its finalizer removal: `benchmarks.trace_release`), ``restart`` (10,000
bound claims), ``audit`` (the drift audit of a 10,000-address
pool: wall and CPU seconds, IPAM requests), ``soak`` (a compressed day of churn: RSS and
the size of every in-memory structure of the operator at start and end), ``scale``
(100 pools x 100 claims: allocation rate, a restart with all bound, release rate, the
operator's peak RSS; ``--scale-pools``/``--scale-per-pool`` for a smaller run),
``standby`` (a standby's RSS before and after 100,000 claims churned through its informers;
``--standby-base`` measures another checkout's as well) and ``reset`` (every watch
connection cut by a TCP reset: the LIST and GET requests a reset costs, and the time to the
next claim bound).

Everything runs on 127.0.0.1: the emulated Kubernetes API and mock_phpipam in this process,
the real kopf operator (the hot-path, restart and scale parts run it in a process of its
own, as in a pod: `benchmarks.operator_process`). Figures only; nothing passes or fails.
Without ``scale``, the defaults finish in a few minutes on 2 cores (the API-writes part
watches waiting claims for a minute); ``--quick`` shortens every part.
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.api_writes import RESOURCES, WritesResult, run_writes_bench
from benchmarks.audit_bench import format_result as format_audit
from benchmarks.audit_bench import run_audit_bench
from benchmarks.client_bench import ClientResult, run_client_bench
from benchmarks.common import percentile, table
from benchmarks.hot_path import READ_VERBS, WRITE_VERBS, HotPathResult, run_hot_path
from benchmarks.operator_bench import OperatorResult, run_operator_bench
from benchmarks.restart_bench import format_result as format_restart
from benchmarks.restart_bench import run_restart_bench
from benchmarks.scale_bench import format_result as format_scale
from benchmarks.scale_bench import run_scale_bench
from benchmarks.soak_bench import format_result as format_soak
from benchmarks.soak_bench import run_soak_bench
from benchmarks.standby_bench import format_result as format_standby
from benchmarks.standby_bench import run_standby_bench
from benchmarks.trace_release import format_result as format_trace
from benchmarks.trace_release import run_trace_release
from benchmarks.watch_reset_bench import format_result as format_reset
from benchmarks.watch_reset_bench import run_watch_reset_bench


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _hot_runs(text: str) -> list[tuple[float, float, float]]:
    runs = []
    for item in text.split(","):
        ipam, read, write = (float(x) for x in item.split("/"))
        runs.append((ipam, read, write))
    return runs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-n",
        "--claims",
        type=int,
        default=200,
        help="claims created at once per operator run (default 200)",
    )
    parser.add_argument(
        "-w",
        "--workers",
        type=_int_list,
        default=[1, 4, 16],
        help="IPAM_BRIDGE_WORKERS values, comma-separated (default 1,4,16)",
    )
    parser.add_argument(
        "--client-ops",
        type=int,
        default=200,
        help="allocations (then releases) per client run (default 200)",
    )
    parser.add_argument(
        "--client-threads",
        type=_int_list,
        default=[1, 8],
        help="client threads, comma-separated (default 1,8)",
    )
    parser.add_argument(
        "--latency-ms",
        type=_float_list,
        default=[0.0, 20.0],
        help="latency injected by the mock, ms, comma-separated (default 0,20)",
    )
    parser.add_argument(
        "--writes-claims",
        type=int,
        default=50,
        help="claims allocated then released while API writes are counted (default 50)",
    )
    parser.add_argument(
        "--waiting",
        type=int,
        default=10,
        help="waiting claims on an exhausted pool, and as many of a paused Cluster (default 10)",
    )
    parser.add_argument(
        "--wait-seconds",
        type=float,
        default=None,
        help="how long waiting claims are watched (default 60, 10 with --quick)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="watch waiting claims for 10 s instead of 60 (figures still per minute)",
    )
    parser.add_argument(
        "--only",
        choices=(
            "operator",
            "client",
            "writes",
            "hot",
            "trace-release",
            "restart",
            "audit",
            "soak",
            "scale",
            "standby",
            "reset",
        ),
        default=None,
        help="run one part only",
    )
    parser.add_argument(
        "--hot-claims",
        type=int,
        default=None,
        help="claims of the hot-path run (default 300, 100 with --quick)",
    )
    parser.add_argument(
        "--hot-workers",
        type=int,
        default=16,
        help="IPAM_BRIDGE_WORKERS of the hot-path run (default 16: 8 endpoint slots, the raw "
        "IPAM client's threads)",
    )
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="skip the hot path's profiled operator run (yappi)",
    )
    parser.add_argument(
        "--audit-addresses",
        type=int,
        default=10_000,
        help="addresses of the pool whose drift audit is timed (default 10000)",
    )
    parser.add_argument(
        "--restart-bound",
        type=int,
        default=None,
        help="bound claims of the restart run (default 10000, 1000 with --quick)",
    )
    parser.add_argument(
        "--hot-runs",
        type=_hot_runs,
        default=_hot_runs("0/0/0,40/3/10"),
        help="hot-path runs as IPAM/APIREAD/APIWRITE latencies in ms, comma-separated "
        "(default 0/0/0,40/3/10: the bare mocks, then a phpIPAM about as fast as a real "
        "phpIPAM 1.8 on 2 cores, ~80-100 allocations/s with 8 threads, and an API server "
        "answering reads in 3 ms and writes in 10 ms)",
    )
    parser.add_argument(
        "--hot-base",
        type=Path,
        default=None,
        help="another checkout of this repository (git worktree add DIR REV): each hot-path "
        "run measures its operator and this tree's in turn, --hot-rounds times, and prints "
        "each round and the medians (no profile)",
    )
    parser.add_argument(
        "--hot-rounds",
        type=int,
        default=3,
        help="interleaved rounds of --hot-base (default 3)",
    )
    parser.add_argument(
        "--trace-claims",
        type=int,
        default=None,
        help="claims deleted at once in the release trace (default 300, 100 with --quick)",
    )
    parser.add_argument(
        "--trace-latency",
        type=_hot_runs,
        default=_hot_runs("40/3/10"),
        help="the release trace's IPAM/APIREAD/APIWRITE latencies in ms (default 40/3/10)",
    )
    parser.add_argument(
        "--soak-rounds",
        type=int,
        default=None,
        help="rounds (hours of churn) of the soak (default 24, 6 with --quick)",
    )
    parser.add_argument(
        "--scale-pools",
        type=int,
        default=None,
        help="pools of the scale run (default 100, 10 with --quick)",
    )
    parser.add_argument(
        "--scale-per-pool",
        type=int,
        default=100,
        help="claims per pool of the scale run (default 100)",
    )
    parser.add_argument(
        "--standby-claims",
        type=int,
        default=None,
        help="claims churned past the standby (default 100000, 10000 with --quick)",
    )
    parser.add_argument(
        "--standby-base",
        type=Path,
        default=None,
        help="another checkout of this repository (git worktree add DIR main): its standby is "
        "measured first, then this tree's",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds one operator run may take (default 180)",
    )
    return parser


def _per(counts: Counter[str], n: int, *, prefix: str = "") -> float:
    return sum(v for k, v in counts.items() if k.startswith(prefix)) / n


def _breakdown(counts: Counter[str], n: float) -> str:
    return ", ".join(f"{k} {v / n:.2g}" for k, v in sorted(counts.items()))


def _operator_tables(results: Sequence[OperatorResult]) -> str:
    throughput = table(
        [
            "workers",
            "claims",
            "all bound s",
            "claims/s",
            "p50 s",
            "p95 s",
            "max s",
            "all released s",
            "releases/s",
        ],
        [
            [
                r.workers,
                r.claims,
                r.bind_seconds,
                r.claims_per_second,
                r.p50,
                r.p95,
                max(r.latencies),
                r.release_seconds,
                r.releases_per_second,
            ]
            for r in results
        ],
    )
    calls = table(
        [
            "workers",
            "requests/alloc",
            "requests/release",
            "logins",
            "per allocation",
            "per release",
        ],
        [
            [
                r.workers,
                _per(r.alloc_requests, r.claims),
                _per(r.release_requests, r.claims),
                _per(r.alloc_requests + r.release_requests, 1, prefix="POST user"),
                _breakdown(r.alloc_requests, r.claims),
                _breakdown(r.release_requests, r.claims),
            ]
            for r in results
        ],
    )
    return (
        "(a) whole operator: claims created at once; latency = create returned -> first poll "
        "(50 ms) seeing addressRef + Ready True\n"
        + throughput
        + "\n\n(b) phpIPAM requests per claim (mock journal; login and pool check before t0, "
        "pool refresher off)\n" + calls
    )


def _client_table(results: Sequence[ClientResult]) -> str:
    title = "(c) PHPIPAMBackend alone against mock_phpipam (one client, shared by the threads)"
    return (
        title
        + "\n"
        + table(
            [
                "latency ms",
                "threads",
                "ops",
                "alloc/s",
                "alloc p50 ms",
                "alloc p95 ms",
                "release/s",
                "requests/alloc",
                "requests/release",
            ],
            [
                [
                    r.latency_ms,
                    r.threads,
                    r.ops,
                    r.alloc_per_second,
                    percentile(r.alloc_latencies, 0.5) * 1000,
                    percentile(r.alloc_latencies, 0.95) * 1000,
                    r.release_per_second,
                    _per(r.alloc_requests, r.ops),
                    _per(r.release_requests, r.ops),
                ]
                for r in results
            ],
        )
    )


def _writes_tables(result: WritesResult) -> str:
    writes = table(
        ["phase", "per", "API writes", *RESOURCES, "phpIPAM requests"],
        [
            [
                p.label,
                p.unit,
                p.per_unit(),
                *(p.per_unit(c) for c in RESOURCES),
                p.backend_per_unit,
            ]
            for p in result.phases
        ],
    )
    verbs = "\n".join(
        f"  {p.label}: {_breakdown(p.verbs, p.units) or 'none'}" for p in result.phases
    )
    outside = ", ".join(f"{k} {v}" for k, v in sorted(result.outside_while_waiting.items()))
    return (
        f"(d) operator's Kubernetes API writes (create/update/patch/delete requests, from the "
        f"emulator's access log; the benchmark's own writes excluded) and phpIPAM requests "
        f"(mock journal); {result.claims} claims allocated then released, {result.waiting} "
        f"claims waiting on an exhausted pool and {result.waiting} of a paused Cluster "
        f"watched for {result.wait_seconds:g} s; production requeue/refresh timing\n"
        + writes
        + "\nwrites by verb and resource, per unit:\n"
        + verbs
        + f"\n  other namespaces while waiting (total): {outside or 'none'}"
    )


def _profile_lines(label: str, found: dict[str, Any]) -> str:
    if not found:
        return f"  {label}: no profile (yappi not installed? pip install -e '.[bench]')"

    if "packages" not in found:  # the CPU sampler's (`benchmarks.sampler.CpuSampler`)
        return (
            f"  {label}: {found['cpu']:.2f} CPU s sampled (stacks weighted by thread CPU)\n"
            + "\n".join(
                f"  top by {key} CPU:\n"
                + _indent(table(["function", f"{key} s"], [list(row) for row in found[key]]))
                for key in ("cumulative", "own")
            )
        )

    def rows(key: str) -> str:
        return table(
            ["function", "package", "calls", "cumulative s", "own s"],
            [
                [place, package, calls, total, own]
                for place, package, calls, total, own in found[key]
            ],
        )

    packages = ", ".join(f"{name} {seconds:.2f}" for name, seconds in found["packages"])
    return (
        f"  {label}: {found['cpu']:.2f} CPU s under the profiler; own CPU s by package: "
        f"{packages}\n  top by cumulative CPU:\n"
        + _indent(rows("cumulative"))
        + "\n  top by own CPU:\n"
        + _indent(rows("own"))
    )


def _indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line for line in text.splitlines())


def _hot_ab_table(rounds: list[tuple[str, HotPathResult]]) -> str:
    """Return CPU per claim and claims/s of interleaved base/this runs: each, then medians."""
    first = rounds[0][1]

    def row(label: str, results: list[HotPathResult]) -> list[Any]:
        cells: list[Any] = [label]
        for phase in ("allocation", "release"):
            ours = [next(p.cpu_ms for p in r.phases if p.label == phase) for r in results]
            bare = [r.bare[phase].cpu_ms for r in results]
            ratio = [o / b for o, b in zip(ours, bare, strict=True)]
            rate = [next(p.per_second for p in r.phases if p.label == phase) for r in results]
            bare_rate = [r.bare[phase].per_second for r in results]
            rate_ratio = [o / b for o, b in zip(rate, bare_rate, strict=True)]
            cells += [statistics.median(ours), statistics.median(bare), statistics.median(ratio)]
            cells += [
                statistics.median(rate),
                statistics.median(bare_rate),
                statistics.median(rate_ratio),
            ]
        return cells

    each = [row(f"{label} {n // 2 + 1}", [r]) for n, (label, r) in enumerate(rounds)]
    medians = [
        row(f"{label}: median", [r for lb, r in rounds if lb == label])
        for label in ("base", "this")
    ]
    return (
        f"(e') hot path, base against this tree, interleaved: {first.claims} claims, "
        f"IPAM_BRIDGE_WORKERS={first.workers}, IPAM latency {first.latency_ms:g} ms, API "
        f"latency {first.api_ms[0]:g}/{first.api_ms[1]:g} ms; CPU ms per claim of the operator "
        "and of the bare client of the same run (a median row's ratio is the median of the runs' "
        "ratios), and claims bound (released) per second by the operator and by the bare "
        "client of the same run, and their ratio\n"
        + table(
            [
                "run",
                "alloc ms",
                "bare ms",
                "ratio",
                "claims/s",
                "bare/s",
                "ratio",
                "release ms",
                "bare ms",
                "ratio",
                "claims/s",
                "bare/s",
                "ratio",
            ],
            each + medians,
        )
    )


def _hot_tables(result: HotPathResult) -> str:
    raw = result.raw
    assert raw is not None
    rates = {"allocation": raw.alloc_per_second, "release": raw.release_per_second}
    figures = table(
        [
            "phase",
            "claims",
            "s",
            "claims/s",
            "raw IPAM/s",
            "ratio",
            "bare/s",
            "ratio",
            "CPU ms/claim",
            "of which loop",
            "bare CPU ms/claim",
            "CPU ratio",
        ],
        [
            [
                p.label,
                p.claims,
                p.seconds,
                p.per_second,
                rates[p.label],
                p.per_second / rates[p.label],
                result.bare[p.label].per_second,
                p.per_second / result.bare[p.label].per_second,
                p.cpu_ms,
                p.loop_cpu_ms,
                result.bare[p.label].cpu_ms,
                p.cpu_ms / result.bare[p.label].cpu_ms,
            ]
            for p in result.phases
        ],
    )
    requests = table(
        ["phase", "API reads/claim", "watches/claim", "API writes/claim", "IPAM req/claim"],
        [
            [
                p.label,
                p.per_claim(READ_VERBS - {"watch"}),
                p.per_claim(frozenset({"watch"})),
                p.per_claim(WRITE_VERBS),
                p.ipam_per_claim,
            ]
            for p in result.phases
        ],
    )
    detail = "\n".join(
        f"  {p.label}: API {_breakdown(p.api, p.claims) or 'none'}\n"
        f"  {' ' * len(p.label)}  IPAM {_breakdown(p.ipam, p.claims) or 'none'}"
        for p in result.phases
    )
    profiles = "\n".join(_profile_lines(p.label, p.profile) for p in result.profiled)
    return (
        f"(e) hot path: {result.claims} claims, IPAM_BRIDGE_WORKERS={result.workers}, IPAM "
        f"latency {result.latency_ms:g} ms per request, API latency {result.api_ms[0]:g} ms "
        f"per read and {result.api_ms[1]:g} ms per write; raw IPAM = PHPIPAMBackend with "
        f"{result.parallelism} threads (= the operator's endpoint slots) against its own mock "
        "(search + first-free; release: search + delete); bare = a client of its own process "
        "sending the same phpIPAM requests and the 3 API writes per claim (urllib3, "
        f"{result.parallelism} threads); CPU = user + system seconds of the process (the "
        "operator's from its first create to its last write settled, of which its event loop's "
        "(main thread: kopf's watch events, the handlers, the work queue's dispatch); the "
        "operator logs at "
        f"INFO to a file; idle it uses {result.idle_cpu_ms_per_s:.1f} ms CPU per second)\n"
        + figures
        + "\n"
        + requests
        + "\nrequests per claim by verb and resource:\n"
        + detail
        + "\nprofile of the operator's process (yappi, CPU clock, every thread; a run of its "
        "own, slowed by the profiler):\n" + (profiles or "  (not profiled)")
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected benchmarks and print their tables; return the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # kopf and the mocks are chatty at INFO
    started = time.monotonic()
    print(
        f"ipam-bridge benchmarks: Python {platform.python_version()}, {platform.machine()}, "
        f"claims={args.claims} workers={args.workers} client-ops={args.client_ops} "
        f"writes-claims={args.writes_claims} waiting={args.waiting}",
        flush=True,
    )
    if args.only in (None, "operator"):
        results = []
        for workers in args.workers:
            print(f"  operator: {args.claims} claims, {workers} workers ...", flush=True)
            results.append(run_operator_bench(args.claims, workers, timeout=args.timeout))
        print("\n" + _operator_tables(results), flush=True)
    if args.only in (None, "client"):
        client = []
        for latency in args.latency_ms:
            for threads in args.client_threads:
                client.append(
                    run_client_bench(args.client_ops, threads=threads, latency_ms=latency)
                )
        print("\n" + _client_table(client), flush=True)
    if args.only in (None, "writes"):
        wait_seconds = (
            args.wait_seconds if args.wait_seconds is not None else (10.0 if args.quick else 60.0)
        )
        print(
            f"  API writes: {args.writes_claims} claims, {args.waiting}+{args.waiting} waiting "
            f"for {wait_seconds:g} s ...",
            flush=True,
        )
        writes = run_writes_bench(
            args.writes_claims, args.waiting, wait_seconds, timeout=args.timeout
        )
        print("\n" + _writes_tables(writes), flush=True)
    if args.only in (None, "hot"):
        hot_claims = args.hot_claims or (100 if args.quick else 300)
        print(
            f"  hot path: {hot_claims} claims, {args.hot_workers} workers, runs "
            f"{args.hot_runs} ...",
            flush=True,
        )
        for ipam_ms, read_ms, write_ms in args.hot_runs:
            if args.hot_base is not None:
                interleaved = [
                    (
                        label,
                        run_hot_path(
                            hot_claims,
                            args.hot_workers,
                            latency_ms=ipam_ms,
                            api_ms=(read_ms, write_ms),
                            timeout=args.timeout,
                            profile=False,
                            source=source,
                        ),
                    )
                    for _ in range(args.hot_rounds)
                    for label, source in (("base", args.hot_base.resolve()), ("this", None))
                ]
                print("\n" + _hot_ab_table(interleaved), flush=True)
                continue
            hot = run_hot_path(
                hot_claims,
                args.hot_workers,
                latency_ms=ipam_ms,
                api_ms=(read_ms, write_ms),
                timeout=args.timeout,
                profile=not args.no_profile,
            )
            print("\n" + _hot_tables(hot), flush=True)
    if args.only in (None, "trace-release"):
        traced = args.trace_claims or (100 if args.quick else 300)
        ipam_ms, read_ms, write_ms = args.trace_latency[0]
        print(f"  release trace: {traced} claims, {args.hot_workers} workers ...", flush=True)
        trace = run_trace_release(
            traced,
            args.hot_workers,
            latency_ms=ipam_ms,
            api_ms=(read_ms, write_ms),
            timeout=args.timeout,
            source=args.hot_base.resolve() if args.hot_base is not None else None,
        )
        print("\n" + format_trace(trace), flush=True)
    if args.only in (None, "restart"):
        bound = args.restart_bound or (1000 if args.quick else 10000)
        print(f"  restart: {bound} bound claims ...", flush=True)
        print("\n" + format_restart(run_restart_bench(bound)), flush=True)
    if args.only in (None, "audit"):
        print(f"  drift audit: one pool of {args.audit_addresses} addresses ...", flush=True)
        print("\n" + format_audit(run_audit_bench(args.audit_addresses)), flush=True)
    if args.only in (None, "soak"):
        rounds = args.soak_rounds or (6 if args.quick else 24)
        print(f"  soak: {rounds} rounds of churn ...", flush=True)
        print("\n" + format_soak(run_soak_bench(rounds)), flush=True)
    if args.only in (None, "scale"):
        pools = args.scale_pools or (10 if args.quick else 100)
        print(f"  scale: {pools} pools x {args.scale_per_pool} claims ...", flush=True)
        print("\n" + format_scale(run_scale_bench(pools, args.scale_per_pool)), flush=True)
    if args.only in (None, "standby"):
        churned = args.standby_claims or (10_000 if args.quick else 100_000)
        print(f"  standby: {churned} claims churned ...", flush=True)
        runs = [("base", args.standby_base.resolve())] if args.standby_base else []
        standby = [
            run_standby_bench(churned, source=source, label=label)
            for label, source in [*runs, ("this", None)]
        ]
        print("\n" + format_standby(standby), flush=True)
    if args.only in (None, "reset"):
        rounds = 3 if args.quick else 5
        print(f"  watch reset: {rounds} resets of every watch connection ...", flush=True)
        print("\n" + format_reset(run_watch_reset_bench(rounds=rounds)), flush=True)
    print(f"\ndone in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
