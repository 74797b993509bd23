"""Import hook installed at interpreter start (by ``sglpatch_cpu_platform.pth``, see
``tests/support/live_env.py``): before torchvision's ``_meta_registrations`` module runs, define
the operator schemas it needs (``torchvision_ops``). It imports nothing heavy itself, so every
other interpreter start in the venv stays as fast as before; torch is imported only when
torchvision is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_WATCHED = "torchvision._meta_registrations"


class _DefineOpsFirst(importlib.abc.MetaPathFinder):
    """Finds nothing; on the watched module's import it defines the missing ops, then lets the
    regular finders load the module."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname == _WATCHED:
            from sglpatch_cpu_platform import torchvision_ops

            torchvision_ops.define_missing_ops()
        return None


def install() -> None:
    """Put the hook first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _DefineOpsFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _DefineOpsFirst())


install()
