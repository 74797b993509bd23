"""Where sglpatch keeps its local state.

``$SGLPATCH_HOME`` if set, else ``$XDG_DATA_HOME/sglpatch`` (default ``~/.local/share/sglpatch``).
See docs/architecture.md for the layout below it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import ConfigError

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def sglpatch_home() -> Path:
    """The local state directory (not created here).

    Raises ConfigError when ``$SGLPATCH_HOME`` is a relative path (it would move with the
    current directory) or names something that exists and is not a directory."""
    env = os.environ.get("SGLPATCH_HOME")
    if env:
        home = Path(env).expanduser()
        if not home.is_absolute():
            raise ConfigError(f"SGLPATCH_HOME must be an absolute path, got {env!r}",
                              hint=f"export SGLPATCH_HOME={Path.cwd() / home}  (or unset it for "
                                   "~/.local/share/sglpatch)")
        if home.exists() and not home.is_dir():
            raise ConfigError(f"SGLPATCH_HOME={env} is not a directory",
                              hint="point SGLPATCH_HOME at a directory (it is created if missing), "
                                   "or unset it")
        return home
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "sglpatch"


def safe_component(name: str) -> str:
    """A host or version name made safe as one path component (no '/', no '..')."""
    cleaned = _SAFE.sub("_", name)
    if cleaned in ("", ".", ".."):
        cleaned = "_" + cleaned
    return cleaned
