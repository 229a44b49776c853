"""`bridge.check_pool.other_clusters_warning`: other management clusters' entries in a pool."""

from __future__ import annotations

from backends.base import Allocation, EntryOwner
from bridge.check_pool import other_clusters_warning
from bridge.reconcilers.pool_backends import Pool, parse_pool

HERE, THERE = "cluster-a", "cluster-b"


def pool(**spec: object) -> Pool:
    body = {
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
        "kind": "PHPIPAMIPPool",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "endpoint": "http://phpipam/api",
            "appId": "capi",
            "subnet": "10.0.0.0/24",
            "credentialsRef": {"name": "creds"},
            **spec,
        },
    }
    return parse_pool(body)


def entry(address: str, owner: EntryOwner | None) -> Allocation:
    return Allocation(address, 24, None, "h", "r", owner=owner)


ENTRIES = [
    entry("10.0.0.2", EntryOwner(THERE, "ns/m1")),
    entry("10.0.0.3", EntryOwner(HERE, "ns/m2")),
    entry("10.0.0.4", EntryOwner("", "ns/m3")),  # the previous release: no cluster named
    entry("10.0.0.5", None),  # a person's
]


def test_warns_of_the_other_clusters_entries_and_names_the_fix() -> None:
    warning = other_clusters_warning(pool(), ENTRIES, HERE)
    assert warning is not None
    assert "1 entry of 1 other management cluster (cluster-b (1))" in warning
    assert "spec.hostnameSuffix" in warning and "HostnameTaken" in warning


def test_no_warning_with_a_suffix_or_without_other_clusters() -> None:
    suffixed = pool(hostnameSuffix="a")
    assert other_clusters_warning(suffixed, ENTRIES, HERE) is None
    ours = [e for e in ENTRIES if e.owner is None or e.owner.cluster_id != THERE]
    assert other_clusters_warning(pool(), ours, HERE) is None


def test_an_unknown_cluster_counts_every_clusters_entries() -> None:
    warning = other_clusters_warning(pool(), ENTRIES, None)
    assert warning is not None
    assert "2 entries of 2 management clusters (cluster-a (1), cluster-b (1))" in warning
    assert "IPAM_BRIDGE_CLUSTER_ID" in warning
