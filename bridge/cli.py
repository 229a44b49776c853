"""``ipam-bridge run | demo | audit | check-pool | version``: the command line of the operator.

``run`` never fails silently: the ports it must listen on and the Kubernetes configuration
are checked before kopf starts (`check_ports`, `check_configuration`), and a failed start-up
(a port, no usable kubeconfig or service account, a ``kopf.PermanentError`` of the start-up
handler, a 401/403 of kopf's first requests) ends the process with one line on stderr and
exit code 1; so does a lost leader Lease (``IPAM_BRIDGE_LEADER_ELECTION``, `bridge.runtime.leader`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import kopf
import kubernetes

from bridge import __version__
from bridge.metrics import PortUnavailableError, check_port
from bridge.runtime import logcontext
from bridge.runtime.gateway import AccessDeniedError
from bridge.runtime.kubeconfig import SERVICE_ACCOUNT_TOKEN, in_cluster, load_configuration
from bridge.runtime.leader import LeadershipLostError, OperatorStop
from bridge.settings import Settings, deprecated_names_used

__all__ = [
    "DEPRECATED_PEERING",
    "LOG_REFKEY",
    "ConfigurationError",
    "ObjectRefFilter",
    "StartupError",
    "build_parser",
    "check_configuration",
    "check_ports",
    "main",
    "run_operator",
]

log = logging.getLogger(__name__)

#: The key of the object reference (``{apiVersion, kind, namespace, name, uid}``) in JSON logs.
LOG_REFKEY = "object"


class ObjectRefFilter(logging.Filter):
    """Give log records emitted while an object is reconciled that object's reference.

    kopf's own per-object lines carry ``k8s_ref``; lines of our modules and the backend
    clients (``claims``, ``backends.phpipam``...) logged inside a reconcile of the work queue
    get the same reference from `bridge.runtime.logcontext`, so every line about a claim or
    pool names it (``[ns/name]`` prefix in text, the ``object`` key in JSON). It also copies
    the logger name to ``record.logger``, which the JSON formatter prints as an extra field
    (text lines show ``%(name)s``).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Add ``k8s_ref`` (when missing and a reconcile runs) and ``logger``; keep the record."""
        if not hasattr(record, "k8s_ref"):
            ref = logcontext.current()
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
    Libraries that could print request details stay at WARNING, and so do kopf's
    per-object lines (one "succeeded" line per handler and watch event) unless the level is
    DEBUG.
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
    # The official leader election logs every try at INFO; `bridge.runtime.leader` logs the changes.
    for name in ("urllib3", "client", "aiohttp.access", "kopf.activities.probe", "leaderelection"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # kopf logs "Handler '...' succeeded." at INFO for every watch event of every claim,
    # IPAddress, pool and Cluster (kopf/_core/actions/execution.py): per-event CPU on the
    # hot path and no news. Its per-object lines stay visible from WARNING up, all at DEBUG.
    logging.getLogger("kopf.objects").setLevel(
        logging.NOTSET if settings.log_level == "DEBUG" else logging.WARNING
    )


#: The message logged (once per process) when a deprecated peering option is given.
DEPRECATED_PEERING = (
    "%s: deprecated and ignored: ipam-bridge always runs without kopf peering "
    "(leader election on a Lease replaces it: IPAM_BRIDGE_LEADER_ELECTION)"
)
_warned_deprecated: set[str] = set()


class StartupError(RuntimeError):
    """kopf's start-up activity failed: the message joins what the failed handlers raised."""


def _liveness_host_port(endpoint: str) -> tuple[str, int]:
    """Return the host and port kopf's liveness server binds for ``endpoint``.

    The same defaults as kopf's ``health_reporter`` (``kopf/_core/engines/probing.py``):
    host ``localhost``, port 80.
    """
    parts = urllib.parse.urlsplit(endpoint)
    return parts.hostname or "localhost", parts.port or 80


