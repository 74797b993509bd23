"""sglpatch: versioned patchsets for SGLang installs on remote GPU hosts.

The library a user can import; the ``sglpatch`` CLI is a thin layer over the ``service_*`` modules
(one per command; :mod:`.service` lists them), which compose the steps below (each one its own
module, see docs/architecture.md)::

    inventory → transport → discovery → mirror → patchset + applier → deploy → checks

``__all__`` is the public API; ``tests/unit/test_public_api.py`` keeps it complete and importable.
"""

from importlib import import_module
from typing import TYPE_CHECKING

# Each public name and the module it lives in: imported on first use (PEP 562), so that importing
# the package — the ``sglpatch`` script's first step, see :mod:`.entry` — costs almost nothing.
_WHERE = {
    "ApplyResult": "applier", "FileChange": "applier", "HunkReport": "applier", "apply_patch": "applier",
    "apply_series": "applier",
    "CheckReport": "checks", "CheckResult": "checks", "run_checks": "checks",
    "DeployPlan": "deploy", "DeployResult": "deploy", "RollbackResult": "deploy", "StatusReport": "deploy",
    "apply_to_host": "deploy", "host_status": "deploy", "plan_apply": "deploy", "rollback_host": "deploy",
    "HostInfo": "discovery", "discover": "discovery",
    **{name: "errors" for name in (
        "ApplyError", "CheckFailedError", "ConfigError", "DeployError", "DiscoveryError", "DriftError",
        "HostKeyError", "IdentityFileError", "InventoryError", "LockHeldError", "PatchsetError",
        "RemoteCommandError", "SglpatchError", "StateError", "TransportError", "UnsupportedVersionError")},
    "Host": "inventory", "Inventory": "inventory", "load_inventory": "inventory",
    "FileEntry": "manifest", "Manifest": "manifest", "read_record": "manifest",
    "Mirror": "mirror", "SnapshotResult": "mirror", "snapshot": "mirror",
    "Patchset": "patchset", "load_patchset": "patchset",
    "add_target": "patchset_write", "refresh_hashes": "patchset_write",
    "PortResult": "port", "port_series": "port",
    "CommandResult": "transport", "LocalTransport": "transport", "Transport": "transport", "connect": "transport",
    "WheelTree": "wheelcache", "pristine_tree": "wheelcache",
}


def __getattr__(name: str) -> object:
    """The public name ``name`` from its module (imported now, kept in the package)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:   # what type checkers and editors see: the same names, imported eagerly
    from .applier import ApplyResult, FileChange, HunkReport, apply_patch, apply_series
    from .checks import CheckReport, CheckResult, run_checks
    from .deploy import (DeployPlan, DeployResult, RollbackResult, StatusReport, apply_to_host,
                         host_status, plan_apply, rollback_host)
    from .discovery import HostInfo, discover
    from .errors import (ApplyError, CheckFailedError, ConfigError, DeployError, DiscoveryError,
                         DriftError, HostKeyError, IdentityFileError, InventoryError, LockHeldError,
                         PatchsetError, RemoteCommandError, SglpatchError, StateError, TransportError,
                         UnsupportedVersionError)
    from .inventory import Host, Inventory, load_inventory
    from .manifest import FileEntry, Manifest, read_record
    from .mirror import Mirror, SnapshotResult, snapshot
    from .patchset import Patchset, load_patchset
    from .patchset_write import add_target, refresh_hashes
    from .port import PortResult, port_series
    from .transport import CommandResult, LocalTransport, Transport, connect
    from .wheelcache import WheelTree, pristine_tree

__version__ = "0.1.0"

__all__ = [
    # inventory and transport
    "Host", "Inventory", "load_inventory", "Transport", "CommandResult", "LocalTransport", "connect",
    # discovery and mirror
    "HostInfo", "discover", "Mirror", "SnapshotResult", "snapshot", "FileEntry", "Manifest",
    "read_record", "WheelTree", "pristine_tree",
    # patchsets and the strict applier
    "Patchset", "load_patchset", "refresh_hashes", "add_target", "ApplyResult", "FileChange", "HunkReport",
    "apply_patch", "apply_series", "PortResult", "port_series",
    # deployment
    "DeployPlan", "DeployResult", "RollbackResult", "StatusReport", "apply_to_host", "plan_apply",
    "host_status", "rollback_host", "CheckReport", "CheckResult", "run_checks",
    # errors
    "SglpatchError", "ConfigError", "InventoryError", "PatchsetError", "UnsupportedVersionError",
    "ApplyError", "TransportError", "HostKeyError", "IdentityFileError", "RemoteCommandError", "DiscoveryError",
    "DriftError", "DeployError", "LockHeldError", "CheckFailedError", "StateError",
    "__version__",
]
