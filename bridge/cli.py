"""``ipam-bridge run | demo | version``: the command line of the operator."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import kopf

from bridge import __version__
from bridge.settings import Settings

__all__ = ["main", "run_operator"]


def _configure_logging(settings: Settings) -> None:
    """Set up logging through kopf's configurator (text, or JSON with object references)."""
    kopf.configure(
        debug=settings.log_level == "DEBUG",
        verbose=settings.log_level in ("DEBUG", "INFO"),
        quiet=settings.log_level in ("WARNING", "ERROR"),
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL,
        log_refkey="object" if settings.log_format == "json" else None,
    )
    logging.getLogger().setLevel(settings.log_level)
    # urllib3 logs request lines (with query strings) at DEBUG; keep it quiet.
    logging.getLogger("urllib3").setLevel(logging.WARNING)


def run_operator(
    namespaces: Sequence[str] = (),
    *,
    standalone: bool | None = None,
    liveness: str | None = None,
) -> None:
    """Run the operator in this process until SIGTERM or SIGINT.

    Parameters
    ----------
    namespaces:
        Namespaces to serve; empty serves all (cluster-wide).
    standalone:
        Skip kopf peering (one replica); None takes ``IPAM_BRIDGE_STANDALONE``.
    liveness:
        kopf liveness endpoint URL; None builds it from ``IPAM_BRIDGE_HEALTH_PORT``.
    """
    import bridge.handlers  # noqa: F401  (registers the handlers)

    settings = Settings()
    if namespaces:
        os.environ["IPAM_BRIDGE_NAMESPACE"] = ",".join(namespaces)
        settings = Settings()
    _configure_logging(settings)
    if liveness is None and settings.health_port:
        liveness = f"http://0.0.0.0:{settings.health_port}/healthz"
    standalone = settings.standalone if standalone is None else standalone
    kopf.run(
        standalone=standalone,
        peering_name=settings.peering_name,
        namespaces=list(settings.namespaces),
        clusterwide=not settings.namespaces,
        liveness_endpoint=liveness,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ipam-bridge",
        description="Cluster API IPAM provider backed by phpIPAM and Infoblox NIOS.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator against the current kubeconfig "
                                     "or in-cluster service account")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[],
                       help="serve only this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="serve all namespaces (the default)")
    run.add_argument("--standalone", action="store_true", default=None,
                     help="no peering: do not wait for other replicas")
    run.add_argument("--liveness", default=None,
                     help="liveness endpoint URL (default http://0.0.0.0:$IPAM_BRIDGE_HEALTH_PORT/healthz)")
    demo = sub.add_parser("demo", help="show the whole flow on this machine: mock IPAM, "
                                       "in-memory Kubernetes API, the real operator")
    demo.add_argument("--claims", type=int, default=10, help="claims to create (default 10)")
    demo.add_argument("--backend", choices=("phpipam", "infoblox"), default="phpipam",
                      help="which mock IPAM to run (default phpipam)")
    sub.add_parser("version", help="print the version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ipam-bridge`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "version":
        print(__version__)
        return 0
    if args.command == "demo":
        from bridge.demo import run_demo

        return run_demo(claims=args.claims, backend=args.backend)
    namespaces = [] if args.all_namespaces else args.namespace
    run_operator(namespaces, standalone=args.standalone, liveness=args.liveness)
    return 0


if __name__ == "__main__":
    sys.exit(main())
