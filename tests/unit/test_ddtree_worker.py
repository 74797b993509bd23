"""CPU tests of DDTreeWorker's torch-only parts: start-up refusals and the draft-head top-K.

Real parts: torch.distributed process groups (gloo, one process per rank on loopback) for the
tensor-parallel top-K, and the DDTree core for the dense reference. The worker class itself needs
SGLang and a GPU server; its structure is checked against SGLang's DFlashWorkerV2 in
test_ddtree_worker_sglang.py, and its behaviour is unproven without a server.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from patchsets.ddtree.modules import ddtree_worker as Wk
from patchsets.ddtree.modules.ddtree_tree import draft_topk


# ---------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("name", ["TritonAttnBackend", "FlashInferAttnBackend"])
def test_supported_verify_backends_pass(name):
    Wk.check_verify_backend(name)


@pytest.mark.parametrize(
    "name",
    ["FlashAttentionBackend", "FlashAttention4Backend", "TRTLLMHAAttnBackend", "AiterAttnBackend",
     "FlashInferMLAAttnBackend", "TorchNativeAttnBackend"],
)
def test_other_verify_backends_are_refused_naming_the_supported_ones(name):
    with pytest.raises(ValueError) as err:
        Wk.check_verify_backend(name)
    msg = str(err.value)
    assert name in msg and "--attention-backend triton" in msg and "--attention-backend flashinfer" in msg
    assert "chain" in msg


def test_chain_only_triton_kernel_is_refused():
    with pytest.raises(ValueError, match="SGLANG_ENABLE_SPLITKV_VERIFY"):
        Wk.check_verify_backend("TritonAttnBackend", chain_only_kernel=True)


def test_dp_attention_and_non_plain_drafts_are_refused():
    Wk.check_parallel_layout(attn_dp_enabled=False)
    with pytest.raises(ValueError, match="dp-attention"):
        Wk.check_parallel_layout(attn_dp_enabled=True)
    Wk.check_draft_head(has_selector=False, has_lilicorr=False, is_domino=False)
    with pytest.raises(ValueError, match="selector / Domino"):
        Wk.check_draft_head(has_selector=True, has_lilicorr=False, is_domino=True)


class _Parallel:
    """SGLang's ``get_parallel()`` context in miniature: an unknown name raises AttributeError, as
    ``ParallelContext.__getattr__`` does (0.5.21 publishes no ``attn_dp_enabled``)."""

    def __init__(self, **names):
        self.__dict__.update(names)


@pytest.mark.parametrize("on", [False, True])
def test_dp_attention_is_read_from_either_releases_name(on):
    assert Wk.attn_dp_enabled(_Parallel(attn_dp_enabled=on, enable_dp_attention=not on)) is on   # 0.5.22+
    assert Wk.attn_dp_enabled(_Parallel(enable_dp_attention=on)) is on                            # 0.5.21
    with pytest.raises(AttributeError):
        Wk.attn_dp_enabled(_Parallel())


def test_lm_head_checks():
    w = torch.zeros(8, 4, dtype=torch.bfloat16)
    Wk.check_lm_head(w, num_added=0, tp_size=1, has_from_topk=False)
    with pytest.raises(ValueError, match="dense"):
        Wk.check_lm_head(torch.zeros(8, 4, dtype=torch.int8), num_added=0, tp_size=1, has_from_topk=False)
    with pytest.raises(ValueError, match="dense"):
        Wk.check_lm_head(None, num_added=0, tp_size=1, has_from_topk=False)
    with pytest.raises(ValueError, match="LoRA"):
        Wk.check_lm_head(w, num_added=3, tp_size=1, has_from_topk=False)
    with pytest.raises(ValueError, match="build_ddtree_from_topk"):
        Wk.check_lm_head(w, num_added=0, tp_size=2, has_from_topk=False)
    Wk.check_lm_head(w, num_added=0, tp_size=2, has_from_topk=True)


def test_captured_verify_width_check():
    class Runner:
        captured_req_width = 65

    Wk.check_captured_verify_width(None, 65)           # no graphs (--disable-cuda-graph)
    Wk.check_captured_verify_width(Runner(), 65)
    with pytest.raises(RuntimeError, match="captured 65 tokens wide.*budget \\+ 1 = 17"):
        Wk.check_captured_verify_width(Runner(), 17)


class _StandInGraphRunner:
    """Stands in for SGLang's decode CUDA graph runner (none can be built without a GPU): its
    ``can_run_graph`` is the uniform-width invariant of 0.5.21 - 0.5.23's, reading only what the
    invariant reads; ``invariant`` False stands for a runner that would replay any width."""

    def __init__(self, captured_req_width: int, invariant: bool = True):
        self.captured_req_width = captured_req_width
        self.invariant = invariant

    def can_run_graph(self, forward_batch):
        if forward_batch.replace_embeds is not None:
            return False
        if self.invariant and forward_batch.spec_info.num_tokens_per_req != self.captured_req_width:
            return False
        return forward_batch.batch_size <= 64      # reads the batch further: a stand-in batch raises


def test_a_schedule_of_several_widths_runs_beside_cuda_graphs_other_widths_eager():
    """Revision 9: the graphs replay the server budget's width; a smaller tree or a chain step
    verifies eagerly, as SGLang's runner does by itself for a width it did not capture (probed on
    the runner). Refused: a runner without that fallback, and a chain step whose block width is
    the captured one (budget B - 1: the tree-mask graph would replay without a mask)."""
    from patchsets.ddtree.modules.ddtree_budget import parse_schedule

    runner = _StandInGraphRunner(17)
    several = parse_schedule("1:16,4:3", floor=3, ceiling=16)
    assert Wk.replays_only_its_width(runner)
    assert not Wk.replays_only_its_width(_StandInGraphRunner(17, invariant=False))   # reads further: raises
    assert not Wk.replays_only_its_width(object())                                   # no captured width
    assert Wk.check_widths_beside_graphs(several, None, block_size=4) == []          # no graphs
    assert Wk.check_widths_beside_graphs(None, runner, block_size=4) == []           # no schedule
    assert Wk.check_widths_beside_graphs(parse_schedule("1:99", floor=3, ceiling=16), runner, block_size=4) == []
    said = Wk.check_widths_beside_graphs(several, runner, block_size=4)
    assert said == ["DDTREE: the target's CUDA graphs replay the verify at budget 16 (17 tokens per request); "
                    "steps at budgets [3] verify eagerly (a width the graphs were not captured at)."]
    with_chain = parse_schedule("1:16,8:chain", floor=3, ceiling=16)
    assert "budgets [chain] verify eagerly" in Wk.check_widths_beside_graphs(with_chain, runner, block_size=4)[0]
    with pytest.raises(ValueError, match="would replay a graph captured at another verify width"):
        Wk.check_widths_beside_graphs(several, _StandInGraphRunner(17, invariant=False), block_size=4)
    # budget 3 = B - 1: the chain's 4 tokens are the captured width, captured with the tree mask
    with pytest.raises(ValueError, match=r"budgets \[chain, 3\] with --speculative-ddtree-budget 3 = block size - 1"):
        Wk.check_widths_beside_graphs(parse_schedule("1:3,8:chain", floor=3, ceiling=3),
                                      _StandInGraphRunner(4), block_size=4)


def test_chain_steps_follow_the_schedule_and_have_no_tree_sizes():
    """step_budget / step_sizes read only the worker's schedule and sizes (no SGLang needed)."""
    from types import SimpleNamespace

    from patchsets.ddtree.modules.ddtree_budget import CHAIN, parse_schedule
    from patchsets.ddtree.modules.ddtree_info import DDTreeSizes

    w = SimpleNamespace(ddtree_sizes=DDTreeSizes(4, 16, 16), budget_planner=None,
                        budget_schedule=parse_schedule("1:16,2:chain,4:8", floor=3, ceiling=16))
    assert [Wk.DDTreeWorker.step_budget(w, b) for b in (1, 2, 3, 4, 9)] == [16, CHAIN, CHAIN, 8, 8]
    assert Wk.DDTreeWorker.step_sizes(w, 8).budget == 8 and Wk.DDTreeWorker.step_sizes(w, 16).budget == 16
    assert Wk.DDTreeWorker.step_sizes(w, 8).topk == 8
    with pytest.raises(ValueError, match="chain step"):
        Wk.DDTreeWorker.step_sizes(w, CHAIN)
    fixed = SimpleNamespace(ddtree_sizes=DDTreeSizes(4, 16, 16), budget_planner=None, budget_schedule=None)
    assert Wk.DDTreeWorker.step_budget(fixed, 64) == 16


