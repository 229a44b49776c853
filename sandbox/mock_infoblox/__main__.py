"""Command line: ``python -m mock_infoblox --port 8443 --seed seed.yaml``."""

from __future__ import annotations

import argparse
import ssl
import sys
from collections.abc import Sequence

from aiohttp import web

from mock_infoblox.app import create_app
from mock_infoblox.store import InfobloxStore

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the mock WAPI in the foreground until interrupted.

    Parameters
    ----------
    argv:
        Arguments (default ``sys.argv[1:]``): ``--host`` (default 127.0.0.1), ``--port``
        (default 8443), ``--seed`` (YAML file, see ``seed.example.yaml``), ``--user`` and
        ``--password`` (Basic-auth account, default ``admin``/``infoblox``),
        ``--session-timeout`` (cookie lifetime in seconds), ``--tls-cert``/``--tls-key``
        (serve HTTPS).

    Returns
    -------
    int
        0 after a clean stop, 2 when the seed cannot be loaded.
    """
    parser = argparse.ArgumentParser(prog="python -m mock_infoblox", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--seed", help="YAML seed file")
    parser.add_argument("--user", default=None, help="Basic-auth user (default admin)")
    parser.add_argument("--password", default=None, help="its password (default infoblox)")
    parser.add_argument("--session-timeout", type=int, default=600, help="seconds")
    parser.add_argument("--tls-cert", help="PEM certificate chain; serve HTTPS")
    parser.add_argument("--tls-key", help="PEM private key for --tls-cert")
    args = parser.parse_args(argv)

    users = None
    if args.user or args.password:
        users = {args.user or "admin": args.password or "infoblox"}
    try:
        if args.seed:
            store = InfobloxStore.from_yaml(
                args.seed, users=users, session_timeout=args.session_timeout
            )
        else:
            store = InfobloxStore(users=users, session_timeout=args.session_timeout)
    except (OSError, ValueError) as exc:
        print(f"mock_infoblox: cannot load seed: {exc}", file=sys.stderr)
        return 2
    context = None
    if args.tls_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.tls_cert, args.tls_key)
    scheme = "https" if context else "http"
    print(f"mock Infoblox WAPI on {scheme}://{args.host}:{args.port}/wapi/v{store.wapi_version}/")
    web.run_app(create_app(store), host=args.host, port=args.port, ssl_context=context, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
