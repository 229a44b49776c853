"""The book's commands against the IPAM mocks: its pools pass ``check-pool``, its demo runs.

Every pool of ``docs/examples/`` is checked with ``ipam-bridge check-pool`` against a mock
phpIPAM or WAPI seeded with what the examples name (subnets, networks, the DNS zone, the
extensible attribute, the user and password of the example Secrets): a pool example that the
operator would not take (a namespaced pool read as a Global one, a field it refuses, a Secret
key it does not read) fails here. The ``check-pool`` commands of the pages run as written, in a
folder of the example files, and the output the book shows is the one the command prints.
"""

from __future__ import annotations

import copy
import io
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration_env import INFOBLOX_SEED, PHPIPAM_SEED

from bridge.capi import POOL_KINDS
from bridge.cli import main
from mock_infoblox.server import MockInfobloxServer
from mock_infoblox.store import InfobloxStore
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
#: The credentials of the example Secrets.
USER, PASSWORD = "capi-operator", "change-me"

#: What the examples name, in phpIPAM: section 3 with 10.20.0.0/24 (id 7), 10.20.8.0/22 (the
#: second subnet of the multi-subnet example) and the VIP subnet 10.20.100.0/24.
DOCS_PHPIPAM_SEED: dict[str, Any] = {
    **copy.deepcopy(PHPIPAM_SEED),
    "users": [{"username": USER, "password": PASSWORD}],
}
DOCS_PHPIPAM_SEED["sections"][0]["subnets"] += [
    {"id": 11, "cidr": "10.20.8.0/22"},
    {"id": 12, "cidr": "10.20.100.0/24", "gateway": "10.20.100.1"},
]
#: ... and in Infoblox: the network 10.30.0.0/24 of the view `default` (zone and attribute
#: `Owner` are in the integration seed).
DOCS_INFOBLOX_SEED: dict[str, Any] = {
    **copy.deepcopy(INFOBLOX_SEED),
    "users": {USER: PASSWORD},
}
DOCS_INFOBLOX_SEED["networks"].append(
    {"network": "10.30.0.0/24", "network_view": "default", "gateway": "10.30.0.1"}
)


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _pool_examples() -> list[Path]:
    return sorted(
        path
        for path in EXAMPLES.glob("*.yaml")
        if any(doc.get("kind") in POOL_KINDS for doc in _documents(path))
    )


@pytest.fixture(scope="module")
def mocks() -> Iterator[dict[str, str]]:
    """The two mock IPAMs, by the example endpoint each stands for."""
    with (
        MockPhpipamServer(Store(copy.deepcopy(DOCS_PHPIPAM_SEED))) as phpipam,
        MockInfobloxServer(InfobloxStore.from_seed(copy.deepcopy(DOCS_INFOBLOX_SEED))) as grid,
    ):
        yield {"https://phpipam.example.com/api": phpipam.url, "https://gm.example.com": grid.url}


def _localised(path: Path, mocks: dict[str, str], into: Path) -> Path:
    """Write ``path`` to ``into`` with every pool's endpoint pointing at its mock."""
    docs = _documents(path)
    for doc in docs:
        if doc.get("kind") in POOL_KINDS:
            doc["spec"]["endpoint"] = mocks[doc["spec"]["endpoint"]]
    target = into / path.name
    target.write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    return target


def check_pool(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    """Run ``ipam-bridge check-pool`` in-process; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
    try:
        code = main(["check-pool", *argv])
    finally:
        sys.stdin, sys.stdout, sys.stderr = old
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("example", _pool_examples(), ids=lambda p: p.name)
def test_pool_example_is_ready_against_the_mock(
    example: Path, mocks: dict[str, str], tmp_path: Path
) -> None:
    pool = _localised(example, mocks, tmp_path)
    docs = _documents(example)
    kind = next(d["kind"] for d in docs if d["kind"] in POOL_KINDS)
    argv = ["-f", str(pool)]
    if not any(d["kind"] == "Secret" for d in docs):  # its Secret is the getting-started one
        secret = "phpipam-secret.yaml" if "PHPIPAM" in kind else "infoblox-secret.yaml"
        argv += ["--secret", str(EXAMPLES / secret)]
    code, out, err = check_pool(*argv)
    assert code == 0, out + err
    assert out.startswith("Ready: True (PoolReady): "), out
    assert PASSWORD not in out + err


#: A ``check-pool`` command line of a page (a shell block's line, or a console block's).
_CHECK_POOL_LINE = re.compile(
    r'^[ ]*(?:\$ )?((?:echo "\$PASSWORD" \| )?ipam-bridge check-pool -f [^\n]+)$', re.MULTILINE
)


def _documented_check_pool_commands() -> list[str]:
    """Every ``check-pool`` command of the pages written by hand (not the generated reference)."""
    pages = [p for p in DOCS.rglob("*.md") if "reference" not in p.relative_to(DOCS).parts]
    found = {m for page in pages for m in _CHECK_POOL_LINE.findall(page.read_text())}
    assert found, "no page shows a check-pool command"
    return sorted(found)


@pytest.mark.parametrize("command", _documented_check_pool_commands())
def test_pool_examples_pass_check_pool(command: str, mocks: dict[str, str], tmp_path: Path) -> None:
    """Each ``check-pool`` command of the book, as written, in a folder of the example files."""
    stdin = ""
    if command.startswith('echo "$PASSWORD" | '):
        command, stdin = command.split(" | ", 1)[1], PASSWORD + "\n"
    argv = shlex.split(command)
    assert argv[:2] == ["ipam-bridge", "check-pool"], command
    for i, arg in enumerate(argv):
        if arg.endswith(".yaml"):
            argv[i] = str(_localised(EXAMPLES / arg, mocks, tmp_path))
    code, out, err = check_pool(*argv[2:], stdin=stdin)
    assert code == 0, out + err
    assert out.startswith("Ready: True (PoolReady): "), out


def test_the_check_pool_output_of_the_book_is_what_it_prints(
    mocks: dict[str, str], tmp_path: Path
) -> None:
    page = (DOCS / "tasks" / "check-a-pool.md").read_text(encoding="utf-8")
    block = re.search(r"```console\n\$ (?P<command>[^\n]+)\n(?P<output>.*?)```", page, re.DOTALL)
    assert block is not None
    argv = shlex.split(block["command"])
    pool = _localised(EXAMPLES / argv[argv.index("-f") + 1], mocks, tmp_path)
    secret = EXAMPLES / argv[argv.index("--secret") + 1]
    code, out, _ = check_pool("-f", str(pool), "--secret", str(secret))
    assert code == 0
    assert out == block["output"]


def test_the_infoblox_demo_runs() -> None:
    """``.venv/bin/ipam-bridge demo --backend infoblox``, as the demo page gives it."""
    script = Path(sys.executable).with_name("ipam-bridge")
    done = subprocess.run(
        [str(script), "demo", "--backend", "infoblox"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "InfobloxIPPool demo/nodes is Ready" in done.stdout
    assert "the infoblox mock holds 0 entries" in done.stdout
    assert re.search(r"^done in [0-9.]+s$", done.stdout, re.MULTILINE), done.stdout
