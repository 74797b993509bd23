"""``CpuTestPlatform``: SGLang 0.5.23 serving on a plain CPU, for the live tests.

Why an out-of-tree (OOT) platform and not SGLang's own CPU mode: the in-tree CPU engine
(``SGLANG_USE_CPU_ENGINE=1``) needs a CPU build of ``sgl_kernel`` that PyPI does not ship, and it
refuses DFLASH. Declared OOT, SGLang keeps ``is_cpu()`` False (no ``sgl_kernel`` import; fused ops
take ``forward_native``) and asks this class at each platform decision instead.

What it changes, hook by hook (each is an SGLang 0.5.23 ``SRTPlatform`` hook):

- ``supports_speculative_algorithm``: DFLASH and DDTREE (the sglpatch ddtree patchset's
  algorithm); every other algorithm is refused at argument validation, as on any OOT platform.
- ``get_speculative_cache_locs_fn``: a torch version of SGLang's Triton
  ``assign_extend_cache_locs`` (the KV slots of each request's ``[start, end)`` window, packed).
- ``init_backend``: ``Tensor.record_stream`` becomes a no-op for CPU tensors (DFlash's spec-v2
  worker calls it unconditionally; CPU has no streams and torch rejects the call).
- ``post_load_model``: SGLang's model runner hands ``input_embeds`` to extend forwards as bf16
  (``model_runner.py``: ``forward_batch.input_embeds.bfloat16()``), which is how DFlash feeds its
  draft block; a float32 model gets them back in its own dtype.

Serve with ``SGLANG_PLATFORM=sglpatch_cpu TRITON_INTERPRET=1``, ``--device cpu --dtype float32
--attention-backend triton --speculative-draft-attention-backend triton --disable-cuda-graph``.
"""

from __future__ import annotations

import torch
from sglang.srt.platforms.cpu import CpuDeviceMixin
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import PlatformCapabilities, SRTPlatform

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


class CpuTestPlatform(CpuDeviceMixin, SRTPlatform):
    """A plain CPU as an SGLang out-of-tree platform (see the module docstring)."""

    _enum = PlatformEnum.OOT
    device_name = "cpu"
    device_type = "cpu"
    # Triton runs interpreted (TRITON_INTERPRET=1) where SGLang calls its kernels, but core must
    # take its torch-native allocator and slot writers; no graph capture on CPU.
    capabilities = PlatformCapabilities(supports_triton=False, graph_capture=False)

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
