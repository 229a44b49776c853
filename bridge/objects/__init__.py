"""The operator's Kubernetes objects as the CAPI IPAM contract and our API define them.

- `bridge.objects.client`: where claims, IPAddresses, pools, Clusters and Secrets live on
  the API (group, version, plural), over the generic gateway (`bridge.runtime.gateway`);
- `bridge.objects.cache`: the informer cache of them (parts and keys) and the informers of
  every one (`bridge.runtime.informer`), over the generic `bridge.runtime.store.Store`, and
  the expectations of our writes (`bridge.runtime.expectations`);
- `bridge.objects.keys`: the typed work-queue keys and wake tokens.

Typed values of the objects themselves: `bridge.models` (pydantic, as read) and
`bridge.capi` (the contract's shapes and conditions).
"""
