"""SGLang platform plugin for the live tests: SGLang 0.5.21, 0.5.22 or 0.5.23 on a plain CPU.

Test support, not product code. SGLang finds it through its out-of-tree platform seam (entry-point
group ``sglang.srt.platforms``, name ``sglpatch_cpu``) and uses it only when the server runs with
``SGLANG_PLATFORM=sglpatch_cpu``; anywhere else :func:`activate` answers None, so installing it
beside a GPU SGLang changes nothing. See ``platform.py`` for what it does and why, and how it
adapts to each release's platform interface; see ``torchvision_hook.py`` for the one thing that
acts without ``SGLANG_PLATFORM`` (PyPI's CUDA torchvision made importable beside CPU torch).
"""

from __future__ import annotations

import os

PLATFORM_NAME = "sglpatch_cpu"
PLATFORM_CLASS = "sglpatch_cpu_platform.platform.CpuTestPlatform"


def activate() -> str | None:
    """Entry point: the platform class path when ``SGLANG_PLATFORM`` names this plugin, else None."""
    if os.environ.get("SGLANG_PLATFORM") != PLATFORM_NAME:
        return None
    return PLATFORM_CLASS