def test_auto_budget_feeds_the_planner_from_step_intervals_and_host_accept_lengths():
    """With ``auto`` the worker times the interval between decode steps, reads accept lengths only
    once they are on the host (and the copy's event says done), and voids an interval with a
    prefill in between. The worker's own bookkeeping, with SGLang's result objects stood in for
    (no SGLang needed: the fake is the GenerationBatchResult, named as such)."""
    import collections
    from types import SimpleNamespace

    from patchsets.ddtree.modules.ddtree_budget import CHAIN, AutoBudgetPlanner

    planner = AutoBudgetPlanner(3, 16)
    w = SimpleNamespace(budget_planner=planner, budget_schedule=None, _last_decode=None,
                        _pending_accepts=collections.deque(maxlen=16), _logged_plan=0, _ddtree_tp_rank=0,
                        _budgets_tried=set())
    w._feed_planner = lambda now: Wk.DDTreeWorker._feed_planner(w, now)

    class FakeGenerationBatchResult:
        def __init__(self, lens, done=True):
            self.accept_lens = lens
            self.copy_done = SimpleNamespace(query=lambda: done)

    assert Wk.DDTreeWorker.step_budget(w, 1) == CHAIN            # nothing measured: chain first
    w._pending_accepts.append((CHAIN, FakeGenerationBatchResult(torch.tensor([2, 3]))))
    w._pending_accepts.append((CHAIN, FakeGenerationBatchResult(torch.tensor([4]), done=False)))
    Wk.DDTreeWorker.step_budget(w, 1)
    assert planner._accept[CHAIN].count == 1 and planner._accept[CHAIN].value == 2.5
    assert len(w._pending_accepts) == 1                           # its copy is not done: waits
    assert planner._seen[(1, CHAIN)] == 1                         # one interval (dropped: warm-up)
    w._last_decode = None                                         # a prefill came in between
    Wk.DDTreeWorker.step_budget(w, 1)
    assert planner._seen[(1, CHAIN)] == 1
    assert w._budgets_tried == {(1, CHAIN)}                       # logged once per (bucket, budget)


