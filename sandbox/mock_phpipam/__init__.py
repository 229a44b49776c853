"""A phpIPAM-compatible REST server (aiohttp) for tests, the demo and local work."""

from mock_phpipam.app import create_app, phpipam_faults
from mock_phpipam.faults import FaultConfig, FaultInjector
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import ManualClock, Seed, Store

__all__ = [
    "FaultConfig",
    "FaultInjector",
    "ManualClock",
    "MockPhpipamServer",
    "Seed",
    "Store",
    "create_app",
    "phpipam_faults",
]
