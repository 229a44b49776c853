"""kopf handlers of ipam-bridge, loaded by ``ipam-bridge run`` (or ``kopf run -m bridge.handlers``).

kopf runs the operator: start-up, clean-up, login and probes (`bridge.handlers.lifecycle`,
which starts the informers, the periodic `bridge.handlers.resync` and the work queue). It
watches no resource itself: every resource the reconcilers read is watched by an informer of
the runtime (`bridge.runtime.informer`), whose events the sinks of `bridge.handlers.claims`
and `bridge.handlers.pools` turn into queued keys; the decisions are the reconcilers'
(`bridge.reconcilers`).
"""

from bridge.handlers import claims, lifecycle, pools

__all__ = ["claims", "lifecycle", "pools"]
