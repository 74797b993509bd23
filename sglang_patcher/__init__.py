"""sglpatch: versioned patchsets for SGLang installs on remote GPU hosts.

The library a user can import; the ``sglpatch`` CLI is a thin layer over the ``service_*`` modules
(one per command; :mod:`.service` lists them), which compose the steps below (each one its own
module, see docs/architecture.md)::

    inventory → transport → discovery → mirror → patchset + applier → deploy → checks

``__all__`` is the public API; ``tests/unit/test_public_api.py`` keeps it complete and importable.
"""

from .applier import ApplyResult, FileChange, HunkReport, apply_patch, apply_series
from .checks import CheckReport, CheckResult, run_checks
from .deploy import (DeployPlan, DeployResult, RollbackResult, StatusReport, apply_to_host,
                     host_status, plan_apply, rollback_host)
from .discovery import HostInfo, discover
from .errors import (ApplyError, CheckFailedError, ConfigError, DeployError, DiscoveryError,
                     DriftError, HostKeyError, IdentityFileError, InventoryError, LockHeldError, PatchsetError,
                     RemoteCommandError, SglpatchError, StateError, TransportError,
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
