"""A mock of the Infoblox NIOS WAPI (aiohttp) for tests and local demos."""

from mock_infoblox.app import create_app, infoblox_faults
from mock_infoblox.errors import WAPIError
from mock_infoblox.server import MockInfobloxServer
from mock_infoblox.store import InfobloxStore, SearchFilter, UsedAddress

__all__ = [
    "InfobloxStore",
    "MockInfobloxServer",
    "SearchFilter",
    "UsedAddress",
    "WAPIError",
    "create_app",
    "infoblox_faults",
]
