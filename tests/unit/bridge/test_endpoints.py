"""The operator's flow control per IPAM endpoint: settings, metrics hooks."""

from __future__ import annotations

from typing import cast

from backends.flowcontrol import EndpointState, RequestRecord
from backends.phpipam import PHPIPAMBackend
from backends.retry import RetryPolicy
from bridge.metrics import Metrics
from bridge.objects.client import ObjectClient
from bridge.operator import Operator
from bridge.reconcilers.context import ServedVersions
from bridge.reconcilers.pool_backends import build_backend, parse_pool
from bridge.settings import Settings


def test_settings_build_the_registry() -> None:
    registry = Settings(
        workers=4, endpoint_failure_threshold=3, endpoint_cooldown_seconds=7.5
    ).flow_control()
    assert registry.failure_threshold == 3
    assert registry.cooldown_seconds == 7.5
    assert registry.max_concurrent == 2  # 0 = half of the workers
    assert Settings(workers=1).flow_control().max_concurrent == 1
    assert Settings(endpoint_max_concurrent=3).flow_control().max_concurrent == 3
    assert registry.login_limit == 5 and registry.login_window_seconds == 300


def test_endpoint_state_and_requests_are_exported() -> None:
    metrics = Metrics()
    endpoint = "https://ipam.example.com:443"
    registry = Settings().flow_control(
        on_state=metrics.endpoint_changed, on_request=metrics.request_made
    )
    assert registry.on_state is not None and registry.on_request is not None
    registry.on_state(endpoint, EndpointState.OPEN)
    registry.record(RequestRecord(endpoint, "GET", "timeout", 10.0))
    registry.record(RequestRecord(endpoint, "GET", "200", 0.1))
    registry.record(RequestRecord(endpoint, "POST", "200", 0.1))

    def sample(name: str, **labels: str) -> float | None:
        value: float | None = metrics.registry.get_sample_value(name, labels)
        return value

    assert sample("ipam_bridge_backend_endpoint_state", endpoint=endpoint) == 1
    registry.on_state(endpoint, EndpointState.HALF_OPEN)
    assert sample("ipam_bridge_backend_endpoint_state", endpoint=endpoint) == 2
    requests = "ipam_bridge_backend_http_requests_total"
    assert sample(requests, endpoint=endpoint, result="timeout") == 1
    assert sample(requests, endpoint=endpoint, result="200") == 2


def test_context_feeds_the_metrics_and_backends_share_its_registry() -> None:
    ctx = Operator(
        settings=Settings(),
        kube=cast(ObjectClient, object()),
        versions=ServedVersions("v1beta2"),
        flow=Settings(workers=4).flow_control(),
    )
    assert ctx.flow.max_concurrent == 2
    endpoint = "http://127.0.0.1:8080"
    assert ctx.flow.on_state is not None
    ctx.flow.on_state(endpoint, EndpointState.OPEN)
    assert (
        ctx.metrics.registry.get_sample_value(
            "ipam_bridge_backend_endpoint_state", {"endpoint": endpoint}
        )
        == 1
    )
    pool = parse_pool(
        {
            "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
            "kind": "PHPIPAMIPPool",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {
                "endpoint": "http://127.0.0.1:8080/api",
                "appId": "capi",
                "subnetId": 7,
                "credentialsRef": {"name": "c"},
            },
        }
    )
    backends = [
        cast(
            PHPIPAMBackend,
            build_backend(
                pool,
                {"username": "u", "password": "p"},
                None,
                timeout_seconds=1,
                retry=RetryPolicy(),
                endpoints=ctx.flow,
            ),
        )
        for _ in range(2)
    ]
    assert all(b._transport.endpoints is ctx.flow for b in backends)
    assert backends[0]._transport.endpoint is backends[1]._transport.endpoint