def test_auto_runs_beside_cuda_graphs_other_widths_eager():
    from patchsets.ddtree.modules.ddtree_budget import AutoBudgetPlanner

    assert Wk.check_widths_beside_graphs(None, None, AutoBudgetPlanner(3, 16), block_size=4) == []   # eager
    said = Wk.check_widths_beside_graphs(None, _StandInGraphRunner(17), AutoBudgetPlanner(3, 16), block_size=4)
    assert "budgets [chain, 3, 7, 15] verify eagerly" in said[0], said
    with pytest.raises(ValueError, match=r"auto chooses among budgets \[chain, 3, 7, 15, 16\].*--disable-cuda-graph"):
        Wk.check_widths_beside_graphs(None, _StandInGraphRunner(17, invariant=False), AutoBudgetPlanner(3, 16),
                                      block_size=4)
    # auto up to B - 1 chooses between the chain and the floor tree, both the captured width
    with pytest.raises(ValueError, match="would replay them without one"):
        Wk.check_widths_beside_graphs(None, _StandInGraphRunner(4), AutoBudgetPlanner(3, 3), block_size=4)


def test_start_up_checks_read_only_what_sglang_has_built_by_then():
    """SGLang 0.5.23 builds the draft worker before the attention backends and the CUDA graphs:
    the constructor must not read them (revision 2 did, and every DDTREE server start failed);
    the live tests (tests/live/) prove the start itself."""
    import ast
    import inspect
    import textwrap

    cls = next(n for n in ast.walk(ast.parse(inspect.getsource(Wk))) if isinstance(n, ast.ClassDef)
               and n.name == "DDTreeWorker")
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    read = {name: {n.attr for n in ast.walk(f) if isinstance(n, ast.Attribute)}   # x.attr, getattr(x, "attr")
            | {n.value for n in ast.walk(f) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            for name, f in methods.items()}
    assert not read["__init__"] & {"attn_backend", "decode_cuda_graph_runner"}, textwrap.shorten(str(read["__init__"]), 200)
    assert "attn_backend" in read["init_attention_backends"]
    assert "decode_cuda_graph_runner" in read["init_cuda_graphs"]


def test_worker_needs_sglang():
    if Wk.SGLANG_WORKER_AVAILABLE:
        pytest.skip("SGLang imports here; construction needs a GPU server instead")
    with pytest.raises(ImportError, match="SGLang"):
        Wk.DDTreeWorker(None, 0, 0, None)


# ------------------------------------------------------------------------- draft-head top-K
def head(seed, T=14, H=8, V=50, pad=6, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g).to(dtype)
    weight = torch.randn(V + pad, H, generator=g).to(dtype)  # last `pad` rows: shard padding
    weight[V:] = 100.0  # would win every argmax if padding were not sliced off
    return hidden, weight, V


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draft_head_topk_single_rank_equals_dense_and_ignores_padding(dtype):
    hidden, weight, V = head(1, dtype=dtype)
    dense = Wk.draft_head_logits(hidden, weight, V)
    assert dense.shape == (14, V)
    _, ids, lse = draft_topk(dense.unsqueeze(0), 9)
    for chunk in (3, 1000):
        c = Wk.draft_head_topk(hidden, weight, num_org=V, vocab_start=0, k=9, chunk_rows=chunk)
        assert torch.equal(c.ids, ids[0])
        if chunk >= hidden.shape[0]:  # one matmul over all rows: the dense computation itself
            assert torch.equal(c.lse, lse[0])
        else:  # a BLAS may sum a 3-row matmul in another order than a 14-row one (1 ulp on AMD EPYC)
            torch.testing.assert_close(c.lse, lse[0])
        assert int(c.ids.max()) < V


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Gloo:
    """The one GroupCoordinator method the worker calls, over a real gloo process group."""

    def all_gather_into_tensor(self, out, inp):
        dist.all_gather_into_tensor(out, inp)


def _rank_main(rank, world, port, seed, k, queue):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        hidden, weight, V = head(seed, dtype=torch.bfloat16)
        per = -(-V // world)
        lo, hi = rank * per, min(V, (rank + 1) * per)
        shard = torch.cat([weight[lo:hi], torch.full((3, weight.shape[1]), 100.0, dtype=weight.dtype)])
        c = Wk.draft_head_topk(
            hidden, shard, num_org=hi - lo, vocab_start=lo, k=k, world_size=world,
            all_gather=Wk._group_all_gather(_Gloo(), world), chunk_rows=5,
        )
        # plain lists: a tensor in a Queue is shared through a handle this process must outlive
        queue.put((rank, c.values.tolist(), c.ids.tolist(), c.lse.tolist()))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_draft_head_topk_over_real_process_groups_equals_dense(world):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    k, seed = 7, 5
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, seed, k, queue)) for r in range(world)]
    for p in procs:
        p.start()
    got = sorted((queue.get(timeout=120) for _ in range(world)), key=lambda t: t[0])
    results = [(r, torch.tensor(v, dtype=torch.float32), torch.tensor(i, dtype=torch.int64),
                torch.tensor(lse, dtype=torch.float32)) for r, v, i, lse in got]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    hidden, weight, V = head(seed, dtype=torch.bfloat16)
    dense = Wk.draft_head_logits(hidden, weight, V)
    _, ids, lse = draft_topk(dense.unsqueeze(0), k)
    for _, values, got_ids, got_lse in results:
        assert torch.equal(got_ids, results[0][2]) and torch.equal(values, results[0][1])
        assert torch.equal(got_lse, results[0][3])
        assert torch.equal(got_ids, ids[0])
        assert torch.equal(values, torch.gather(dense.float(), 1, ids[0]))
        assert torch.allclose(got_lse, lse[0], atol=1e-4, rtol=0)


