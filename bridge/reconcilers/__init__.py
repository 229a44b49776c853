"""The decisions: claims, pools, control-plane endpoints and the drift audit.

They know nothing of kopf; see docs/architecture.md.
"""