def check_ports(settings: Settings, liveness: str | None, *, liveness_setting: str) -> None:
    """Check that the metrics and liveness ports can be bound, before kopf starts.

    kopf serves its liveness endpoint from a background task: a port it cannot bind would
    fail there while the operator runs on half-started; the metrics server starts in the
    start-up handler, which kopf retries every 60 s. Checking both here stops the process
    at once instead.

    Parameters
    ----------
    settings:
        ``metrics_address`` and ``metrics_port`` (0: no metrics endpoint).
    liveness:
        kopf's liveness endpoint URL, or None (no endpoint).
    liveness_setting:
        What chose the liveness URL (``IPAM_BRIDGE_HEALTH_PORT`` or ``--liveness``).

    Raises
    ------
    PortUnavailableError
        The first port that cannot be bound, naming the address, port and setting.
    """
    check_port(
        settings.metrics_port,
        settings.metrics_address,
        purpose="metrics",
        setting="IPAM_BRIDGE_METRICS_PORT",
    )
    if liveness:
        host, port = _liveness_host_port(liveness)
        check_port(port, host, purpose="health", setting=liveness_setting)


class ConfigurationError(RuntimeError):
    """No usable Kubernetes client configuration: the message names what was tried."""


def check_configuration() -> None:
    """Load the Kubernetes client configuration as the operator will, before kopf starts.

    The same loaders as the operator's client and kopf's login
    (`bridge.runtime.kubeconfig.load_configuration`): ``$KUBECONFIG``, else the pod's
    service account, else ``~/.kube/config``. Without this check kopf's start-up activity
    fails with the loader's error and kopf retries it every 60 s, with a traceback each
    time. An exec plugin of the kubeconfig runs once more for the check.

    Raises
    ------
    ConfigurationError
        When no configuration loads: one line naming where it looked (``KUBECONFIG``, the
        service account token, ``~/.kube/config``) and the loader's reason. It never
        carries a token (the loaders' messages name files and keys, not their values).
    """
    try:
        load_configuration()
    except Exception as exc:  # the loaders raise ConfigException, yaml, OS and type errors
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigurationError(_configuration_problem(reason)) from None


def _configuration_problem(reason: str) -> str:
    """Return the line of `ConfigurationError`: what `load_configuration` tried, and why not."""
    given = os.environ.get("KUBECONFIG")
    if given:
        where = f"KUBECONFIG ({given})"
    elif in_cluster():
        where = f"the in-cluster service account ({SERVICE_ACCOUNT_TOKEN})"
    else:
        default = Path(kubernetes.config.KUBE_CONFIG_DEFAULT_LOCATION).expanduser()
        if not default.exists():
            return (
                "no Kubernetes configuration: tried KUBECONFIG (not set), the in-cluster "
                f"service account ({SERVICE_ACCOUNT_TOKEN}: not found) and ~/.kube/config "
                f"({default}: not found)"
            )
        where = f"~/.kube/config ({default})"
    return f"cannot load the Kubernetes configuration from {where}: {reason}"


def _warn_deprecated(names: Iterable[str]) -> None:
    """Log `DEPRECATED_PEERING` for the names not warned about yet in this process."""
    new = [name for name in names if name not in _warned_deprecated]
    if new:
        _warned_deprecated.update(new)
        log.warning(DEPRECATED_PEERING, ", ".join(new))


