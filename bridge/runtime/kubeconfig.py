"""Where the operator's Kubernetes client configuration comes from.

A kubeconfig (``$KUBECONFIG`` or the ``--kubeconfig`` path), else the pod's service account,
else ``~/.kube/config``, for both the ``kubernetes`` client and kopf's own API client
(https://kubernetes.io/docs/tasks/run-application/access-api-from-pod/).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, Final, cast

import kopf
import kubernetes

__all__ = [
    "SERVICE_ACCOUNT_TOKEN",
    "authorization_header",
    "context_namespace",
    "in_cluster",
    "kopf_connection_info",
    "load_configuration",
    "service_account_file",
    "service_account_namespace",
]

log = logging.getLogger(__name__)

#: The service account token a pod gets; ``ca.crt`` and ``namespace`` lie beside it
#: (https://kubernetes.io/docs/tasks/run-application/access-api-from-pod/).
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def in_cluster() -> bool:
    """Return True when running in a pod with a service account and no explicit kubeconfig."""
    return "KUBECONFIG" not in os.environ and bool(os.path.exists(SERVICE_ACCOUNT_TOKEN))


def load_configuration(kubeconfig: str | None = None) -> kubernetes.client.Configuration:
    """Return the client configuration of the current cluster.

    Parameters
    ----------
    kubeconfig:
        A kubeconfig file; None reads ``$KUBECONFIG`` *now* (the kubernetes package reads it
        only at import time), else the in-cluster service account, else ``~/.kube/config``.
    """
    configuration = kubernetes.client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        kubernetes.config.load_kube_config(
            config_file=path.split(os.pathsep)[0], client_configuration=configuration
        )
    elif in_cluster():
        # load_incluster_config() with the files named here (its own constants are the
        # same paths): the token is read again every minute through the configuration's
        # refresh hook, so a rotated (projected) token is picked up.
        kubernetes.config.incluster_config.InClusterConfigLoader(
            token_filename=SERVICE_ACCOUNT_TOKEN,
            cert_filename=service_account_file("ca.crt"),
        ).load_and_set(configuration)
    else:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    _trim_tokens(configuration)
    return configuration


def _strip_api_keys(configuration: kubernetes.client.Configuration) -> None:
    for key in ("BearerToken", "authorization"):
        value = configuration.api_key.get(key)
        if isinstance(value, str):
            configuration.api_key[key] = value.strip()


#: Seconds between two runs of the client configuration's token refresh hook.
REFRESH_EVERY_SECONDS: Final = 1.0


def _trim_tokens(configuration: kubernetes.client.Configuration) -> None:
    """Strip the whitespace around the token the client sends; refresh it at most once a second.

    The kubernetes package reads ``tokenFile`` and the service account token unstripped (a
    trailing newline makes every request fail with ``Invalid header value``; client-go trims
    them). Its ``refresh_api_key_hook`` runs before every request, writes the untrimmed
    token back and rewrites every connection setting (a large share of a request's CPU),
    while the loaders only load a token again once it expired: the hook is wrapped to trim,
    and to run at most once every `REFRESH_EVERY_SECONDS` (a new token goes out at most that
    much later). The loaders install their hook anew at each refresh: the wrapper stays first.
    """
    refresh = configuration.refresh_api_key_hook
    if refresh is not None:
        lock = threading.Lock()
        last: list[float] = []  # when the hook last ran (monotonic seconds)

        def refresh_and_trim(target: kubernetes.client.Configuration) -> None:
            nonlocal refresh
            if last and time.monotonic() - last[0] < REFRESH_EVERY_SECONDS:
                return  # the common case, without the lock
            with lock:
                now = time.monotonic()
                if last and now - last[0] < REFRESH_EVERY_SECONDS:
                    return
                last[:] = [now]
                refresh(target)
                # The loaders install their hook again at each refresh: keep ours in front.
                again = target.refresh_api_key_hook
                if again is not None and again is not refresh_and_trim:
                    refresh = again
                    target.refresh_api_key_hook = refresh_and_trim
                _strip_api_keys(target)

        configuration.refresh_api_key_hook = refresh_and_trim
    _strip_api_keys(configuration)


def context_namespace(kubeconfig: str | None = None) -> str:
    """Return the namespace kubectl puts an object without one in: the context's, else default.

    The namespace of the current context of the kubeconfig (``kubeconfig``, else the first
    file of ``$KUBECONFIG``, else ``~/.kube/config``), as ``kubectl apply -f`` uses it
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/namespaces/); ``default``
    when there is no kubeconfig, no current context or no namespace in it. Never raises: a
    kubeconfig that cannot be read gives ``default`` too.
    """
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    try:
        _, current = kubernetes.config.list_kube_config_contexts(
            config_file=path or os.path.expanduser("~/.kube/config")
        )
    except Exception:  # no file, not YAML, no current context: kubectl's default
        return "default"
    context = (current or {}).get("context") or {}
    return str(context.get("namespace") or "default")


def service_account_file(name: str) -> str:
    """Return the path of ``name`` (``ca.crt``, ``namespace``) beside the service account token."""
    return os.path.join(os.path.dirname(SERVICE_ACCOUNT_TOKEN), name)


def service_account_namespace() -> str | None:
    """Return the pod's namespace (its service account's); None when not `in_cluster` or unread."""
    if not in_cluster():
        return None
    try:
        with open(service_account_file("namespace"), encoding="utf-8") as file:
            return file.read().strip() or None
    except OSError:
        return None


def authorization_header(configuration: kubernetes.client.Configuration) -> str | None:
    """Return the ``Authorization`` header the kubernetes client sends with ``configuration``.

    The header entry of ``Configuration.auth_settings()`` (``ApiClient.update_params_for_auth``
    sends it), scheme included (``Bearer <token>``, ``Basic <base64>``, the in-cluster
    loader's ``bearer <token>``); reading it runs ``refresh_api_key_hook`` (a token file or
    an exec plugin read again when expired).

    Parameters
    ----------
    configuration:
        A loaded client configuration (see `load_configuration`).

    Returns
    -------
    str or None
        The header's value, or None when the client sends none (client certificates only,
        or no credentials).
    """
    settings = cast(Mapping[str, Mapping[str, Any]], configuration.auth_settings())
    for setting in settings.values():
        key = str(setting.get("key", "")).lower()
        if setting.get("in") == "header" and key == "authorization" and setting.get("value"):
            return str(setting["value"])
    return None


def kopf_connection_info(kubeconfig: str | None = None) -> kopf.ConnectionInfo:
    """Return kopf's connection: the same server, CA, certificate and token as the client's.

    Derived from `load_configuration`, so kopf authenticates as the kubernetes client does
    with every kind of kubeconfig the client supports and in a pod (the namespace as kopf's
    ``login_with_service_account`` reads it); the ``Authorization`` header kopf sends
    (``kopf.ConnectionInfo.as_http_headers``) is byte for byte the client's
    (`authorization_header`).

    Parameters
    ----------
    kubeconfig:
        A kubeconfig file; None as in `load_configuration` (``$KUBECONFIG``, else the
        in-cluster service account, else ``~/.kube/config``).

    Returns
    -------
    kopf.ConnectionInfo
        ``server`` (the client's host), ``ca_path``, ``insecure`` (kubeconfig
        ``insecure-skip-tls-verify``), ``scheme`` and ``token``, ``certificate_path`` and
        ``private_key_path`` (files; inline data is written to temporary files by the
        kubernetes package, removed at exit), ``proxy_url`` (kubeconfig ``proxy-url``),
        ``default_namespace`` (in a pod).

    Raises
    ------
    kubernetes.config.ConfigException
        When there is no usable configuration (as `load_configuration`).

    Notes
    -----
    kopf calls the login handler again when the API server answers 401, so an expired
    exec-plugin or service-account token is replaced by a fresh one then. kopf has no
    ``tls-server-name``: with it set, kopf verifies the certificate against the server's
    host name (a warning is logged).
    """
    configuration = load_configuration(kubeconfig)
    scheme = token = None
    header = authorization_header(configuration)
    if header:
        scheme, _, rest = header.strip().partition(" ")
        token = rest.strip() or None
    if getattr(configuration, "tls_server_name", None):
        log.warning(
            "the kubeconfig sets tls-server-name %s, which kopf cannot use: kopf verifies "
            "the API server's certificate against %s",
            configuration.tls_server_name,
            configuration.host,
        )
    return kopf.ConnectionInfo(
        server=str(configuration.host),
        ca_path=configuration.ssl_ca_cert or None,
        insecure=not configuration.verify_ssl,
        scheme=scheme or None,
        token=token,
        certificate_path=configuration.cert_file or None,
        private_key_path=configuration.key_file or None,
        proxy_url=configuration.proxy or None,
        default_namespace=service_account_namespace() if kubeconfig is None else None,
    )
