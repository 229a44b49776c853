"""Clients for the external IPAM systems, behind one interface (`backends.base.IPAMBackend`).

Nothing in this package imports kopf or the Kubernetes client: a backend takes plain
configuration, talks HTTP to its IPAM and raises `backends.errors` exceptions.
"""