def run_operator(
    namespaces: Sequence[str] = (),
    *,
    all_namespaces: bool = False,
    standalone: bool | None = None,
    liveness: str | None = None,
) -> None:
    """Run the operator in this process until SIGTERM or SIGINT (kopf stops gracefully).

    kopf always runs standalone (no kopf peering): with a peering name kopf waits for a
    ``ClusterKopfPeering`` object and, in a cluster that has kopf's peering CRDs but not that
    object, serves nothing and says nothing.

    Parameters
    ----------
    namespaces:
        Namespaces to serve; empty takes ``IPAM_BRIDGE_NAMESPACE`` (empty there too: all
        namespaces, cluster-wide). Claims and pools elsewhere are not watched at all.
    all_namespaces:
        Serve all namespaces even when ``IPAM_BRIDGE_NAMESPACE`` names some.
    standalone:
        Deprecated and ignored (``--standalone``): True or False logs a warning once.
        ``IPAM_BRIDGE_STANDALONE`` and ``IPAM_BRIDGE_PEERING_NAME`` are ignored the same way.
    liveness:
        kopf liveness endpoint URL; None builds ``http://0.0.0.0:<port>/healthz`` from
        ``IPAM_BRIDGE_HEALTH_PORT`` (0: no endpoint).

    Raises
    ------
    pydantic.ValidationError
        When an ``IPAM_BRIDGE_*`` variable is invalid.
    PortUnavailableError
        When the metrics or liveness port cannot be bound (before kopf starts).
    ConfigurationError
        When no Kubernetes client configuration loads (before kopf starts,
        `check_configuration`).
    StartupError
        When kopf's start-up activity failed (e.g. a ``kopf.PermanentError`` of the start-up
        handler: CAPI's CRDs not served, access denied by the API server).
    bridge.runtime.gateway.AccessDeniedError
        When the API server refused one of kopf's own requests with 401 or 403 (e.g. its
        first list of claims or pools: missing RBAC); the message is the API server's.
    bridge.runtime.leader.LeadershipLostError
        When this replica led and could not renew the leader Lease within the deadline (it
        stopped handling at once; kopf stopped gracefully).
    """
    import bridge.handlers  # noqa: F401  (registers the handlers)

    if namespaces or all_namespaces:
        # The start-up handler reads the settings again (pool refresher scope): pass the
        # scope through the environment it reads.
        os.environ["IPAM_BRIDGE_NAMESPACE"] = "" if all_namespaces else ",".join(namespaces)
    settings = Settings()
    _configure_logging(settings)
    deprecated = [
        name
        for name, given in (
            ("--standalone", standalone is not None),
            ("IPAM_BRIDGE_STANDALONE", "standalone" in settings.model_fields_set),
            ("IPAM_BRIDGE_PEERING_NAME", "peering_name" in settings.model_fields_set),
        )
        if given
    ]
    _warn_deprecated(deprecated)
    for warning in deprecated_names_used(os.environ):
        log.warning("%s", warning)
    liveness_setting = "--liveness" if liveness else "IPAM_BRIDGE_HEALTH_PORT"
    if liveness is None and settings.health_port:
        liveness = f"http://0.0.0.0:{settings.health_port}/healthz"
    check_ports(settings, liveness, liveness_setting=liveness_setting)
    check_configuration()
    # How the start-up handler's leader election stops kopf when the Lease is lost.
    stop = OperatorStop()
    try:
        kopf.run(
            # No kopf peering, ever (see above); peering_name=None: kopf would make peering
            # mandatory whenever a name is given.
            standalone=True,
            peering_name=None,
            namespaces=list(settings.namespaces),
            clusterwide=not settings.namespaces,
            liveness_endpoint=liveness,
            stop_flag=stop.flag,
            memo=kopf.Memo(operator_stop=stop),
        )
    except Exception as exc:
        failed = _activity_failures(exc)
        if failed is not None:
            raise StartupError("; ".join(failed) or str(exc)) from exc
        denied = _kopf_access_denied(exc)
        if denied is not None:
            raise denied from exc
        raise
    finally:
        stop.returned = True
    if stop.reason is not None:
        raise LeadershipLostError(stop.reason)


def _kopf_access_denied(exc: BaseException) -> AccessDeniedError | None:
    """Return an `AccessDeniedError` for a 401/403 of kopf's own requests, else None.

    kopf ends ``kopf.run`` with its ``APIForbiddenError`` (``kopf/_cogs/clients/errors.py``,
    not exported) when its first list of a watched resource is refused (RBAC); its
    ``message`` is the API server's ``Status`` message.
    """
    try:
        from kopf._cogs.clients.errors import APIError
    except ImportError:  # a kopf without it: the error propagates as it is
        return None
    if isinstance(exc, APIError) and exc.status in (401, 403):
        return AccessDeniedError(exc.status, exc.message or str(exc))
    return None


