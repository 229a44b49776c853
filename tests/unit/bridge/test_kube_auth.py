"""kopf authenticates exactly like the kubernetes client (`kubeconfig.kopf_connection_info`).

For each kind of kubeconfig the kubernetes client supports (client certificate files and
inline data, token, tokenFile, exec plugins giving a token or a certificate, an OIDC auth
provider, basic auth) and in a pod (service account), a TLS API server on 127.0.0.1
records what each client presents: the ``Authorization`` header and the TLS client
certificate. The kubernetes client asks ``/version``; kopf asks it through its own login
activity, vault and request code (``@kopf.on.login`` returning `kopf_connection_info`),
as the running operator does. Both must present the same credentials, and the expected ones.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kopf
import kubernetes
import pytest
import trustme
import yaml
from kopf._cogs.clients import auth as kopf_auth
from kopf._cogs.clients import scanning
from kopf._cogs.clients.errors import APIForbiddenError
from kopf._cogs.structs.credentials import Vault
from kopf._core.engines import activities
from kubernetes.client import ApiException

from bridge.runtime import kubeconfig as kube
from bridge.runtime.gateway import AccessDeniedError, access_denied, api_status_message
from bridge.runtime.kubeconfig import authorization_header, kopf_connection_info, load_configuration

VERSION = {
    "major": "1",
    "minor": "36",
    "gitVersion": "v1.36.2",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25",
    "compiler": "gc",
    "platform": "linux/amd64",
}
FORBIDDEN = 'forbidden: User "system:anonymous" cannot get path "/version"'


# -- a TLS API server that records what clients present -----------------------------------


@dataclass(frozen=True)
class Seen:
    """What one request presented."""

    authorization: str | None
    client_cn: str | None
    user_agent: str


@dataclass
class FakeAPIServer:
    """``/version`` over TLS on 127.0.0.1; optional client certificates (signed by ``ca``)."""

    ca: trustme.CA
    seen: list[Seen] = field(default_factory=list)
    #: Decides the answer: (authorization, client CN) -> HTTP status (200, 401 or 403).
    policy: Callable[[str | None, str | None], int] = lambda authorization, cn: 200
    url: str = ""

    def __post_init__(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1").configure_cert(context)
        self.ca.configure_trust(context)
        context.verify_mode = ssl.CERT_OPTIONAL
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                peer = self.connection.getpeercert() or {}  # type: ignore[attr-defined]
                cn = next(
                    (
                        value
                        for rdn in peer.get("subject", ())
                        for key, value in rdn
                        if key == "commonName"
                    ),
                    None,
                )
                authorization = self.headers.get("Authorization")
                server.seen.append(Seen(authorization, cn, self.headers.get("User-Agent", "")))
                status = server.policy(authorization, cn)
                if status == 200:
                    body = VERSION
                else:
                    reason = {401: "Unauthorized", 403: "Forbidden"}[status]
                    body = {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": FORBIDDEN if status == 403 else "Unauthorized",
                        "reason": reason,
                        "details": {},
                        "code": status,
                    }
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def api(ca: trustme.CA) -> Iterator[FakeAPIServer]:
    server = FakeAPIServer(ca)
    yield server
    server.close()


@pytest.fixture
def pki(ca: trustme.CA, tmp_path: Path) -> dict[str, Any]:
    """The CA file, and a client certificate (CN ``alice``) as files and as PEM text."""
    leaf = ca.issue_cert("alice.example", common_name="alice")
    ca_file = tmp_path / "ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    cert_file, key_file = tmp_path / "alice.crt", tmp_path / "alice.key"
    leaf.cert_chain_pems[0].write_to_path(str(cert_file))
    leaf.private_key_pem.write_to_path(str(key_file))
    return {
        "ca_file": ca_file,
        "ca_pem": ca.cert_pem.bytes(),
        "cert_file": cert_file,
        "key_file": key_file,
        "cert_pem": leaf.cert_chain_pems[0].bytes(),
        "key_pem": leaf.private_key_pem.bytes(),
    }


def b64(data: bytes | str) -> str:
    return base64.b64encode(data if isinstance(data, bytes) else data.encode()).decode()


def write_kubeconfig(path: Path, server: str, user: dict[str, Any], cluster: dict[str, Any]) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


# -- the two clients ----------------------------------------------------------------------


def client_version(kubeconfig: str | None) -> dict[str, Any]:
    """``GET /version`` with the kubernetes client, configured as `bridge.runtime.gateway` does."""
    with kubernetes.client.ApiClient(load_configuration(kubeconfig)) as client:
        return dict(kubernetes.client.VersionApi(client).get_code().to_dict())


async def _kopf_version(kubeconfig: str | None) -> dict[str, Any]:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf_connection_info(kubeconfig)

    settings = kopf.OperatorSettings()
    settings.networking.error_backoffs = []  # no retries: a failure surfaces at once
    vault = Vault()
    token = kopf_auth.vault_var.set(vault)
    # kopf's authenticator task, as in a running operator: it logs in, and again whenever
    # a request was refused with 401 (the vault is then empty).
    authenticator = asyncio.create_task(
        activities.authenticator(
            registry=registry, settings=settings, indices={}, vault=vault, memo=kopf.Memo()
        )
    )
    try:
        return await scanning.read_version(settings=settings, logger=logging.getLogger(__name__))
    finally:
        authenticator.cancel()
        await asyncio.gather(authenticator, return_exceptions=True)
        kopf_auth.vault_var.reset(token)
        await vault.close()


def kopf_version(kubeconfig: str | None) -> dict[str, Any]:
    """``GET /version`` through kopf's login activity, credentials vault and request code."""
    return asyncio.run(asyncio.wait_for(_kopf_version(kubeconfig), timeout=30))


