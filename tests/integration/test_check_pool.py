"""``ipam-bridge check-pool``: a pool file checked against the mock IPAMs over HTTP, read-only."""

from __future__ import annotations

import copy
import io
import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from integration_env import CREDENTIALS, INFOBLOX_SEED, PHPIPAM_SEED

from bridge.cli import main
from mock_infoblox.server import MockInfobloxServer
from mock_infoblox.store import InfobloxStore
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

GROUP = "ipam.cluster.x-k8s.io/v1alpha1"


def secret_doc(values: dict[str, str], name: str = "creds") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": values}


def pool_doc(kind: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("credentialsRef", {"name": "creds"})
    return {
        "apiVersion": GROUP,
        "kind": kind,
        "metadata": {"name": "p", "namespace": "capi"},
        "spec": spec,
    }


def write(tmp_path: Path, name: str, *docs: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return path


def run(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    """Run the console entry point in-process; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
    try:
        code = main(["check-pool", *argv])
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    finally:
        sys.stdin, sys.stdout, sys.stderr = old
    return code, out.getvalue(), err.getvalue()


def checked(*argv: str, stdin: str = "") -> tuple[int, dict[str, Any]]:
    code, out, err = run(*argv, "-o", "json", stdin=stdin)
    assert CREDENTIALS["password"] not in out + err
    return code, json.loads(out)


def test_phpipam_pool_ready_with_status_and_first_free(
    tmp_path: Path, phpipam: MockPhpipamServer
) -> None:
    pool = write(
        tmp_path,
        "pool.yaml",
        pool_doc("PHPIPAMIPPool", endpoint=phpipam.url, appId="capi", subnet="10.20.0.0/24"),
    )
    secret = write(tmp_path, "secret.yaml", secret_doc(CREDENTIALS))
    code, result = checked("-f", str(pool), "--secret", str(secret))
    assert code == 0, result
    assert (result["ready"], result["reason"]) == (True, "PoolReady")
    status = result["status"]
    assert (status["subnet"], status["prefix"], status["gateway"]) == (
        "10.20.0.0/24",
        24,
        "10.20.0.1",
    )
    assert status["ipAddresses"] == {"total": 254, "used": 1, "free": 253}
    assert result["firstFree"] == "10.20.0.2"
    # Read-only: no write besides the login (which `writes_only` leaves out); nothing reserved.
    assert phpipam.store.requests(writes_only=True) == []
    assert any(r.method == "GET" for r in phpipam.store.requests())
    assert [a for a in phpipam.store.subnet_addresses(7) if not a.is_gateway] == []


def test_phpipam_first_free_skips_registered_entries_and_full_subnets(
    tmp_path: Path, phpipam: MockPhpipamServer
) -> None:
    """Subnet 9 (a /30) full, then subnet 10 with .2 and .3 held: the first free is .4."""
    phpipam.store.create_address({"subnetId": 9, "ip": "10.20.1.1", "hostname": "a"})
    phpipam.store.create_address({"subnetId": 9, "ip": "10.20.1.2", "hostname": "b"})
    phpipam.store.create_address({"subnetId": 10, "ip": "10.20.2.2", "hostname": "c"})
    phpipam.store.create_address({"subnetId": 10, "ip": "10.20.2.3", "hostname": "d"})
    pool = write(
        tmp_path,
        "pool.yaml",
        pool_doc(
            "PHPIPAMIPPool",
            endpoint=phpipam.url,
            appId="capi",
            subnets=[{"subnetId": 9}, {"subnetId": 10}],
        ),
        secret_doc(CREDENTIALS),
    )
    code, result = checked("-f", str(pool))  # the Secret from the pool's own file
    assert code == 0, result
    assert [s["ipAddresses"]["free"] for s in result["status"]["subnets"]] == [0, 11]
    assert result["firstFree"] == "10.20.2.4"


@pytest.mark.parametrize(
    ("password", "spec", "reason"),
    [
        ("wrong", {"subnet": "10.20.0.0/24"}, "AuthenticationFailed"),
        (CREDENTIALS["password"], {"subnet": "10.99.0.0/24"}, "SubnetNotFound"),
    ],
)
def test_phpipam_pool_not_ready_exits_1_with_the_reason(
    tmp_path: Path, phpipam: MockPhpipamServer, password: str, spec: dict[str, Any], reason: str
) -> None:
    pool = write(
        tmp_path, "pool.yaml", pool_doc("PHPIPAMIPPool", endpoint=phpipam.url, appId="capi", **spec)
    )
    code, out, err = run(
        "-f",
        str(pool),
        "--username",
        CREDENTIALS["username"],
        "--password-stdin",
        stdin=password + "\n",
    )
    assert code == 1, out + err
    assert out.startswith(f"Ready: False ({reason}): PHPIPAMIPPool capi/p: ")
    assert password not in out + err


def test_tls_verification_failure_and_a_ca_file(tmp_path: Path) -> None:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    with MockPhpipamServer(Store(copy.deepcopy(PHPIPAM_SEED)), ssl_context=context) as server:
        pool = write(
            tmp_path,
            "pool.yaml",
            pool_doc("PHPIPAMIPPool", endpoint=server.url, appId="capi", subnetId=7),
        )
        secret = write(tmp_path, "secret.yaml", secret_doc(CREDENTIALS))
        code, result = checked("-f", str(pool), "--secret", str(secret))
        assert (code, result["reason"]) == (1, "TLSVerificationFailed")
        ca_file = tmp_path / "ca.crt"
        ca_file.write_bytes(ca.cert_pem.bytes())
        code, result = checked("-f", str(pool), "--secret", str(secret), "--ca-file", str(ca_file))
        assert (code, result["reason"]) == (0, "PoolReady")


def test_infoblox_pool_ready_with_status_and_first_free(
    tmp_path: Path, infoblox: MockInfobloxServer
) -> None:
    pool = write(
        tmp_path,
        "pool.yaml",
        pool_doc(
            "InfobloxIPPool",
            endpoint=infoblox.url,
            subnets=[{"subnet": "10.20.1.0/30"}, {"subnet": "10.20.0.0/24"}],
        ),
    )
    secret = write(tmp_path, "secret.yaml", secret_doc(CREDENTIALS))
    code, out, _ = run("-f", str(pool), "--secret", str(secret))
    assert code == 0, out
    assert out.startswith("Ready: True (PoolReady): ")
    shown = yaml.safe_load(out.split("\n", 1)[1].rsplit("first free address", 1)[0])
    assert [s["cidr"] for s in shown["status"]["subnets"]] == ["10.20.1.0/30", "10.20.0.0/24"]
    assert shown["status"]["subnets"][1]["gateway"] == "10.20.0.1"
    assert "first free address: 10.20.1.1 (not taken)" in out
    # Nothing was reserved: a second check finds the same usage and the same first free.
    again = run("-f", str(pool), "--secret", str(secret))[1]
    assert again == out


def test_infoblox_wrong_password_and_missing_network(
    tmp_path: Path, infoblox: MockInfobloxServer
) -> None:
    secret = write(tmp_path, "secret.yaml", secret_doc({**CREDENTIALS, "password": "wrong"}))
    pool = write(
        tmp_path,
        "pool.yaml",
        pool_doc("InfobloxIPPool", endpoint=infoblox.url, subnet="10.20.0.0/24"),
    )
    code, result = checked("-f", str(pool), "--secret", str(secret))
    assert (code, result["reason"]) == (1, "AuthenticationFailed")
    good = write(tmp_path, "good.yaml", secret_doc(CREDENTIALS))
    missing = write(
        tmp_path,
        "missing.yaml",
        pool_doc("InfobloxIPPool", endpoint=infoblox.url, subnet="10.99.0.0/24"),
    )
    code, result = checked("-f", str(missing), "--secret", str(good))
    assert (code, result["reason"]) == (1, "SubnetNotFound")
    assert "10.99.0.0/24" in result["message"]


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    pool = write(
        tmp_path,
        "pool.yaml",
        pool_doc("PHPIPAMIPPool", endpoint="http://127.0.0.1:9", appId="capi", subnetId=7),
    )
    assert run("-f", str(tmp_path / "absent.yaml"), "--secret", str(pool))[0] == 2
    code, _, err = run("-f", str(pool))  # no credentials anywhere
    assert code == 2 and "credentials" in err
    code, _, err = run("-f", str(write(tmp_path, "s.yaml", secret_doc(CREDENTIALS))))
    assert code == 2 and "exactly one pool" in err
    assert run("--secret", str(pool))[0] == 2  # argparse: -f is required
    code, _, err = run("-f", str(pool), "--username", "u")
    assert code == 2 and "--password-stdin" in err


def test_invalid_spec_exits_1(tmp_path: Path) -> None:
    pool = write(tmp_path, "pool.yaml", pool_doc("PHPIPAMIPPool", appId="capi", subnetId=7))
    secret = write(tmp_path, "secret.yaml", secret_doc(CREDENTIALS))
    code, result = checked("-f", str(pool), "--secret", str(secret))
    assert (code, result["ready"], result["reason"]) == (1, False, "InvalidSpec")
    assert "endpoint" in result["message"]


def test_console_script_exit_code(tmp_path: Path, phpipam: MockPhpipamServer) -> None:
    """The installed console script, in a process of its own, prints the status and exits 0."""
    pool = write(
        tmp_path,
        "pool.yaml",
        pool_doc("PHPIPAMIPPool", endpoint=phpipam.url, appId="capi", subnetId=10),
    )
    secret = write(tmp_path, "secret.yaml", secret_doc(CREDENTIALS))
    script = Path(sys.executable).with_name("ipam-bridge")
    done = subprocess.run(
        [str(script), "check-pool", "-f", str(pool), "--secret", str(secret)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "first free address: 10.20.2.2 (not taken)" in done.stdout


def test_infoblox_first_free_skips_addresses_of_other_record_types(tmp_path: Path) -> None:
    """An A record (not a host record or fixed address) holds 10.20.1.1: the first free is .2."""
    seed = copy.deepcopy(INFOBLOX_SEED)
    seed["used"].append(
        {"ip": "10.20.1.1", "network_view": "default", "names": ["printer"], "types": ["A"]}
    )
    with MockInfobloxServer(InfobloxStore.from_seed(seed)) as server:
        pool = write(
            tmp_path,
            "pool.yaml",
            pool_doc("InfobloxIPPool", endpoint=server.url, subnet="10.20.1.0/30"),
        )
        secret = write(tmp_path, "secret.yaml", secret_doc(CREDENTIALS))
        code, result = checked("-f", str(pool), "--secret", str(secret))
    assert code == 0, result
    assert result["status"]["ipAddresses"] == {"total": 2, "used": 1, "free": 1}
    assert result["firstFree"] == "10.20.1.2"


def test_other_clusters_entries_without_a_hostname_suffix_are_a_warning(
    tmp_path: Path, phpipam: MockPhpipamServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two entries of management cluster B, one of ours (A), one of a person."""
    monkeypatch.delenv("IPAM_BRIDGE_CLUSTER_ID", raising=False)
    for ip, cluster, claim in (
        ("10.20.0.5", "cluster-b", "default/m1"),
        ("10.20.0.6", "cluster-b", "default/m2"),
        ("10.20.0.7", "cluster-a", "default/m3"),
    ):
        note = f"ipam-bridge cluster={cluster} claim={claim}"
        name = claim.split("/")[1] + ".default"
        phpipam.store.create_address({"subnetId": 7, "ip": ip, "hostname": name, "note": note})
    phpipam.store.create_address({"subnetId": 7, "ip": "10.20.0.8", "hostname": "printer"})
    spec = {"endpoint": phpipam.url, "appId": "capi", "subnet": "10.20.0.0/24"}
    secret = write(tmp_path, "secret.yaml", secret_doc(CREDENTIALS))
    bare = write(tmp_path, "bare.yaml", pool_doc("PHPIPAMIPPool", **spec))
    suffixed = write(
        tmp_path, "suffixed.yaml", pool_doc("PHPIPAMIPPool", hostnameSuffix="a", **spec)
    )

    # This cluster unknown: every management cluster's entries count.
    code, result = checked("-f", str(bare), "--secret", str(secret))
    assert code == 0 and result["ready"] is True  # a warning, not a failure
    [unknown] = result["warnings"]
    assert "3 entries of 2 management clusters (cluster-a (1), cluster-b (2))" in unknown
    assert "IPAM_BRIDGE_CLUSTER_ID" in unknown

    monkeypatch.setenv("IPAM_BRIDGE_CLUSTER_ID", "cluster-a")
    code, out, _ = run("-f", str(bare), "--secret", str(secret))
    assert code == 0
    [line] = [x for x in out.splitlines() if x.startswith("Warning: ")]
    assert "2 entries of 1 other management cluster (cluster-b (2))" in line
    assert "spec.hostnameSuffix" in line and "HostnameTaken" in line

    assert checked("-f", str(suffixed), "--secret", str(secret))[1]["warnings"] == []
    monkeypatch.setenv("IPAM_BRIDGE_CLUSTER_ID", "cluster-b")
    assert "cluster-a (1)" in checked("-f", str(bare), "--secret", str(secret))[1]["warnings"][0]
    assert phpipam.store.requests(writes_only=True) == []  # read-only


def test_infoblox_entries_of_another_cluster_are_read_from_the_comment(
    tmp_path: Path, infoblox: MockInfobloxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPAM_BRIDGE_CLUSTER_ID", "cluster-a")
    infoblox.store.add_record(
        {
            "name": "m1.default",
            "address": "10.20.0.9",
            "comment": "ipam-bridge cluster-b default/m1",
        }
    )
    pool = write(
        tmp_path,
        "pool.yaml",
        pool_doc("InfobloxIPPool", endpoint=infoblox.url, subnet="10.20.0.0/24"),
        secret_doc(CREDENTIALS),
    )
    code, result = checked("-f", str(pool))
    assert code == 0
    assert "1 entry of 1 other management cluster (cluster-b (1))" in result["warnings"][0]


# --- a manifest without metadata.namespace, as kubectl reads it ---------------------------


def kubeconfig(path: Path, namespace: str | None) -> Path:
    """A kubeconfig whose current context has ``namespace`` (none when None); nothing answers."""
    context: dict[str, Any] = {"cluster": "local", "user": "test"}
    if namespace is not None:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "test", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "local", "context": context}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def unplaced(kind: str, **spec: Any) -> dict[str, Any]:
    """A pool as the docs' examples write it: no ``metadata.namespace``."""
    doc = pool_doc(kind, **spec)
    del doc["metadata"]["namespace"]
    return doc


@pytest.mark.parametrize(("context", "expected"), [("team-a", "team-a"), (None, "default")])
def test_a_namespaced_pool_without_namespace_is_in_the_context_namespace(
    tmp_path: Path,
    phpipam: MockPhpipamServer,
    monkeypatch: pytest.MonkeyPatch,
    context: str | None,
    expected: str,
) -> None:
    """kubectl's rule: the current context's namespace, else ``default``; never a Global pool."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", context)))
    pool = write(
        tmp_path,
        "pool.yaml",
        unplaced("PHPIPAMIPPool", endpoint=phpipam.url, appId="capi", subnet="10.20.0.0/24"),
        secret_doc(CREDENTIALS),
    )
    code, out, err = run("-f", str(pool))
    assert code == 0, out + err
    assert out.startswith("Ready: True (PoolReady): ")
    assert f"\npool: PHPIPAMIPPool {expected}/p\n" in out


def test_a_pool_without_namespace_and_no_kubeconfig_is_in_default(
    tmp_path: Path, infoblox: MockInfobloxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    pool = write(
        tmp_path,
        "pool.yaml",
        unplaced("InfobloxIPPool", endpoint=infoblox.url, subnet="10.20.0.0/24"),
    )
    secret = write(tmp_path, "secret.yaml", secret_doc(CREDENTIALS))
    code, result = checked("-f", str(pool), "--secret", str(secret))
    assert (code, result["reason"]) == (0, "PoolReady"), result
    assert result["pool"] == "InfobloxIPPool default/p"


def test_namespace_option_places_the_pool_and_must_match_its_own(
    tmp_path: Path, phpipam: MockPhpipamServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", "team-a")))
    spec = {"endpoint": phpipam.url, "appId": "capi", "subnetId": 10}
    bare = write(tmp_path, "bare.yaml", unplaced("PHPIPAMIPPool", **spec), secret_doc(CREDENTIALS))
    code, out, err = run("-f", str(bare), "--namespace", "team-b")
    assert code == 0 and "\npool: PHPIPAMIPPool team-b/p\n" in out, err
    placed = write(
        tmp_path, "placed.yaml", pool_doc("PHPIPAMIPPool", **spec), secret_doc(CREDENTIALS)
    )
    assert run("-f", str(placed), "-n", "capi")[0] == 0
    code, _, err = run("-f", str(placed), "-n", "team-b")
    assert code == 2 and "(capi) does not match --namespace team-b" in err


def test_a_global_pool_stays_global(
    tmp_path: Path, phpipam: MockPhpipamServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Global kind names its Secret's namespace, with or without a namespace in its file."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", "team-a")))
    spec = {"endpoint": phpipam.url, "appId": "capi", "subnetId": 10}
    for doc in (unplaced("GlobalPHPIPAMIPPool", **spec), pool_doc("GlobalPHPIPAMIPPool", **spec)):
        pool = write(tmp_path, "pool.yaml", doc, secret_doc(CREDENTIALS))
        code, result = checked("-f", str(pool))
        assert (code, result["reason"]) == (1, "InvalidSpec")
        assert "spec.credentialsRef.namespace is required on a Global pool" in result["message"]
    named = unplaced(
        "GlobalPHPIPAMIPPool", **spec, credentialsRef={"name": "creds", "namespace": "x"}
    )
    pool = write(tmp_path, "pool.yaml", named, secret_doc(CREDENTIALS))
    code, result = checked("-f", str(pool))
    assert (code, result["reason"]) == (0, "PoolReady"), result
    assert result["pool"] == "GlobalPHPIPAMIPPool p"
