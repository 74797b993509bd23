"""Where sglpatch keeps its local state.

``$SGLPATCH_HOME`` if set, else ``$XDG_DATA_HOME/sglpatch`` (default ``~/.local/share/sglpatch``).
See docs/architecture.md for the layout below it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def sglpatch_home() -> Path:
    """The local state directory (not created here)."""
    env = os.environ.get("SGLPATCH_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "sglpatch"


def safe_component(name: str) -> str:
    """A host or version name made safe as one path component (no '/', no '..')."""
    cleaned = _SAFE.sub("_", name)
    if cleaned in ("", ".", ".."):
        cleaned = "_" + cleaned
    return cleaned
