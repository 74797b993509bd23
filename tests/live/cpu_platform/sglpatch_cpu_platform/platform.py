"""``CpuTestPlatform``: SGLang 0.5.21, 0.5.22 and 0.5.23 serving on a plain CPU, for the live tests.

Why an out-of-tree (OOT) platform and not SGLang's own CPU mode: the in-tree CPU engine
(``SGLANG_USE_CPU_ENGINE=1``) needs a CPU build of ``sgl_kernel`` that PyPI does not ship, and it
refuses DFLASH. Declared OOT, SGLang keeps ``is_cpu()`` False (no ``sgl_kernel`` import; fused ops
take ``forward_native``) and asks this class at each platform decision instead.

Hooks every release has (``SRTPlatform`` in 0.5.21, 0.5.22 and 0.5.23):

- ``supports_speculative_algorithm``: DFLASH and DDTREE (the sglpatch ddtree patchset's
  algorithm); every other algorithm is refused at argument validation, as on any OOT platform.
- ``get_speculative_cache_locs_fn``: a torch version of SGLang's Triton
  ``assign_extend_cache_locs`` (the KV slots of each request's ``[start, end)`` window, packed).
- ``init_backend``: ``Tensor.record_stream`` becomes a no-op for CPU tensors (DFlash's spec-v2
  worker calls it unconditionally; CPU has no streams and torch rejects the call).
- ``post_load_model``: SGLang's model runner hands ``input_embeds`` to extend forwards as bf16
  (``model_runner.py``: ``forward_batch.input_embeds.bfloat16()``), which is how DFlash feeds its
  draft block; a float32 model gets them back in its own dtype. 0.5.22 added this hook; on 0.5.21
  the plugin calls it itself (see below).

Where the releases' platform interfaces differ, the class adapts at import time to what the
installed SGLang offers (feature checks, not version strings):

==========================  ===========================================  ==========================
what                        0.5.21                                       0.5.22, 0.5.23
==========================  ===========================================  ==========================
graph capture / Triton      methods ``support_cuda_graph()``,            ``capabilities =
                            ``support_piecewise_cuda_graph()``           PlatformCapabilities(...)``
KV pool class               ``get_mha_kv_pool_cls()`` (base raises)      ``get_kv_pool_cls(kind=)``,
                                                                         None = in-tree class
token allocator class       ``get_paged_allocator_cls()`` asked for      None = in-tree allocator
                            every OOT pool, any page size (base raises)  (torch-native when
                                                                         ``supports_triton`` False)
after-load hook             none: wrapped around the runner's loader     ``post_load_model(model)``
                            (``_install_post_load_call``)
==========================  ===========================================  ==========================

0.5.21 has no ``supports_triton`` switch: with ``--attention-backend triton`` its req-to-token
writer and extend-position computation are Triton kernels (0.5.22+ takes their torch versions),
run interpreted under ``TRITON_INTERPRET=1``: slower, same results.

Serve with ``SGLANG_PLATFORM=sglpatch_cpu TRITON_INTERPRET=1``, ``--device cpu --dtype float32
--attention-backend triton --speculative-draft-attention-backend triton --disable-cuda-graph``.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import torch
from sglang.srt.platforms import interface as _interface
from sglang.srt.platforms.cpu import CpuDeviceMixin
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import SRTPlatform

# What the installed SGLang's platform interface offers (see the module docstring's table).
#: 0.5.22+: a declared ``capabilities`` struct (``supports_triton``, ``graph_capture``, ...);
#: 0.5.21 asks ``support_cuda_graph()`` / ``support_piecewise_cuda_graph()`` instead.
PlatformCapabilities: Any = getattr(_interface, "PlatformCapabilities", None)
HAS_CAPABILITIES = PlatformCapabilities is not None
#: 0.5.22+: one ``get_kv_pool_cls(kind=...)`` whose None means the in-tree pool; 0.5.21 calls
#: ``get_mha_kv_pool_cls()`` for every OOT MHA pool and its base raises NotImplementedError.
HAS_KV_POOL_KIND_HOOK = hasattr(SRTPlatform, "get_kv_pool_cls")
#: 0.5.22+: core calls ``post_load_model(model)`` after each load; 0.5.21 has no such hook.
HAS_POST_LOAD_HOOK = hasattr(SRTPlatform, "post_load_model")


def _base_answers_none(hook: str) -> bool:
    """Whether ``SRTPlatform``'s own ``hook()`` answers None ("no opinion: core picks its in-tree
    class", 0.5.22+) rather than raising NotImplementedError (0.5.21: an OOT platform must name
    one). ``SRTPlatform()`` is SGLang's own fallback platform, so building one is harmless."""
    try:
        return getattr(SRTPlatform(), hook)() is None
    except NotImplementedError:
        return False