# -- revision 13: auto by default ------------------------------------------------------------------
def test_auto_at_budget_b_minus_1_beside_graphs_drops_the_chain_instead_of_refusing():
    """auto is the default from revision 13, and budget B - 1 with CUDA graphs a valid server: the
    planner drops chain steps (their width is the captured one) rather than stopping the start;
    without graphs, or at a wider budget, it keeps them."""
    from types import SimpleNamespace

    from patchsets.ddtree.modules.ddtree_budget import CHAIN, AutoBudgetPlanner
    from patchsets.ddtree.modules.ddtree_info import DDTreeSizes

    def worker(budget):
        return SimpleNamespace(budget_planner=AutoBudgetPlanner(3, budget), ddtree_sizes=DDTreeSizes(4, budget, budget),
                               _ddtree_tp_rank=1)

    w = worker(3)
    Wk.DDTreeWorker._auto_without_chain_beside_graphs(w, _StandInGraphRunner(4))
    assert w.budget_planner.candidates == (3,)
    assert Wk.check_widths_beside_graphs(None, _StandInGraphRunner(4), w.budget_planner, block_size=4) == []
    eager = worker(3)
    Wk.DDTreeWorker._auto_without_chain_beside_graphs(eager, None)               # no graphs: chain kept
    assert CHAIN in eager.budget_planner.candidates
    wide = worker(16)
    Wk.DDTreeWorker._auto_without_chain_beside_graphs(wide, _StandInGraphRunner(17))
    assert CHAIN in wide.budget_planner.candidates                               # chain's width is not captured