def presented(api: FakeAPIServer, kubeconfig: str | None) -> tuple[Seen, Seen]:
    """What the kubernetes client and kopf presented to ``api`` (one request each)."""
    assert client_version(kubeconfig)["git_version"] == VERSION["gitVersion"]
    assert kopf_version(kubeconfig)["gitVersion"] == VERSION["gitVersion"]
    client, kopf_seen = api.seen[0], api.seen[-1]
    assert client.user_agent.startswith("OpenAPI-Generator")  # the kubernetes client
    assert kopf_seen.user_agent.startswith("kopf/")
    return client, kopf_seen


def same_credentials(client: Seen, kopf_seen: Seen) -> None:
    assert (kopf_seen.authorization, kopf_seen.client_cn) == (
        client.authorization,
        client.client_cn,
    )


def read(path: Any) -> bytes:
    return Path(path).read_bytes()


# -- every kind of kubeconfig -------------------------------------------------------------


def test_client_certificate_files(api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path) -> None:
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        api.url,
        {"client-certificate": str(pki["cert_file"]), "client-key": str(pki["key_file"])},
        {"certificate-authority": str(pki["ca_file"])},
    )
    info = kopf_connection_info(path)
    assert info.server == api.url
    assert read(info.ca_path) == pki["ca_pem"]
    assert read(info.certificate_path) == pki["cert_pem"]
    assert read(info.private_key_path) == pki["key_pem"]
    assert (info.scheme, info.token, info.insecure) == (None, None, False)
    client, kopf_seen = presented(api, path)
    assert client == Seen(None, "alice", client.user_agent)
    same_credentials(client, kopf_seen)


def test_inline_client_certificate_and_ca_data(
    api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path
) -> None:
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        api.url,
        {"client-certificate-data": b64(pki["cert_pem"]), "client-key-data": b64(pki["key_pem"])},
        {"certificate-authority-data": b64(pki["ca_pem"])},
    )
    info = kopf_connection_info(path)
    # The kubernetes client writes inline data to temporary files: kopf reads the same ones.
    assert read(info.ca_path) == pki["ca_pem"]
    assert read(info.certificate_path) == pki["cert_pem"]
    assert read(info.private_key_path) == pki["key_pem"]
    client, kopf_seen = presented(api, path)
    assert (client.authorization, client.client_cn) == (None, "alice")
    same_credentials(client, kopf_seen)


def test_token(api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path) -> None:
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        api.url,
        {"token": "sa-token.abc"},
        {"certificate-authority": str(pki["ca_file"])},
    )
    info = kopf_connection_info(path)
    assert (info.scheme, info.token) == ("Bearer", "sa-token.abc")
    assert info.certificate_path is None and info.private_key_path is None
    # what the kubernetes client (v37) sends: api_key["BearerToken"], not "authorization"
    assert authorization_header(load_configuration(path)) == "Bearer sa-token.abc"
    client, kopf_seen = presented(api, path)
    assert (client.authorization, client.client_cn) == ("Bearer sa-token.abc", None)
    same_credentials(client, kopf_seen)