#: 0.5.22+: None from ``get_paged_allocator_cls`` keeps the in-tree allocator (torch-native when
#: ``capabilities.supports_triton`` is False). 0.5.21 asks every OOT platform for its allocator
#: class, page size 1 included, and its base raises.
HAS_IN_TREE_ALLOCATOR_DEFAULT = _base_answers_none("get_paged_allocator_cls")

SPECULATIVE_ALGORITHMS = frozenset({"DFLASH", "DDTREE"})
DRAFT_ATTENTION_BACKENDS = frozenset({"triton", "torch_native"})


def assign_extend_cache_locs(
    *,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
    device: torch.device | str,
) -> torch.Tensor:
    """KV slots ``req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]`` for every
    request ``i``, packed one request after another.

    Args:
      req_pool_indices: [bs] int; req_to_token: [pool_rows, pool_len] int32 (slot table);
      start_offset / end_offset: [bs] int, the window of each request.
      batch_size: bs; draft_token_num: the buffer's width per request.
    Returns:
      [batch_size * draft_token_num] int64; entries past the packed total are left unset, as in
      SGLang's kernel.
    """
    out = torch.empty((batch_size * draft_token_num,), dtype=torch.int64, device=device)
    starts = start_offset[:batch_size].to(torch.int64)
    lengths = end_offset[:batch_size].to(torch.int64) - starts
    total = int(lengths.sum())
    if total == 0:
        return out
    rows = req_pool_indices[:batch_size].to(torch.int64).repeat_interleave(lengths)
    first = torch.cumsum(lengths, 0) - lengths                      # [bs] where each request starts
    within = torch.arange(total, device=out.device) - first.repeat_interleave(lengths)
    cols = starts.repeat_interleave(lengths) + within
    out[:total] = req_to_token[rows, cols].to(torch.int64)
    return out


def _cpu_tolerant_record_stream() -> None:
    """Make ``Tensor.record_stream`` a no-op on CPU tensors (idempotent)."""
    current = torch.Tensor.record_stream
    if getattr(current, "_sglpatch_cpu", False):
        return

    def record_stream(self: torch.Tensor, stream: object) -> None:
        if self.device.type == "cpu":
            return None
        return current(self, stream)

    record_stream._sglpatch_cpu = True  # type: ignore[attr-defined]
    torch.Tensor.record_stream = record_stream  # type: ignore[method-assign]


