"""``ipam-bridge run | demo | version``: the command line of the operator."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from bridge import __version__
from bridge.settings import Settings

__all__ = ["LOG_REFKEY", "ObjectRefFilter", "main", "run_operator"]

#: The key of the object reference (``{apiVersion, kind, namespace, name, uid}``) in JSON logs.
LOG_REFKEY = "object"


def _handler_object_ref() -> Mapping[str, Any] | None:
    """Return the reference of the object whose kopf handler runs in this context, or None.

    kopf keeps the cause of the running handler in a context variable
    (``kopf._core.actions.execution.cause_var``, copied into the threads of sync handlers);
    its logger carries ``extra["k8s_ref"]``, the reference kopf's formatters print.
    """
    try:
        from kopf._core.actions.execution import cause_var
    except ImportError:  # a kopf without it: lines keep the names in their text only
        return None
    cause = cause_var.get(None)
    extra = getattr(getattr(cause, "logger", None), "extra", None) or {}
    ref = extra.get("k8s_ref")
    return ref if isinstance(ref, Mapping) else None


class ObjectRefFilter(logging.Filter):
    """Give log records emitted inside a kopf handler the handled object's reference.

    kopf's own per-object lines carry ``k8s_ref``; lines of our modules and the backend
    clients (``bridge.claims``, ``backends.phpipam``...) logged while a handler runs get the
    same reference, so every line about a claim or pool names it (``[ns/name]`` prefix in
    text, the ``object`` key in JSON). It also copies the logger name to ``record.logger``,
    which the JSON formatter prints as an extra field (text lines show ``%(name)s``).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Add ``k8s_ref`` (when missing and a handler runs) and ``logger``; keep the record."""
        if not hasattr(record, "k8s_ref"):
            ref = _handler_object_ref()
            if ref is not None:
                record.k8s_ref = dict(ref)
        if not hasattr(record, "logger"):
            record.logger = record.name
        return True


_OBJECT_REF_FILTER = ObjectRefFilter()


def _configure_logging(settings: Settings) -> None:
    """Set up logging through kopf's configurator (``kopf.configure``).

    ``text``: kopf's full format with an ``[<namespace>/<name>]`` prefix on the lines of a
    claim or pool. ``json``: one JSON object per line (python-json-logger via kopf's
    ``ObjectJsonFormatter``) with ``message``, ``severity``, ``timestamp``, and, on the lines
    of a claim or pool, ``object`` (its apiVersion, kind, namespace, name, uid).
    Libraries that could print request details stay at WARNING.
    """
    json_logs = settings.log_format == "json"
    kopf.configure(
        debug=settings.log_level == "DEBUG",
        verbose=settings.log_level in ("DEBUG", "INFO"),
        quiet=settings.log_level in ("WARNING", "ERROR"),
        log_format=kopf.LogFormat.JSON if json_logs else kopf.LogFormat.FULL,
        log_prefix=not json_logs,
        log_refkey=LOG_REFKEY if json_logs else None,
    )
    root = logging.getLogger()
    root.setLevel(settings.log_level)
    for handler in root.handlers:
        handler.addFilter(_OBJECT_REF_FILTER)
    # urllib3 logs request lines (with query strings) at DEBUG, and the kubernetes package
    # logs through "client" when its debug switch is on; keep both quiet. The liveness
    # endpoint would log an access line and an "Activity succeeded" line per probe.
    for name in ("urllib3", "client", "aiohttp.access", "kopf.activities.probe"):
        logging.getLogger(name).setLevel(logging.WARNING)


def run_operator(
    namespaces: Sequence[str] = (),
    *,
    all_namespaces: bool = False,
    standalone: bool | None = None,
    liveness: str | None = None,
) -> None:
    """Run the operator in this process until SIGTERM or SIGINT (kopf stops gracefully).

    Parameters
    ----------
    namespaces:
        Namespaces to serve; empty takes ``IPAM_BRIDGE_NAMESPACE`` (empty there too: all
        namespaces, cluster-wide). Claims and pools elsewhere are not watched at all.
    all_namespaces:
        Serve all namespaces even when ``IPAM_BRIDGE_NAMESPACE`` names some.
    standalone:
        Skip kopf peering (one replica); None takes ``IPAM_BRIDGE_STANDALONE``.
    liveness:
        kopf liveness endpoint URL; None builds ``http://0.0.0.0:<port>/healthz`` from
        ``IPAM_BRIDGE_HEALTH_PORT`` (0: no endpoint).

    Raises
    ------
    pydantic.ValidationError
        When an ``IPAM_BRIDGE_*`` variable is invalid.
    """
    import bridge.handlers  # noqa: F401  (registers the handlers)

    if namespaces or all_namespaces:
        # The start-up handler reads the settings again (pool refresher scope): pass the
        # scope through the environment it reads.
        os.environ["IPAM_BRIDGE_NAMESPACE"] = "" if all_namespaces else ",".join(namespaces)
    settings = Settings()
    _configure_logging(settings)
    if liveness is None and settings.health_port:
        liveness = f"http://0.0.0.0:{settings.health_port}/healthz"
    standalone = settings.standalone if standalone is None else standalone
    kopf.run(
        standalone=standalone,
        # kopf makes peering mandatory when a peering name is given, and a standalone
        # operator has no peering resources: it would stay paused ("peering CRD is missing").
        peering_name=None if standalone else settings.peering_name,
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
    run = sub.add_parser(
        "run", help="run the operator against the current kubeconfig or in-cluster service account"
    )
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="serve only this namespace (repeatable)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="serve all namespaces (the default)"
    )
    run.add_argument(
        "--standalone",
        action="store_true",
        default=None,
        help="no peering: do not wait for other replicas",
    )
    run.add_argument(
        "--liveness",
        default=None,
        help="liveness endpoint URL (default http://0.0.0.0:$IPAM_BRIDGE_HEALTH_PORT/healthz)",
    )
    demo = sub.add_parser(
        "demo",
        help="show the whole flow on this machine: mock IPAM, "
        "in-memory Kubernetes API, the real operator",
    )
    demo.add_argument("--claims", type=int, default=10, help="claims to create (default 10)")
    demo.add_argument(
        "--backend",
        choices=("phpipam", "infoblox"),
        default="phpipam",
        help="which mock IPAM to run (default phpipam)",
    )
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
    run_operator(
        args.namespace,
        all_namespaces=args.all_namespaces,
        standalone=args.standalone,
        liveness=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
