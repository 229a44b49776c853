"""A bare client of the IPAM contract in a process of its own: the CPU a claim needs at least.

For each claim it sends exactly what the operator sends, and nothing else: no watch, no
cache, no work queue, no kopf, no kubernetes client models, no logging.

- allocation: phpIPAM search by hostname + first free (`backends.phpipam.PHPIPAMBackend`,
  the operator's own IPAM client), then the 3 API writes: merge-patch the claim's
  finalizers, create the IPAddress, merge-patch the claim's status;
- release: phpIPAM search + delete, then the 3 API writes: merge-patch the IPAddress's
  finalizers, delete it, merge-patch the claim's finalizers.

The API requests are plain urllib3 with JSON bodies (https://urllib3.readthedocs.io/), with
as many threads as the operator has endpoint slots. `BareClient` runs
``python -m benchmarks.bare_client`` and drives it phase by phase over its standard input;
the process's CPU seconds are read from ``/proc`` (`benchmarks.common.cpu_seconds`), so
the emulated API server's and the mock's CPU (in the benchmark's process) never count.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import urllib3

from backends.base import EntryOwner
from benchmarks.common import cpu_seconds

#: The management cluster the bare client writes as the owner of its entries.
BENCH_CLUSTER_ID = "bare-client-benchmark"

__all__ = ["BareClient", "BarePhase", "main"]

GROUP = "ipam.cluster.x-k8s.io"
CLAIM_FINALIZER = f"{GROUP}/ReleaseAddress"
ADDRESS_FINALIZER = f"{GROUP}/ProtectAddress"
HOSTNAME_ANNOTATION = f"{GROUP}/hostname"
MERGE = "application/merge-patch+json"


@dataclass
class BarePhase:
    """One phase of the bare client: ``claims`` claims in ``seconds``, ``cpu`` CPU seconds."""

    claims: int
    seconds: float
    cpu: float

    @property
    def per_second(self) -> float:
        """Claims per second (wall clock)."""
        return self.claims / self.seconds if self.seconds else float("nan")

    @property
    def cpu_ms(self) -> float:
        """CPU milliseconds per claim."""
        return 1000 * self.cpu / self.claims if self.claims else float("nan")


class _Contract:
    """The requests of one claim (see the module docstring), in the child process."""

    def __init__(self, config: dict[str, Any]) -> None:
        from backends.flowcontrol import FlowControl
        from backends.phpipam import PHPIPAMBackend, PHPIPAMConfig
        from backends.retry import RetryPolicy

        self.config = config
        threads = int(config["threads"])
        self.http = urllib3.PoolManager(maxsize=threads, block=True)
        self.base = str(config["api"]).rstrip("/")
        self.headers = {"Authorization": f"Bearer {config['token']}", "Accept": "application/json"}
        self.version = str(config["version"])
        self.namespace = str(config["namespace"])
        ipam = PHPIPAMConfig(
            endpoint=config["phpipam"],
            app_id="capi",
            subnet_id=int(config["subnet_id"]),
            username=config["username"],
            password=config["password"],
            timeout_seconds=10,
            retry=RetryPolicy(attempts=5, max_delay_seconds=0.5),
        )
        self.ipam = PHPIPAMBackend(ipam, endpoints=FlowControl(max_concurrent=threads))
        self.ipam.describe_subnets()  # login and subnet facts, as the operator's warm client

    def _path(self, plural: str, name: str = "", sub: str = "") -> str:
        path = f"{self.base}/apis/{GROUP}/{self.version}/namespaces/{self.namespace}/{plural}"
        return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def _send(self, method: str, url: str, body: Any = None, *, patch: bool = False) -> Any:
        headers = dict(self.headers)
        data = None
        if body is not None:
            headers["Content-Type"] = MERGE if patch else "application/json"
            data = json.dumps(body).encode()
        response = self.http.request(method, url, body=data, headers=headers)
        if response.status >= 300:
            raise RuntimeError(f"{method} {url}: {response.status} {response.data[:200]!r}")
        return json.loads(response.data)

    def allocate(self, claim: Sequence[str]) -> None:
        name, uid = claim
        hostname = f"{name}.{self.namespace}"
        owner = EntryOwner(BENCH_CLUSTER_ID, f"{self.namespace}/{name}")
        found = self.ipam.allocate(hostname, owner)
        pool = self.config["pool"]
        self._send(
            "PATCH",
            self._path("ipaddressclaims", name),
            {"metadata": {"finalizers": [CLAIM_FINALIZER]}},
            patch=True,
        )
        pool_ref = {"apiGroup": GROUP, "kind": pool["kind"], "name": pool["name"]}
        spec: dict[str, Any] = {
            "address": found.address,
            "prefix": found.prefix,
            "claimRef": {"name": name},
            "poolRef": pool_ref,
        }
        if found.gateway:
            spec["gateway"] = found.gateway
        owner = {"blockOwnerDeletion": True}
        self._send(
            "POST",
            self._path("ipaddresses"),
            {
                "apiVersion": f"{GROUP}/{self.version}",
                "kind": "IPAddress",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "annotations": {HOSTNAME_ANNOTATION: hostname},
                    "finalizers": [ADDRESS_FINALIZER],
                    "ownerReferences": [
                        {
                            "apiVersion": f"{GROUP}/{self.version}",
                            "kind": "IPAddressClaim",
                            "name": name,
                            "uid": uid,
                            "controller": True,
                            **owner,
                        },
                        {
                            "apiVersion": f"{GROUP}/v1alpha1",
                            "kind": pool["kind"],
                            "name": pool["name"],
                            "uid": pool["uid"],
                            "controller": False,
                            **owner,
                        },
                    ],
                },
                "spec": spec,
            },
        )
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "AddressAllocated",
            "message": f"address {found.address}/{found.prefix} from {pool['kind']} "
            f"{self.namespace}/{pool['name']}",
            "lastTransitionTime": now,
        }
        self._send(
            "PATCH",
            self._path("ipaddressclaims", name, "status"),
            {"status": {"addressRef": {"name": name}, "conditions": [ready]}},
            patch=True,
        )

    def release(self, claim: Sequence[str]) -> None:
        name = claim[0]
        owner = EntryOwner(BENCH_CLUSTER_ID, f"{self.namespace}/{name}")
        self.ipam.release(f"{name}.{self.namespace}", owner)
        self._send(
            "PATCH",
            self._path("ipaddresses", name),
            {"metadata": {"finalizers": []}},
            patch=True,
        )
        self._send("DELETE", self._path("ipaddresses", name))
        self._send(
            "PATCH",
            self._path("ipaddressclaims", name),
            {"metadata": {"finalizers": []}},
            patch=True,
        )


def main() -> int:
    """Serve phases read from stdin (one JSON line each: ``{"phase", "claims"}``).

    The first line is the configuration (see `BareClient`); ``ready`` is printed once the
    IPAM client is logged in, then ``done <seconds>`` after each phase.
    """
    config = json.loads(sys.stdin.readline())
    contract = _Contract(config)
    print("ready", flush=True)
    with ThreadPoolExecutor(max_workers=int(config["threads"])) as pool:
        for line in sys.stdin:
            order = json.loads(line)
            work: Callable[[Sequence[str]], None] = getattr(contract, order["phase"])
            start = time.monotonic()
            list(pool.map(work, order["claims"]))
            print(f"done {time.monotonic() - start}", flush=True)
    return 0


class BareClient:
    """The bare client in a child process (a context manager: started on entry).

    Parameters
    ----------
    config:
        ``api`` (the API server's URL), ``token``, ``version`` (served CAPI IPAM version),
        ``namespace``, ``pool`` (``kind``, ``name``, ``uid``), ``phpipam`` (URL),
        ``subnet_id``, ``username``, ``password``, ``threads``.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Self:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bare_client"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._send(self.config)
        self._expect("ready")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _send(self, message: object) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _expect(self, word: str) -> str:
        assert self.process is not None and self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith(word):
            raise RuntimeError(f"bare client: expected {word!r}, got {line!r}")
        return line[len(word) :].strip()

    def run(self, phase: str, claims: Sequence[tuple[str, str]]) -> BarePhase:
        """Run ``phase`` (``allocate`` or ``release``) on ``claims`` (name, uid) pairs.

        Raises
        ------
        RuntimeError
            When a request failed (the child stops; its traceback is on stderr).
        """
        assert self.process is not None
        before = cpu_seconds(self.process.pid)
        self._send({"phase": phase, "claims": [list(c) for c in claims]})
        seconds = float(self._expect("done"))
        return BarePhase(len(claims), seconds, cpu_seconds(self.process.pid) - before)


if __name__ == "__main__":
    sys.exit(main())