def _cast_input_embeds_back(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Wrap this model instance's ``forward`` so ``input_embeds`` arrive in ``dtype``.

    The runner calls ``model.forward(...)`` itself, so module hooks would not fire.
    """
    inner = model.forward

    def forward(*args: object, **kwargs: object):
        embeds = kwargs.get("input_embeds")
        if isinstance(embeds, torch.Tensor) and embeds.dtype != dtype:
            kwargs["input_embeds"] = embeds.to(dtype)
        return inner(*args, **kwargs)

    model.forward = forward  # type: ignore[method-assign]


@functools.cache
def _token_allocator_cls() -> type:
    """0.5.21's ``get_paged_allocator_cls`` answer: SGLang's page-size-1 ``TokenToKVPoolAllocator``
    (plain torch; what 0.5.22+ picks for an OOT platform at page size 1), built with the paged
    allocator's arguments that 0.5.21 passes to every OOT allocator class."""
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

    class CpuTokenToKVPoolAllocator(TokenToKVPoolAllocator):
        def __init__(self, size: int, page_size: int, dtype: torch.dtype, device: str,
                     kvcache: Any, need_sort: bool) -> None:
            if page_size != 1:
                # The paged allocator's extend/decode are Triton kernels with no torch path in
                # 0.5.21; the live tests serve at page size 1.
                raise ValueError(f"sglpatch_cpu on this SGLang serves page size 1 only, "
                                 f"not {page_size}")
            super().__init__(size, dtype, device, kvcache, need_sort)

    return CpuTokenToKVPoolAllocator


@functools.cache
def _mha_kv_pool_cls() -> type:
    """0.5.21's ``get_mha_kv_pool_cls`` answer: SGLang's ``MHATokenToKVPool``, moving KV slots
    (speculative accept compaction) with its torch-native move. 0.5.21 builds an OOT pool without
    ``enable_kv_cache_copy``, and the pool's fast move then refuses to run; 0.5.22+ builds the
    in-tree pool with it (a Triton copy, interpreted on CPU)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    class CpuMHATokenToKVPool(MHATokenToKVPool):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.use_native_move_kv_cache = True

    return CpuMHATokenToKVPool


def _install_post_load_call(post_load: Callable[[torch.nn.Module], None]) -> None:
    """0.5.21 only (no ``post_load_model`` hook): run ``post_load`` on every model the model
    runner loads, where 0.5.22+ calls the hook (right after ``load_model_with_memory_saver`` in
    ``ModelRunner.load_model``).

    ``init_backend`` runs while ``sglang.srt.model_executor.model_runner`` is being imported: the
    module has bound ``load_model_with_memory_saver`` by then, ``ModelRunner`` is not defined yet,
    and ``load_model`` looks the function up at call time. So the loader function is wrapped in
    its own module and rebound in the runner's. Raises if that seam is not there (idempotent).
    """
    from sglang.srt.model_executor.model_runner_components import load_model_utils

    runner = sys.modules.get("sglang.srt.model_executor.model_runner")
    original = load_model_utils.load_model_with_memory_saver
    if getattr(original, "_sglpatch_cpu", False):
        return
    if runner is None or getattr(runner, "load_model_with_memory_saver", None) is not original:
        raise RuntimeError("sglpatch_cpu: this SGLang has no post_load_model hook and its model "
                           "runner does not load through load_model_with_memory_saver; cannot "
                           "cast input_embeds back for float32 models")

    def load_model_with_memory_saver(*args: Any, **kwargs: Any) -> Any:
        loaded = original(*args, **kwargs)
        post_load(loaded.model)
        return loaded

    load_model_with_memory_saver._sglpatch_cpu = True  # type: ignore[attr-defined]
    load_model_utils.load_model_with_memory_saver = load_model_with_memory_saver
    runner.load_model_with_memory_saver = load_model_with_memory_saver


class CpuTestPlatform(CpuDeviceMixin, SRTPlatform):
    """A plain CPU as an SGLang out-of-tree platform (see the module docstring)."""

    _enum = PlatformEnum.OOT
    device_name = "cpu"
    device_type = "cpu"

    # No graph capture on CPU. Triton runs interpreted (TRITON_INTERPRET=1) where SGLang calls its
    # kernels, but core should take its torch-native allocator and slot writers where it has them.
    if HAS_CAPABILITIES:        # 0.5.22, 0.5.23
        capabilities = PlatformCapabilities(supports_triton=False, graph_capture=False)
    else:                       # 0.5.21 (these are its base defaults; stated, not inherited)
        def support_cuda_graph(self) -> bool:
            return False

        def support_piecewise_cuda_graph(self) -> bool:
            return False

    if not HAS_KV_POOL_KIND_HOOK:           # 0.5.21: an OOT platform names its KV pool
        def get_mha_kv_pool_cls(self) -> type:
            return _mha_kv_pool_cls()

    if not HAS_IN_TREE_ALLOCATOR_DEFAULT:   # 0.5.21: an OOT platform names its allocator
        def get_paged_allocator_cls(self) -> type:
            return _token_allocator_cls()

    def is_pin_memory_available(self, device: object = None) -> bool:
        return False

    def get_default_attention_backend(self) -> str:
        # DFLASH and DDTREE verify need a backend that runs TARGET_VERIFY (torch_native cannot).
        return "triton"

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        return "triton"

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        return algorithm in SPECULATIVE_ALGORITHMS

    def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
        return backend in DRAFT_ATTENTION_BACKENDS

    def get_speculative_cache_locs_fn(self):
        return assign_extend_cache_locs

    def init_backend(self) -> None:
        _cpu_tolerant_record_stream()
        if not HAS_POST_LOAD_HOOK:          # 0.5.21: call post_load_model ourselves
            _install_post_load_call(self.post_load_model)

    def post_load_model(self, model: torch.nn.Module) -> None:
        param = next((p for p in model.parameters() if p.is_floating_point()), None)
        if param is not None and param.dtype != torch.bfloat16:
            _cast_input_embeds_back(model, param.dtype)

    def get_dispatch_key_name(self) -> str:
        return "native"

    def get_torch_profiler_activity_str(self) -> str:
        return "CPU"

    def get_torch_profiler_activity(self) -> torch.profiler.ProfilerActivity:
        return torch.profiler.ProfilerActivity.CPU
