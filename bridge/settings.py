"""Operator settings, read from the environment (prefix ``IPAM_BRIDGE_``) by pydantic-settings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal, Self

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from backends.flowcontrol import EndpointState, FlowControl, RequestRecord
from backends.retry import RetryPolicy

__all__ = [
    "DEPRECATED_NAMES",
    "ENV_PREFIX",
    "OTHER_ENVIRONMENT",
    "Settings",
    "deprecated_names_used",
]

#: The prefix of every setting's environment variable.
ENV_PREFIX = "IPAM_BRIDGE_"
#: Former names of settings, still read (a warning is logged at start-up when one is set):
#: ``former environment variable -> the setting's one name``. ``IPAM_BRIDGE_NAMESPACE_SCOPE``
#: was the clusterctl variable of ``IPAM_BRIDGE_NAMESPACE``.
DEPRECATED_NAMES: Mapping[str, str] = {
    "IPAM_BRIDGE_NAMESPACE_SCOPE": "IPAM_BRIDGE_NAMESPACE",
}

#: Environment variables the operator reads besides its settings (no ``IPAM_BRIDGE_``
#: prefix), and what each does: ``names -> description`` (the docs' settings reference
#: lists them).
OTHER_ENVIRONMENT: Mapping[str, str] = {
    "KUBECONFIG": "The kubeconfig of `ipam-bridge run`, `audit` and `check-pool` (its first "
    "file); without it, in a pod, the service account, else `~/.kube/config`.",
    "POD_NAME": "Names the replica: the leader election holder identity "
    "(`<POD_NAME>_<random>`) and the User-Agent of IPAM requests (the host name without it). "
    "The installs set it from the Pod's name.",
    "HTTPS_PROXY, HTTP_PROXY, NO_PROXY": "Proxies of the requests to the IPAMs (phpIPAM, "
    "Infoblox), and the hosts reached without one, as requests reads them (lower-case names "
    "too); read when a pool's IPAM client is made, not again for every request.",
    "REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE": "A CA bundle file trusted by the requests to an "
    "IPAM whose pool sets no `spec.tls.caSecretRef` (with one, only that bundle is trusted).",
}


def _names(name: str) -> AliasChoices:
    """Return the environment variables of a setting: its one name, then its former ones."""
    former = [old for old, new in DEPRECATED_NAMES.items() if new == name]
    return AliasChoices(name, *former)


def deprecated_names_used(environ: Mapping[str, str]) -> list[str]:
    """Return one warning per former setting name set (not empty) in ``environ``.

    Each names the variable to use instead, and says when the former one's value is ignored:
    the setting's one name, when set (even empty), wins (`pydantic.AliasChoices` order). Names
    are compared as pydantic-settings reads them (case-insensitively).
    """
    upper = {key.upper(): value for key, value in environ.items()}
    warnings = []
    for old, new in DEPRECATED_NAMES.items():
        if not upper.get(old):
            continue
        if new in upper and upper[new] != upper[old]:
            warnings.append(
                f"{old} is deprecated and ignored: {new} is set ({upper[new]!r}) and used"
            )
        else:
            warnings.append(f"{old} is deprecated: set {new} instead")
    return warnings


class Settings(BaseSettings):
    """Every knob of the operator; each maps to ``IPAM_BRIDGE_<NAME>`` (docs/reference/settings.md).

    A setting has one name; a former one (`DEPRECATED_NAMES`) is still read after it, and
    ``ipam-bridge run`` warns about it (`deprecated_names_used`). Every field has a
    ``description``: the docs' settings reference is generated from them.

    Durations are in seconds. Credentials are never settings: they come from the Secret each
    pool names.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", populate_by_name=True)

    namespace: str = Field(
        "",
        validation_alias=_names("IPAM_BRIDGE_NAMESPACE"),
        description="Serve only the claims, pools and Clusters of these namespaces "
        "(comma-separated; Global pools are served either way); empty serves all. "
        "`ipam-bridge run --namespace` and `--all-namespaces` override it.",
    )
    cluster_id: str = Field(
        "",
        description="This management cluster's identity, written as the owner of every IPAM "
        "entry it makes (with the claim's namespace/name): another cluster never adopts, "
        "releases or repairs it. Empty = the uid of namespace kube-system, read once at "
        "start-up. Never give two live clusters the same id.",
    )
    workers: int = Field(10, ge=1, le=200, description="Claims and pools handled at the same time.")
    backend_timeout_seconds: float = Field(
        10.0, gt=0, description="Connect and read timeout of each backend HTTP request."
    )
    retry_attempts: int = Field(
        5, ge=1, description="Tries of one backend call before the error goes to the object."
    )
    retry_max_delay_seconds: float = Field(
        5.0, gt=0, description="Longest wait between two tries of one backend call."
    )
    retry_total_seconds: float = Field(
        30.0,
        gt=0,
        description="Time budget of one backend call: tries, re-logins and the request in "
        "flight included (each request's timeout is cut to the time left).",
    )
    endpoint_failure_threshold: int = Field(
        5,
        ge=1,
        description="Consecutive requests to one IPAM endpoint without an answer (timeout, "
        "connection error, 502/504) after which its calls fail fast (circuit open).",
    )
    endpoint_cooldown_seconds: float = Field(
        10.0,
        gt=0,
        description="How long an endpoint's calls fail fast after its circuit opened; then "
        "one call probes it.",
    )
    endpoint_max_concurrent: int = Field(
        0,
        ge=0,
        description="Backend calls one IPAM endpoint may run at once; a call that finds no "
        "slot within 1 s fails fast (endpoint busy). 0 = half of the workers (at least 1).",
    )
    pool_refresh_seconds: float = Field(
        60.0, gt=0, description="How often each pool's status (usage, readiness) is refreshed."
    )
    requeue_seconds: float = Field(
        10.0, gt=0, description="Delay before an object is retried after a transient failure."
    )
    error_backoff_seconds: float = Field(
        0.005,
        gt=0,
        description="Delay before an object whose reconcile raised an unexpected error is "
        "tried again; doubled at each further error in a row.",
    )
    error_backoff_max_seconds: float = Field(
        1000.0, gt=0, description="The cap of that doubling (seconds)."
    )
    requeue_config_error_seconds: float = Field(
        60.0,
        gt=0,
        description="Delay before retrying after an error a person must fix "
        "(missing Secret, wrong credentials, unknown subnet).",
    )
    requeue_exhausted_seconds: float = Field(
        5.0,
        gt=0,
        description="While claims wait for an address, how often their pool asks its IPAM "
        "again (the waiting claims themselves poll nothing; one is woken when an address is "
        "free).",
    )
    quarantine_purge_seconds: float = Field(
        30.0,
        gt=0,
        le=30,
        description="How often the leader deletes the IPAM entries whose reuse grace period "
        "(addressReuseGracePeriodSeconds) ended; also done at start-up.",
    )
    resync_seconds: float = Field(
        300.0,
        ge=0,
        description="How often every claim is looked at again from its current state "
        "(the safety net of event-driven handling); 0 = never.",
    )
    audit_seconds: float = Field(
        300.0,
        ge=0,
        description="How often the leader compares each pool's IPAddresses with its entries "
        "in the IPAM (drift audit: missing entries registered again, conflicts and orphans "
        "reported); 0 = never.",
    )
    metrics_port: int = Field(
        8080, ge=0, le=65535, description="Port of the Prometheus /metrics endpoint; 0 = off."
    )
    metrics_address: str = Field("0.0.0.0", description="Address the /metrics endpoint listens on.")
    stall_seconds: float = Field(
        300.0,
        ge=0,
        description="Liveness fails when the work queue starts and finishes no reconcile "
        "for this many seconds while keys are due (hung workers, a blocked loop); 0 = never.",
    )
    watch_stall_seconds: float = Field(
        90.0,
        gt=0,
        description="A watch with no event and no bookmark (a real API server sends one "
        "every 60 s) for this many seconds is dead: its resource is listed again; /healthz "
        "fails when one stays so for twice as long.",
    )
    health_port: int = Field(
        8081, ge=0, le=65535, description="Port of kopf's liveness endpoint /healthz; 0 = off."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Log level (DEBUG adds kopf's per-object lines)."
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="Log line format: `text` (kopf's, for a person at a terminal) or `json` "
        "(one object per line, for a log collector; what the kustomize, Helm and clusterctl "
        "installs set).",
    )
    kube_connect_timeout_seconds: float = Field(
        5.0, gt=0, description="Connect timeout of each Kubernetes API request."
    )
    kube_read_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="Read timeout of each Kubernetes API request (the longest wait for bytes "
        "of an answer): a dead connection is an error and a retry, never a hang.",
    )
    leader_election: bool = Field(
        False,
        description="Run for the Lease `ipam-bridge` in the operator's namespace; only its "
        "holder handles claims and pools, the other replicas stand by (on in the Deployment "
        "and the chart; a single process needs none).",
    )
    leader_election_namespace: str = Field(
        "default",
        description="Namespace of the Lease; when unset, in a pod, the service account's "
        "namespace.",
    )
    leader_election_lease_seconds: int = Field(
        15,
        ge=2,
        description="How long a standby waits after the leader's last renew before it takes "
        "the Lease.",
    )
    leader_election_renew_deadline_seconds: float = Field(
        10.0,
        ge=1,
        description="How long the leader keeps trying to renew before it stops handling and "
        "exits (shorter than the lease).",
    )
    leader_election_retry_seconds: float = Field(
        2.0,
        ge=1,
        description="Time between two tries to take or renew the Lease (renew deadline > "
        "1.2 x this).",
    )
    peering_name: str = Field(
        "",
        description="Deprecated and ignored (a warning is logged when set): the operator runs "
        "without kopf peering.",
    )
    standalone: bool = Field(
        True,
        description="Deprecated and ignored (a warning is logged when set): the operator always "
        "runs without kopf peering, as `--standalone` did.",
    )

    @model_validator(mode="after")
    def _check_leader_election(self) -> Self:
        """Lease > renew deadline > 1.2 x retry period (as client-go and the official client)."""
        lease = self.leader_election_lease_seconds
        renew = self.leader_election_renew_deadline_seconds
        retry = self.leader_election_retry_seconds
        if lease <= renew:
            raise ValueError(
                f"IPAM_BRIDGE_LEADER_ELECTION_LEASE_SECONDS ({lease}) must be greater than "
                f"IPAM_BRIDGE_LEADER_ELECTION_RENEW_DEADLINE_SECONDS ({renew:g})"
            )
        if renew <= 1.2 * retry:
            raise ValueError(
                f"IPAM_BRIDGE_LEADER_ELECTION_RENEW_DEADLINE_SECONDS ({renew:g}) must be greater "
                f"than 1.2 x IPAM_BRIDGE_LEADER_ELECTION_RETRY_SECONDS ({retry:g})"
            )
        return self

    @property
    def kube_timeout(self) -> tuple[float, float]:
        """``(connect, read)`` timeout of each Kubernetes API request, in seconds."""
        return (self.kube_connect_timeout_seconds, self.kube_read_timeout_seconds)

    @property
    def namespaces(self) -> tuple[str, ...]:
        """The watched namespaces (``namespace`` split on commas); empty means all."""
        return tuple(ns.strip() for ns in self.namespace.split(",") if ns.strip())

    def flow_control(
        self,
        *,
        on_state: Callable[[str, EndpointState], None] | None = None,
        on_request: Callable[[RequestRecord], None] | None = None,
        fence: Callable[[], None] | None = None,
    ) -> FlowControl:
        """Return the flow control per IPAM endpoint these settings describe.

        Breaker threshold and cool-down, and the most works in flight per endpoint (0: half
        the workers). Refused logins are budgeted at 5 per 5 minutes per
        phpIPAM endpoint (phpIPAM blocks the operator's address after more than 10) and 3
        per Infoblox endpoint (NIOS locks the account after 5;
        `backends.infoblox.InfobloxConfig.login_limit`). ``fence`` is called before every
        IPAM request that is not a read (`backends.flowcontrol.FlowControl`).
        """
        return FlowControl(
            failure_threshold=self.endpoint_failure_threshold,
            cooldown_seconds=self.endpoint_cooldown_seconds,
            max_concurrent=self.endpoint_max_concurrent or max(1, self.workers // 2),
            on_state=on_state,
            on_request=on_request,
            fence=fence,
        )

    def retry_policy(self) -> RetryPolicy:
        """Return the backend retry policy these settings describe."""
        return RetryPolicy(
            attempts=self.retry_attempts,
            max_delay_seconds=self.retry_max_delay_seconds,
            total_seconds=self.retry_total_seconds,
        )