def test_token_file(api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-a-file\n", encoding="utf-8")
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        api.url,
        {"tokenFile": str(tmp_path / "token")},
        {"certificate-authority": str(pki["ca_file"])},
    )
    assert (kopf_connection_info(path).scheme, kopf_connection_info(path).token) == (
        "Bearer",
        "from-a-file",
    )
    client, kopf_seen = presented(api, path)
    assert client.authorization == "Bearer from-a-file"
    same_credentials(client, kopf_seen)


def exec_plugin(tmp_path: Path, status: dict[str, Any], *, counter: bool = False) -> dict[str, Any]:
    """An exec plugin (a script printing an ``ExecCredential``) and its kubeconfig section.

    With ``counter``, each run prints token ``t<run number>``.
    """
    script = tmp_path / "credential-plugin"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, pathlib, sys\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "assert info['kind'] == 'ExecCredential', info\n"
        f"status = {status!r}\n"
        f"if {counter!r}:\n"
        "    runs = pathlib.Path(sys.argv[1])\n"
        "    n = int(runs.read_text()) + 1 if runs.exists() else 1\n"
        "    runs.write_text(str(n))\n"
        "    status = {'token': f't{n}'}\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1',\n"
        "                  'kind': 'ExecCredential', 'status': status}))\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(script),
            "args": [str(tmp_path / "runs")],
            "interactiveMode": "Never",
        }
    }


def test_exec_plugin_token(api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path) -> None:
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        api.url,
        exec_plugin(tmp_path, {"token": "from-the-plugin"}),
        {"certificate-authority": str(pki["ca_file"])},
    )
    info = kopf_connection_info(path)
    assert (info.scheme, info.token) == ("Bearer", "from-the-plugin")
    client, kopf_seen = presented(api, path)
    assert client.authorization == "Bearer from-the-plugin"
    same_credentials(client, kopf_seen)


def test_exec_plugin_client_certificate(
    api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path
) -> None:
    status = {
        "clientCertificateData": pki["cert_pem"].decode(),
        "clientKeyData": pki["key_pem"].decode(),
    }
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        api.url,
        exec_plugin(tmp_path, status),
        {"certificate-authority": str(pki["ca_file"])},
    )
    info = kopf_connection_info(path)
    assert read(info.certificate_path) == pki["cert_pem"]
    assert read(info.private_key_path) == pki["key_pem"]
    assert info.token is None
    client, kopf_seen = presented(api, path)
    assert (client.authorization, client.client_cn) == (None, "alice")
    same_credentials(client, kopf_seen)


def test_kopf_logs_in_again_with_a_fresh_exec_token_after_a_401(
    api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path
) -> None:
    # an expired token: kopf's vault invalidates the credentials on 401 and runs the login
    # handler again, which runs the plugin again
    api.policy = lambda authorization, cn: 401 if authorization == "Bearer t1" else 200
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        api.url,
        exec_plugin(tmp_path, {}, counter=True),
        {"certificate-authority": str(pki["ca_file"])},
    )
    assert kopf_version(path)["gitVersion"] == VERSION["gitVersion"]
    assert [seen.authorization for seen in api.seen] == ["Bearer t1", "Bearer t2"]


def test_oidc_auth_provider(api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path) -> None:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    id_token = f"{part({'alg': 'none'})}.{part({'sub': 'alice', 'exp': 4102444800})}.sig"
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        api.url,
        {
            "auth-provider": {
                "name": "oidc",
                "config": {"id-token": id_token, "idp-issuer-url": "https://127.0.0.1:9"},
            }
        },
        {"certificate-authority": str(pki["ca_file"])},
    )
    assert kopf_connection_info(path).token == id_token
    client, kopf_seen = presented(api, path)
    assert client.authorization == f"Bearer {id_token}"
    same_credentials(client, kopf_seen)


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_basic_auth_and_insecure_skip_tls_verify(api: FakeAPIServer, tmp_path: Path) -> None:
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        api.url,
        {"username": "admin", "password": "s3cret:with colon"},
        {"insecure-skip-tls-verify": True},  # no CA: the server's certificate is not checked
    )
    info = kopf_connection_info(path)
    assert info.insecure is True and info.ca_path is None
    expected = "Basic " + b64("admin:s3cret:with colon")
    client, kopf_seen = presented(api, path)
    assert client.authorization == expected
    same_credentials(client, kopf_seen)


def test_untrusted_server_is_refused_by_both(api: FakeAPIServer, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url, {"token": "t"}, {})
    assert kopf_connection_info(path).insecure is False
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        client_version(path)
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        kopf_version(path)
    assert api.seen == []