def test_a_failed_width_capture_is_eager_on_tp1_and_stops_a_tp2_start(monkeypatch):
    """A narrower width's verify graphs fail to capture (stand-ins: SGLang's spec config and graph
    runner need a GPU server). TP 1: that width and the wider ones verify eagerly, the start goes
    on; TP 2: the start stops naming the way out (the ranks must capture alike)."""
    import sys
    from types import ModuleType, SimpleNamespace

    ctx = ModuleType("sglang.srt.runtime_context")
    ctx.get_spec = lambda: SimpleNamespace(speculative_ddtree_graph_memory=2.0)
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", ctx)
    built = []

    def build(runner, n, graph_runner_cls=None):
        built.append(n)
        if n == 7:
            raise RuntimeError("CUDA error: out of memory")
        return Wk.VerifyWidthState(n, n + 1, object(), object())

    monkeypatch.setattr(Wk, "build_verify_width_state", build)

    def worker(tp):
        return SimpleNamespace(_tree_budgets=lambda: [3, 7, 15, 16], ddtree_sizes=SimpleNamespace(budget=16),
                               target_worker=SimpleNamespace(model_runner=object()), _free_device_gib=lambda: 10.0,
                               _tp_size=tp, _verify_states={}, graph_width_plan=None)

    w = worker(1)
    Wk.DDTreeWorker._build_verify_states(w, _StandInGraphRunner(17))
    assert built == [3, 7] and sorted(w._verify_states) == [3]
    assert w.graph_width_plan.failed == ((7, "RuntimeError: CUDA error: out of memory"),)
    assert w.graph_width_plan.skipped == (15,)
    built.clear()
    with pytest.raises(RuntimeError, match="--speculative-ddtree-graph-memory 0"):
        Wk.DDTreeWorker._build_verify_states(worker(2), _StandInGraphRunner(17))
    assert built == [3, 7]
    # without graphs (CPU, --disable-cuda-graph): a backend that cannot be built leaves that width on
    # the server budget's backend (sized for the widest tree) and the others are still built
    built.clear()
    eager = worker(2)
    Wk.DDTreeWorker._build_verify_states(eager, None)
    assert built == [3, 7, 15] and sorted(eager._verify_states) == [3, 15] and eager.graph_width_plan is None
