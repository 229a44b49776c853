"""kopf handlers of ipam-bridge, loaded by ``ipam-bridge run`` (or ``kopf run -m bridge.handlers``).

Each handler is thin: it feeds the operator's cache and queues keys (`bridge.handlers.cache`,
`bridge.handlers.claims`, `bridge.handlers.pools`), or starts and stops the operator
(`bridge.handlers.lifecycle`, which runs the periodic `bridge.handlers.resync` and the
informers of claims and IPAddresses, whose events `bridge.handlers.claims.ClaimEvents`
turns into queued keys); the decisions are the reconcilers' (`bridge.reconcilers`).
One handler per resource and event, so the order of these imports does not matter.
"""

from bridge.handlers import cache, claims, lifecycle, pools

__all__ = ["cache", "claims", "lifecycle", "pools"]