def test_in_a_pod_the_service_account(
    api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("projected.sa.token", encoding="utf-8")
    (account / "ca.crt").write_bytes(pki["ca_pem"])
    (account / "namespace").write_text("ipam-bridge-system\n", encoding="utf-8")
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT_TOKEN", str(account / "token"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
    assert kube.in_cluster()
    info = kopf_connection_info()
    # as kopf.login_with_service_account: the token (stripped), the CA file, the namespace;
    # the server is the client's (KUBERNETES_SERVICE_HOST/PORT, not the DNS name)
    assert info.server == api.url
    assert info.ca_path == str(account / "ca.crt")
    assert info.token == "projected.sa.token"
    assert info.default_namespace == "ipam-bridge-system"
    client, kopf_seen = presented(api, None)
    assert client.authorization is not None
    assert client.authorization.lower() == "bearer projected.sa.token"
    same_credentials(client, kopf_seen)


def test_kubeconfig_environment_variable_wins_over_the_service_account(
    api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("sa", encoding="utf-8")
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT_TOKEN", str(tmp_path / "token"))
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        api.url,
        {"token": "from-kubeconfig"},
        {"certificate-authority": str(pki["ca_file"])},
    )
    monkeypatch.setenv("KUBECONFIG", path)
    info = kopf_connection_info()
    assert (info.token, info.default_namespace) == ("from-kubeconfig", None)


# -- a refused start-up: the API server's message -----------------------------------------


def test_a_403_becomes_an_error_with_the_api_servers_message(
    api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path
) -> None:
    api.policy = lambda authorization, cn: 403 if authorization is None else 200
    path = write_kubeconfig(
        tmp_path / "kubeconfig", api.url, {}, {"certificate-authority": str(pki["ca_file"])}
    )
    with pytest.raises(ApiException) as caught:
        client_version(path)
    denied = access_denied(caught.value)
    assert isinstance(denied, AccessDeniedError)
    assert denied.status == 403
    assert str(denied) == denied.message == FORBIDDEN
    # kopf is refused the same way (anonymous, like the client)
    with pytest.raises(APIForbiddenError):
        kopf_version(path)


def test_a_401_becomes_an_error_with_the_api_servers_message(
    api: FakeAPIServer, pki: dict[str, Any], tmp_path: Path
) -> None:
    api.policy = lambda authorization, cn: 401
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        api.url,
        {"token": "revoked"},
        {"certificate-authority": str(pki["ca_file"])},
    )
    with pytest.raises(ApiException) as caught:
        client_version(path)
    denied = access_denied(caught.value)
    assert denied is not None and (denied.status, str(denied)) == (401, "Unauthorized")


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, '{"kind": "Status", "message": "etcdserver: request timed out"}', None),
        (404, None, None),
        (403, "not json at all", "not json at all"),
        (403, None, "403 Forbidden"),
        (403, b'{"kind": "Status", "message": "bytes body"}', "bytes body"),
        (403, '{"kind": "Status"}', "403 Forbidden"),
    ],
)
def test_access_denied_only_for_401_and_403(
    status: int, body: str | bytes | None, message: str | None
) -> None:
    exc = ApiException(status=status, reason={403: "Forbidden"}.get(status, "Error"))
    exc.body = body  # type: ignore[assignment]
    denied = access_denied(exc)
    if message is None:
        assert denied is None
    else:
        assert denied is not None and str(denied) == message
    if status == 500:
        assert api_status_message(exc) == "etcdserver: request timed out"


def test_the_token_refresh_hook_runs_at_most_once_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(kube.time, "monotonic", lambda: now[0])
    runs: list[str] = []

    def refresh(target: kubernetes.client.Configuration) -> None:
        token = f"t{len(runs)}\n"
        runs.append(token)
        target.api_key["BearerToken"] = token
        target.refresh_api_key_hook = refresh  # as the kubeconfig loaders do

    configuration = kubernetes.client.Configuration()
    configuration.api_key["BearerToken"] = "t\n"
    configuration.refresh_api_key_hook = refresh
    kube._trim_tokens(configuration)

    assert configuration.get_api_key_with_prefix("BearerToken") == "t0"
    now[0] += 0.5
    assert configuration.get_api_key_with_prefix("BearerToken") == "t0"
    assert len(runs) == 1
    now[0] += kube.REFRESH_EVERY_SECONDS
    assert configuration.get_api_key_with_prefix("BearerToken") == "t1"
    assert configuration.get_api_key_with_prefix("BearerToken") == "t1"
    assert len(runs) == 2
