"""Fixtures shared by the backend tests."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import trustme

#: Starts a TLS server on 127.0.0.1 whose GETs are answered with ``answer(path)`` (a JSON
#: body); returns its ``https://127.0.0.1:<port>`` URL and the PEM of the CA that signed it.
StartTLSServer = Callable[[Callable[[str], bytes]], tuple[str, str]]


@pytest.fixture
def tls_server() -> Iterator[StartTLSServer]:
    """Start TLS servers with a trustme certificate for 127.0.0.1 (stopped after the test)."""
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Callable[[str], bytes]) -> tuple[str, str]:
        ca = trustme.CA()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = answer(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert("127.0.0.1").configure_cert(context)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"https://127.0.0.1:{server.server_address[1]}", ca.cert_pem.bytes().decode()

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
