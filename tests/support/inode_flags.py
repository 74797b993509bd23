"""Inode flags for tests: ``chattr +i`` (immutable) and ``+a`` (append-only), as a user's host may
have them set on an install. Setting them needs root (CAP_LINUX_IMMUTABLE) and a filesystem that
keeps them (ext4, xfs, btrfs; not tmpfs everywhere, not overlayfs): a test that needs them is
skipped, saying which, where they cannot be set. Every flag a test set is cleared afterwards, also
when it fails — an immutable file left behind would break the next test's venv reset.

Use the ``chattr`` fixture (import it into the test module): ``chattr("+i", path)``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def chattr():
    """``set(flag, *paths)``: ``chattr flag paths``, or skip the test with the reason it cannot."""
    touched: list[Path] = []

    def set_flag(flag: str, *paths: Path) -> None:
        if os.geteuid() != 0:
            pytest.skip("setting inode flags (chattr +i/+a) needs root")
        if shutil.which("chattr") is None:
            pytest.skip("chattr is not installed (apt-get install e2fsprogs)")
        res = subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"the filesystem of {paths[0]} keeps no inode flags: chattr says {res.stderr.strip()}")
        touched.extend(Path(p) for p in paths)

    yield set_flag
    for p in reversed(touched):
        if p.exists():
            subprocess.run(["chattr", "-i", "-a", str(p)], check=True, capture_output=True)
