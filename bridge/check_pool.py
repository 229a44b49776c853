"""``ipam-bridge check-pool``: check a pool against its IPAM from a laptop, read-only.

No cluster is needed: the pool and its credentials come from YAML files (or the command
line), the backend client is the operator's own (`pool_backends.build_backend`), and only
read requests are made (login, subnet lookups, usage, the list of each subnet's entries).
The result is what the pool's status would say, the first free address an allocation
would take now, and warnings: entries of other management clusters in the pool's subnets
while the pool has no ``hostnameSuffix`` (`other_clusters_warning`).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from backends.base import Allocation, IPAMBackend
from backends.errors import BackendError
from bridge.capi import GLOBAL_POOL_KINDS, POOL_KINDS
from bridge.models import IPPool, PoolStatus, wire
from bridge.reconcilers.errors import PoolError, pool_error_from
from bridge.reconcilers.pool_backends import Pool, build_backend, parse_pool, pool_status
from bridge.runtime.kubeconfig import context_namespace
from bridge.settings import Settings

__all__ = [
    "CheckResult",
    "UsageError",
    "check_pool",
    "load_pool",
    "load_secret",
    "other_clusters_warning",
    "print_result",
    "run_cli",
    "secret_values",
    "with_namespace",
]


class UsageError(ValueError):
    """A file or option of ``check-pool`` cannot be used (exit code 2); the message says why."""


@dataclass(frozen=True)
class CheckResult:
    """What ``check-pool`` found.

    Attributes
    ----------
    ready:
        True when the pool would be Ready.
    reason, message:
        The Ready condition's reason (``PoolReady``, ``AuthenticationFailed``,
        ``SubnetNotFound``, ``TLSVerificationFailed``, ...) and message.
    status:
        The pool's status as the operator would write it (`pool_backends.pool_status`), or
        None when the pool would not be Ready.
    first_free:
        The address a first-free allocation would take now, or None (not Ready, or full).
    pool:
        The pool checked, ``<Kind> <namespace>/<name>`` (``<Kind> <name>`` for a Global
        pool): says which namespace a file without one was read in.
    warnings:
        Sentences for a person about what may go wrong later (`other_clusters_warning`).
    """

    ready: bool
    reason: str
    message: str
    status: PoolStatus | None = None
    first_free: str | None = None
    pool: str = ""
    warnings: tuple[str, ...] = ()


def other_clusters_warning(
    pool: Pool, entries: Iterable[Allocation], cluster_id: str | None
) -> str | None:
    """Return a warning when the pool's subnets hold entries of other management clusters.

    Only for a pool without ``spec.hostnameSuffix``: its hostnames (``<claim>.<namespace>``)
    repeat across management clusters, and a claim whose name and namespace equal one of
    the other cluster's waits (reason ``HostnameTaken``) instead of getting an address. An
    entry of another cluster is one whose owner (`backends.base.Allocation.owner`) names a
    cluster id that is not ``cluster_id`` (the previous release's entries name none).

    Parameters
    ----------
    pool:
        The pool checked.
    entries:
        Every entry of its subnets (`backends.base.IPAMBackend.entries`).
    cluster_id:
        This management cluster's identity (``IPAM_BRIDGE_CLUSTER_ID``), or None when unknown:
        then the entries of every management cluster count.

    Returns
    -------
    str or None
        The warning (how many entries, which cluster ids, the fix), or None.
    """
    if pool.hostname_suffix:
        return None
    found: dict[str, int] = {}
    for entry in entries:
        owner = entry.owner
        if owner is not None and owner.cluster_id and owner.cluster_id != cluster_id:
            found[owner.cluster_id] = found.get(owner.cluster_id, 0) + 1
    if not found:
        return None
    total = sum(found.values())
    which = ", ".join(f"{other} ({count})" for other, count in sorted(found.items()))
    whose = "other management cluster" if cluster_id else "management cluster"
    text = (
        f"the pool's subnets hold {total} entr{'y' if total == 1 else 'ies'} of "
        f"{len(found)} {whose}{'s' if len(found) > 1 else ''} ({which}) and the pool has no "
        "spec.hostnameSuffix: a claim with the same namespace and name as one of theirs will "
        "wait (reason HostnameTaken); set spec.hostnameSuffix to a name unique to this "
        "management cluster"
    )
    if cluster_id is None:
        text += (
            " (set IPAM_BRIDGE_CLUSTER_ID to this cluster's id, the uid of namespace "
            "kube-system, to leave its own entries out)"
        )
    return text


def _documents(path: Path) -> list[dict[str, Any]]:
    try:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"{path} is not YAML: {exc}") from exc
    return [doc for doc in docs if isinstance(doc, dict)]


def load_pool(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Return the pool object of a YAML file, and the Secrets the same file holds.

    The file holds one pool (``PHPIPAMIPPool``, ``InfobloxIPPool`` or a Global kind) and
    may hold other documents, e.g. its credentials Secret (as the examples in
    ``tests/data/`` do).

    Raises
    ------
    UsageError
        When the file cannot be read, is not YAML, or holds no pool or more than one.
    """
    docs = _documents(path)
    pools = [doc for doc in docs if doc.get("kind") in POOL_KINDS]
    if len(pools) != 1:
        kinds = ", ".join(sorted(POOL_KINDS))
        raise UsageError(f"{path} must hold exactly one pool ({kinds}); found {len(pools)}")
    secrets = [doc for doc in docs if doc.get("kind") == "Secret"]
    return pools[0], secrets


def with_namespace(body: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
    """Return a pool object in the namespace kubectl would create it in.

    A namespaced kind without ``metadata.namespace`` gets ``namespace`` (the ``--namespace``
    option), else the kubeconfig context's namespace, else ``default``
    (`bridge.runtime.kubeconfig.context_namespace`); one with a namespace keeps it (and
    ``namespace``, when given, must be the same, as kubectl requires). A Global kind is
    cluster-scoped: it is returned as it is.

    Raises
    ------
    UsageError
        When ``namespace`` differs from the object's own namespace.
    """
    pool = dict(body)
    if pool.get("kind") in GLOBAL_POOL_KINDS:
        return pool
    meta = dict(pool.get("metadata") or {})
    own = meta.get("namespace")
    if own and namespace and own != namespace:
        raise UsageError(
            f"the namespace of the pool ({own}) does not match --namespace {namespace}"
        )
    meta["namespace"] = own or namespace or context_namespace()
    pool["metadata"] = meta
    return pool


def secret_values(secret: Mapping[str, Any]) -> dict[str, str]:
    """Return a Secret object's ``data`` (base64-decoded) and ``stringData`` as text.

    Raises
    ------
    UsageError
        When a ``data`` value is not base64 of UTF-8 text.
    """
    values: dict[str, str] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            values[str(key)] = base64.b64decode(str(value), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise UsageError(f"Secret key {key!r} is not base64 of UTF-8 text") from exc
    values.update({str(k): str(v) for k, v in (secret.get("stringData") or {}).items()})
    return values


def load_secret(path: Path, name: str | None = None) -> dict[str, str]:
    """Return the values of the Secret in a YAML file (the one named ``name`` if several).

    Raises
    ------
    UsageError
        When the file cannot be read or holds no such Secret.
    """
    return _pick_secret(_documents(path), name, str(path))


def _pick_secret(docs: Iterable[Mapping[str, Any]], name: str | None, where: str) -> dict[str, str]:
    secrets = [doc for doc in docs if doc.get("kind") == "Secret"]
    named = [s for s in secrets if (s.get("metadata") or {}).get("name") == name]
    chosen = named or (secrets if len(secrets) == 1 else [])
    if not chosen:
        raise UsageError(f"{where} holds no Secret {name or ''}".rstrip())
    return secret_values(chosen[0])


def _describe(backend: IPAMBackend, pool: Pool, cluster_id: str | None) -> CheckResult:
    infos = backend.describe_subnets()
    status = pool_status(pool, infos)
    ready = status.conditions[-1]
    usage = status.ip_addresses
    free = backend.first_free() if usage is not None and usage.free else None
    warning = (
        None
        if pool.hostname_suffix
        else other_clusters_warning(pool, backend.entries(), cluster_id)
    )
    warnings = (warning,) if warning else ()
    return CheckResult(True, ready.reason, ready.message, status, free, pool.display, warnings)


def check_pool(
    body: Mapping[str, Any],
    secret: Mapping[str, str],
    ca_pem: str | None = None,
    settings: Settings | None = None,
    cluster_id: str | None = None,
) -> CheckResult:
    """Check a pool against its IPAM, read-only, and return what its status would say.

    Parameters
    ----------
    body:
        The pool object (any of our kinds), as in its YAML file.
    secret:
        The credentials Secret's values (``username``/``password``, or phpIPAM ``token``).
    ca_pem:
        PEM bundle to trust (the content of ``spec.tls.caSecretRef``), or None.
    settings:
        Timeouts and retries (``IPAM_BRIDGE_BACKEND_TIMEOUT_SECONDS``, ``..._RETRY_*``);
        default: from the environment.
    cluster_id:
        This management cluster's identity, or None when unknown (`other_clusters_warning`).

    Returns
    -------
    CheckResult
        Ready with the status, first free address and warnings (a pool without
        ``hostnameSuffix`` whose subnets hold other management clusters' entries: one more
        list of the entries); or not Ready with the reason the
        operator would give (``InvalidSpec``, ``CredentialsNotFound``,
        ``AuthenticationFailed``, ``SubnetNotFound``, ``TLSVerificationFailed``,
        ``BackendUnavailable``) and its message. Never raises for a bad pool or IPAM.
    """
    settings = settings or Settings()
    shown = IPPool.from_body(body).display
    try:
        pool = parse_pool(body)
        backend = build_backend(
            pool,
            secret,
            ca_pem,
            timeout_seconds=settings.backend_timeout_seconds,
            retry=settings.retry_policy(),
        )
    except PoolError as exc:
        return CheckResult(False, str(exc.reason), exc.message, pool=shown)
    try:
        return _describe(backend, pool, cluster_id)
    except BackendError as exc:
        error = pool_error_from(exc, pool.display)
        return CheckResult(False, str(error.reason), error.message, pool=shown)
    finally:
        backend.close()


def _shown(status: PoolStatus) -> dict[str, Any]:
    """Return a Ready status as shown: as written, ``gateway`` null when the IPAM has none."""
    written = wire(status)
    names = [info.alias or name for name, info in PoolStatus.model_fields.items()]
    return {k: written.get(k) for k in names if k in written or k == "gateway"}


def print_result(result: CheckResult, out: TextIO, output: str = "text") -> None:
    """Write ``result`` to ``out``: ``text`` (a summary and the status as YAML) or ``json``."""
    if output == "json":
        payload = {
            "ready": result.ready,
            "reason": result.reason,
            "message": result.message,
            "status": None if result.status is None else _shown(result.status),
            "firstFree": result.first_free,
            "pool": result.pool,
            "warnings": list(result.warnings),
        }
        out.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
        return
    out.write(f"Ready: {result.ready} ({result.reason}): {result.message}\n")
    for warning in result.warnings:
        out.write(f"Warning: {warning}\n")
    if result.pool:
        out.write(f"pool: {result.pool}\n")
    if result.status is None:
        return
    shown = {
        k: v
        for k, v in _shown(result.status).items()
        if k not in ("conditions", "observedGeneration")
    }
    out.write(yaml.safe_dump({"status": shown}, sort_keys=False))
    taken = result.first_free or "none (no subnet has a free address)"
    out.write(f"first free address: {taken} (not taken)\n")


def _credentials(
    pool_path: Path,
    secret_path: Path | None,
    username: str | None,
    password_stdin: TextIO | None,
) -> dict[str, str]:
    body, inline = load_pool(pool_path)
    name = ((body.get("spec") or {}).get("credentialsRef") or {}).get("name")
    if username is not None:
        if password_stdin is None:
            raise UsageError("--username needs --password-stdin")
        password = password_stdin.readline().rstrip("\r\n")
        if not password:
            raise UsageError("--password-stdin: no password on standard input")
        return {"username": username, "password": password}
    if secret_path is not None:
        return load_secret(secret_path, name)
    if inline:
        return _pick_secret(inline, name, str(pool_path))
    raise UsageError("credentials: give --secret FILE, or --username and --password-stdin")


def run_cli(
    pool_path: Path,
    *,
    secret_path: Path | None = None,
    username: str | None = None,
    password_stdin: TextIO | None = None,
    ca_path: Path | None = None,
    namespace: str | None = None,
    output: str = "text",
    out: TextIO,
    err: TextIO,
) -> int:
    """Run ``ipam-bridge check-pool`` and return its exit code.

    Credentials: ``username`` with the first line of ``password_stdin``, else the Secret of
    ``secret_path`` (the one ``spec.credentialsRef`` names when it holds several), else a
    Secret in the pool's own file. A namespaced pool without ``metadata.namespace`` is
    checked in ``namespace`` (``--namespace``), else the kubeconfig context's namespace, else
    ``default``, as ``kubectl apply -f`` would create it (`with_namespace`). This
    management cluster's identity, for the warning about other clusters' entries, is
    ``IPAM_BRIDGE_CLUSTER_ID`` (unset: unknown, every cluster's entries count).

    Returns
    -------
    int
        0 when the pool would be Ready, 1 when it would not (the reason and message are
        printed), 2 for a usage error (a file that cannot be read, no pool, no credentials;
        one line on ``err``).
    """
    try:
        body = with_namespace(load_pool(pool_path)[0], namespace)
        secret = _credentials(pool_path, secret_path, username, password_stdin)
        ca_pem = ca_path.read_text(encoding="utf-8") if ca_path is not None else None
    except UsageError as exc:
        err.write(f"ipam-bridge check-pool: {exc}\n")
        return 2
    except OSError as exc:
        err.write(f"ipam-bridge check-pool: cannot read {ca_path}: {exc.strerror or exc}\n")
        return 2
    settings = Settings()
    result = check_pool(body, secret, ca_pem, settings, settings.cluster_id.strip() or None)
    print_result(result, out, output)
    return 0 if result.ready else 1
