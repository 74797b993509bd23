"""Let PyPI's torchvision import beside CPU torch.

SGLang (0.5.21 to 0.5.23) imports ``torchvision.transforms`` at start-up even for text models.
PyPI's torchvision 0.28.0 is a CUDA build: its ``_C`` extension does not load with CPU torch, so its
operators are never defined, and ``torchvision/_meta_registrations.py`` then fails at import on its
two unguarded ``torch.library.register_fake("torchvision::nms" / "::qnms")`` decorators
("operator torchvision::nms does not exist"). Defining those two schemas first (what ``_C`` would
have done; no kernel is registered, so calling them still fails loudly) lets the import go on.
Nothing on the text-generation path calls them.
"""

from __future__ import annotations

import torch

# The two operators torchvision 0.28.0 registers fake kernels for without checking that its
# extension loaded; schemas as torchvision's C++ library declares them.
_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARY: torch.library.Library | None = None   # kept alive: dropping it undefines the schemas


def _defined(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
    except RuntimeError:
        return False
    return True


def define_missing_ops() -> list[str]:
    """Define the schemas of ``torchvision::nms`` / ``::qnms`` that are not defined yet.

    Returns the names it defined ([] when torchvision's extension loaded, or on a second call).
    Must run before ``import torchvision``; harmless after it.
    """
    global _LIBRARY
    missing = [name for name in _SCHEMAS if not _defined(name)]
    if not missing:
        return []
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library("torchvision", "FRAGMENT")
    for name in missing:
        _LIBRARY.define(_SCHEMAS[name])
    return missing