def _activity_failures(exc: BaseException) -> list[str] | None:
    """Return the messages of the failed handlers of a kopf ``ActivityError``, else None.

    kopf raises ``kopf._core.engines.activities.ActivityError`` (not exported) out of
    ``kopf.run`` when a start-up handler failed for good; its ``outcomes`` map handler ids
    to outcomes whose ``exception`` is what the handler raised.
    """
    outcomes = getattr(exc, "outcomes", None)
    if type(exc).__name__ != "ActivityError" or not isinstance(outcomes, Mapping):
        return None
    return [
        str(outcome.exception)
        for outcome in outcomes.values()
        if getattr(outcome, "exception", None) is not None
    ]


def _add_check_pool(sub: Any) -> None:
    """Add the ``check-pool`` sub-command to ``sub`` (argparse's sub-parsers action)."""
    check = sub.add_parser(
        "check-pool",
        help="check a pool file against its IPAM, read-only, no cluster needed "
        "(exit 0 Ready, 1 not Ready, 2 usage error)",
    )
    check.add_argument("-f", "--filename", required=True, type=Path, help="YAML file of the pool")
    check.add_argument(
        "--secret", type=Path, default=None, help="YAML file of the credentials Secret"
    )
    check.add_argument("--username", default=None, help="IPAM user (with --password-stdin)")
    check.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from the first line of standard input",
    )
    check.add_argument(
        "--ca-file", type=Path, default=None, help="PEM bundle to trust (spec.tls.caSecretRef)"
    )
    check.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="namespace of a namespaced pool whose file names none (default: the kubeconfig "
        "context's namespace, else default, as kubectl)",
    )
    check.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="default text"
    )


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``ipam-bridge`` and its sub-commands."""
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
        help="deprecated and ignored: the operator always runs without kopf peering",
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
    audit = sub.add_parser(
        "audit",
        help="compare the pools' IPAddresses with their IPAM entries, read-only "
        "(exit 0 in sync, 1 drift found, 2 error)",
    )
    audit.add_argument(
        "-n", "--namespace", default=None, help="audit only the pools of this namespace"
    )
    audit.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help="output format (default table)",
    )
    _add_check_pool(sub)
    sub.add_parser("version", help="print the version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ipam-bridge`` console script; return the exit code.

    ``run`` returns 1 with one line on stderr (``ipam-bridge: <message>``) when a port
    cannot be bound, no Kubernetes configuration loads (`check_configuration`), kopf's
    start-up failed, the API server refused kopf's requests (401/403) or the leader Lease
    was lost; 0 after a clean stop (SIGTERM, SIGINT).
    ``audit`` returns 0 in sync, 1 when drift was found, 2 when it could not audit
    (`audit.run_cli`). ``check-pool`` returns 0 when the pool would be Ready, 1 when
    not, 2 for a usage error (`bridge.check_pool.run_cli`); argparse's own usage errors exit 2.
    """
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(__version__)
        return 0
    if args.command == "audit":
        from bridge.reconcilers.audit import run_cli

        return run_cli(args.namespace, args.output)
    if args.command == "check-pool":
        from bridge.check_pool import run_cli as check_pool

        return check_pool(
            args.filename,
            secret_path=args.secret,
            username=args.username,
            password_stdin=sys.stdin if args.password_stdin else None,
            ca_path=args.ca_file,
            namespace=args.namespace,
            output=args.output,
            out=sys.stdout,
            err=sys.stderr,
        )
    if args.command == "demo":
        from bridge.demo import run_demo

        return run_demo(claims=args.claims, backend=args.backend)
    try:
        run_operator(
            args.namespace,
            all_namespaces=args.all_namespaces,
            standalone=args.standalone,
            liveness=args.liveness,
        )
    except (PortUnavailableError, ConfigurationError) as exc:
        print(f"ipam-bridge: {exc}", file=sys.stderr)
        return 1
    except StartupError as exc:
        print(f"ipam-bridge: start-up failed: {exc}", file=sys.stderr)
        return 1
    except AccessDeniedError as exc:
        print(f"ipam-bridge: the API server refused: {exc}", file=sys.stderr)
        return 1
    except LeadershipLostError as exc:
        print(f"ipam-bridge: {exc}; exiting", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
