"""kopf handlers of ipam-bridge, loaded by ``ipam-bridge run`` (or ``kopf run -m bridge.handlers``).

Each handler is thin: it takes the operator context from ``memo.bridge``, calls a plain
function of `bridge.claims` or `bridge.pools`, and turns the result into status, events and
kopf errors.
"""

from bridge.handlers import claims, lifecycle, pools

__all__ = ["claims", "lifecycle", "pools"]
