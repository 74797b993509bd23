"""Timing helpers for the DDTree benches: CUDA-graph replay medians with CUDA events."""

from __future__ import annotations

import statistics
import time
from typing import Callable, List

import torch


def gpu_graph_median_us(fn: Callable[[], object], reps: int = 50, warmup: int = 3) -> float:
    """Capture fn in a CUDA graph (after eager warm-up) and return the median replay time (µs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times: List[float] = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(times)


def gpu_eager_median_us(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(times)


def cpu_median_us(fn: Callable[[], object], reps: int = 3, warmup: int = 1) -> float:
    """Median wall time (µs) of fn over ``reps`` calls after ``warmup`` untimed ones (a first
    call can pay one-off costs; single cold calls of the CPU heap on the H200 host swung between
    6.9 and 53 ms at bs 1 for similar work, 2026-11-30 third session)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)
