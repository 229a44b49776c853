"""The controller machinery, knowing nothing of IPAM or CAPI.

Work queue, informer cache and informers (list, then watch, in a thread), Lease election and
fencing, flow control per IPAM server, the Kubernetes gateway and log context; see
docs/architecture.md.
"""
