"""ipam-bridge: a Cluster API IPAM provider backed by phpIPAM and Infoblox NIOS (kopf operator)."""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("ipam-bridge")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"
