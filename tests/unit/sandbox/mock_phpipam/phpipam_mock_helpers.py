"""Shared test data and helpers of the mock_phpipam tests: the clean-state seed and a client."""

from __future__ import annotations

import re
from typing import Any

import requests

from mock_phpipam import MockPhpipamServer

# The clean state of the recorded server (phpipam-api.md, "Test data"): section 3, subnets
# 7-12, gateway 10.20.0.1 = address id 11, so the next address id is 12 as in the transcripts.
SEED: dict[str, Any] = {
    "users": [{"username": "Admin", "password": "ipamadmin"}],
    "apps": [
        {"id": "capi", "permissions": 2, "security": "none"},
        {"id": "capiadm", "permissions": 3, "security": "none"},
        {"id": "capissl", "permissions": 2, "security": "ssl_token"},
        {"id": "capiro", "permissions": 1, "security": "none"},
        {
            "id": "capicode",
            "permissions": 2,
            "security": "ssl_code",
            "code": "static-app-code-0123",
        },
    ],
    "sections": [
        {
            "id": 3,
            "name": "capi-test",
            "subnets": [
                {
                    "id": 7,
                    "cidr": "10.20.0.0/24",
                    "description": "capi v4 test",
                    "addresses": [
                        {
                            "id": 11,
                            "ip": "10.20.0.1",
                            "hostname": "gw.capi-test",
                            "description": "gateway",
                            "is_gateway": True,
                        }
                    ],
                },
                {"id": 8, "cidr": "2001:db8:20::/64", "description": "capi v6 test"},
                {"id": 9, "cidr": "10.20.1.0/30", "description": "capi tiny /30"},
                {"id": 10, "cidr": "10.20.2.0/24", "description": "capi nolock"},
                {"id": 11, "cidr": "10.20.3.0/24", "description": "capi mysql"},
                {"id": 12, "cidr": "10.20.4.0/28", "description": "capi exhaustion"},
            ],
        }
    ],
}

TIME_RE = re.compile(rb'"time":[0-9.]+')


def normalise(body: bytes) -> bytes:
    """Blank out what differs between two runs: ``time``, token values, expiry stamps."""
    body = TIME_RE.sub(b'"time":0', body)
    body = re.sub(rb'"token":"[A-Za-z0-9_-]{24}"', b'"token":"TOKEN"', body)
    return re.sub(rb'"expires":"[0-9: -]{19}"', b'"expires":"EXPIRES"', body)


class Api:
    """A tiny client for one app of the mock (tests only)."""

    def __init__(self, server: MockPhpipamServer, app: str = "capi") -> None:
        self.server = server
        self.base = server.app_url(app)
        self.session = requests.Session()
        self.token: str | None = None

    def login(self, user: str = "Admin", password: str = "ipamadmin") -> str:
        response = self.session.post(f"{self.base}/user/", auth=(user, password), timeout=5)
        assert response.status_code == 200, response.text
        self.token = response.json()["data"]["token"]
        return self.token

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = dict(kwargs.pop("headers", {}))
        if self.token is not None:
            headers.setdefault("token", self.token)
        kwargs.setdefault("timeout", 5)
        return self.session.request(method, f"{self.base}{path}", headers=headers, **kwargs)
