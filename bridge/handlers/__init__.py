"""kopf handlers of ipam-bridge, loaded by ``ipam-bridge run`` (or ``kopf run -m bridge.handlers``).

Each handler is thin: it takes the operator context from ``memo.bridge``, calls a plain
function of `claims` or `pool_backends`, and turns the result into status, events and
kopf errors.
"""

# cache first: its event handlers run before the others of the same event (see its docstring).
from bridge.handlers import cache  # isort: skip
from bridge.handlers import claims, lifecycle, pools

__all__ = ["cache", "claims", "lifecycle", "pools"]
