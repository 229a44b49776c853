"""Console script ``mock-phpipam``: serve the phpIPAM mock from a seed file and/or flags."""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
from collections.abc import Sequence

from aiohttp import web
from pydantic import ValidationError

from mock_phpipam.app import create_app, phpipam_faults
from mock_phpipam.store import Store

__all__ = ["build_parser", "build_store", "main"]

log = logging.getLogger("mock_phpipam")


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser of ``mock-phpipam``."""
    parser = argparse.ArgumentParser(
        prog="mock-phpipam",
        description="A phpIPAM 1.8-compatible REST API mock. Without --seed and --subnet it "
        "serves app 'capi', user Admin/ipamadmin and subnet 10.20.0.0/24 (gateway 10.20.0.1).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument("--port", type=int, default=8080, help="port (default %(default)s)")
    parser.add_argument("--seed", metavar="FILE", help="YAML or JSON seed file")
    parser.add_argument("--app-id", default=None, help="add an API app (default 'capi')")
    parser.add_argument(
        "--app-security",
        choices=("none", "ssl_token", "ssl_code"),
        default="none",
        help="app_security of --app-id (default %(default)s)",
    )
    parser.add_argument("--app-code", help="app code (token) for --app-security ssl_code")
    parser.add_argument("--username", default=None, help="add a user (default 'Admin')")
    parser.add_argument(
        "--password",
        default=None,
        help="password of --username (default 'ipamadmin'; prefer a seed file: argv is visible)",
    )
    parser.add_argument(
        "--section", default="capi", help="section of --subnet (default %(default)s)"
    )
    parser.add_argument(
        "--subnet",
        action="append",
        default=[],
        metavar="CIDR",
        help="add a subnet (repeatable)",
    )
    parser.add_argument(
        "--gateway",
        action="append",
        default=[],
        metavar="IP",
        help="gateway address; goes to the --subnet that contains it (repeatable)",
    )
    parser.add_argument(
        "--stringify-results",
        action="store_true",
        help="answer every value as a string ($api_stringify_results)",
    )
    parser.add_argument(
        "--legacy-not-found",
        action="store_true",
        help="phpIPAM <= 1.4: 'not found' is HTTP 200, success false",
    )
    parser.add_argument(
        "--latency", type=float, default=0.0, metavar="SECONDS", help="fault: delay every answer"
    )
    parser.add_argument(
        "--error-rate",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="fault: share (0..1) of requests answered 500/503",
    )
    parser.add_argument(
        "--race-rate",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="fault: share (0..1) of first_free POSTs lost to a race",
    )
    parser.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate chain")
    parser.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    parser.add_argument("--log-level", default="INFO", help="logging level (default %(default)s)")
    return parser


def build_store(args: argparse.Namespace) -> Store:
    """Build the store from parsed arguments: the seed file, then the flags on top.

    Raises
    ------
    ValueError, OSError, pydantic.ValidationError
        When the seed file or a flag is invalid.
    """
    store = Store.from_file(args.seed) if args.seed else Store()
    defaults = not args.seed and not args.subnet
    app_id = args.app_id or ("capi" if defaults or not store.apps else None)
    if app_id:
        store.add_app(app_id, security=args.app_security, code=args.app_code)
    username = args.username or ("Admin" if defaults or not store.users else None)
    if username:
        store.add_user(username, args.password or "ipamadmin")
    subnets = list(args.subnet) or (["10.20.0.0/24"] if defaults else [])
    gateways = list(args.gateway) or (["10.20.0.1"] if defaults else [])
    if subnets:
        section = store.add_section(args.section)
        created = [store.add_subnet(cidr, section_id=section.id) for cidr in subnets]
        for gateway in gateways:
            target = next((s for s in created if _contains(s.cidr, gateway)), None)
            if target is None:
                raise ValueError(f"--gateway {gateway} is in none of the --subnet networks")
            store.add_address(target.id, gateway, is_gateway=True, description="gateway")
    store.settings.stringify_results |= args.stringify_results
    store.settings.legacy_not_found |= args.legacy_not_found
    return store


def _contains(cidr: str, ip: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(ip) in ipaddress.ip_network(cidr)
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``mock-phpipam`` until SIGINT/SIGTERM; returns the exit status (2 on bad input)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        store = build_store(args)
        faults = phpipam_faults(
            latency_seconds=args.latency, error_rate=args.error_rate, race_rate=args.race_rate
        )
    except (OSError, ValueError, ValidationError) as exc:
        print(f"mock-phpipam: {exc}", file=sys.stderr)
        return 2
    context = None
    if args.tls_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.tls_cert, args.tls_key)
    scheme = "https" if context else "http"
    log.info(
        "serving phpIPAM API at %s://%s:%d/api/<app_id>/ (apps: %s; users: %s; subnets: %s)",
        scheme,
        args.host,
        args.port,
        ", ".join(sorted(store.apps)),
        ", ".join(u.username for u in store.users.values()),
        ", ".join(f"{s.id}={s.cidr}" for s in store.subnets.values()),
    )
    web.run_app(
        create_app(store, faults),
        host=args.host,
        port=args.port,
        ssl_context=context,
        print=None,
        access_log=log,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
