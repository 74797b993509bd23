"""The DDTree modules as the patchset keeps them (not installed: ``new_files`` puts each module into
``sglang/srt/speculative/``, each kernel module of ``../kernels/`` into
``sglang/kernels/ops/speculative/``).

Installed, the modules import their Triton kernels the way SGLang's own speculative code does:
``from sglang.kernels.ops.speculative.ddtree_beam import beam_prune_triton``. So that the same
sources run here — tests and benches import ``patchsets.ddtree.modules.<module>``, with or without
SGLang — each ``sglang.kernels.ops.speculative.ddtree_<stage>`` name is bound in ``sys.modules`` to
this patchset's own kernel module ``patchsets.ddtree.kernels.ddtree_<stage>`` (the same module
object under both names). Binding loads nothing: a kernel module is executed on first use (it
imports Triton, and ``TRITON_INTERPRET`` must be read then, not at this import). Only the full
names are bound (``from ... import`` finds them without importing SGLang's packages above them);
none is bound where Triton is not installed, and a name already imported is left as it is.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

KERNELS_PACKAGE = "sglang.kernels.ops.speculative"


def _bind_kernels() -> None:
    if importlib.util.find_spec("triton") is None:
        return
    source = __name__.rpartition(".")[0] + ".kernels"
    for path in sorted((Path(__file__).resolve().parent.parent / "kernels").glob("ddtree_*.py")):
        alias, real = f"{KERNELS_PACKAGE}.{path.stem}", f"{source}.{path.stem}"
        if alias in sys.modules:
            continue
        module = sys.modules.get(real)
        if module is None:
            spec = importlib.util.find_spec(real)
            spec.loader = importlib.util.LazyLoader(spec.loader)
            module = importlib.util.module_from_spec(spec)
            sys.modules[real] = module
            spec.loader.exec_module(module)
            setattr(sys.modules[source], path.stem, module)
        sys.modules[alias] = module


_bind_kernels()
