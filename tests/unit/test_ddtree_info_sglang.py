"""``sglang_greedy_accept`` drives SGLang 0.5.23's own tree-verify kernel on our trees.

Real parts: the sglang 0.5.23 wheel's ``verify_tree_greedy_triton`` (run by Triton's CPU
interpreter) and, where SGLang's verify input imports, its ``DFlashVerifyInput`` as the base of
``DDTreeVerifyInput``. Skipped unless the environment provides them, e.g.::

    python -m venv --system-site-packages /tmp/sgl && /tmp/sgl/bin/pip install --no-deps \
        triton==3.8.0 psutil pybase64 starlette msgspec pyzmq aiohttp multidict yarl propcache \
        aiohappyeyeballs aiosignal frozenlist
    TRITON_INTERPRET=1 PYTHONPATH=<unzipped sglang-0.5.23 wheel>:. /tmp/sgl/bin/python -m pytest \
        tests/unit/test_ddtree_info_sglang.py

(the JIT CUDA path of ``verify_tree_greedy_func`` is checked on the H200 by tests/gpu).
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.sglang

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 to run SGLang's Triton kernel on CPU", allow_module_level=True)
spec_tree = pytest.importorskip("sglang.kernels.ops.speculative.spec_tree")

from patchsets.ddtree.modules import ddtree_info as D  # noqa: E402
from patchsets.ddtree.modules.ddtree_accept import greedy_accept  # noqa: E402
from patchsets.ddtree.modules.ddtree_tree import build_ddtree  # noqa: E402


def batch(seed, bs, N, L=6, V=30):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(bs, L, V, generator=g) * (1 + 3 * torch.rand(bs, L, 1, generator=g))
    rb = torch.randint(1, N + 1, (bs,), generator=g)
    tree = build_ddtree(x, torch.randint(0, V, (bs,), generator=g), N, max(1, N // 3),
                        request_budget=rb, use_triton=False)
    N1 = N + 1
    child = tree.retrieve_next_token.clamp(min=0)
    hop = torch.randint(0, 3, (bs, N1), generator=g)
    for _ in range(2):
        sib = torch.gather(tree.retrieve_next_sibling, 1, child)
        child = torch.where((hop > 0) & (sib >= 0), sib, child)
        hop = hop - 1
    follow = torch.gather(tree.tokens, 1, child)
    tgt = torch.where(torch.rand(bs, N1, generator=g) < 0.75, follow,
                      torch.randint(0, V, (bs, N1), generator=g))
    return tree, tgt


@pytest.mark.parametrize("N", [1, 5, 16, 40])
def test_sglang_triton_verify_equals_core_walk(N):
    for seed in range(3):
        tree, tgt = batch(seed * 31 + N, 6, N)
        res = D.sglang_greedy_accept(tree, tgt, verify_fn=spec_tree.verify_tree_greedy_triton)
        ours = greedy_accept(tree, tgt, use_triton=False)
        assert torch.equal(res.acceptance.accept_index, ours.accept_index)
        assert torch.equal(res.acceptance.accept_length, ours.accept_length)
        assert torch.equal(res.acceptance.bonus_token, ours.bonus_token)
        assert torch.equal(res.accept_index_flat, D.accept_index_to_sglang(ours, N + 1))
        # SGLang writes the target's pick at each accepted row (bonus at the last one)
        flat = res.accept_index_flat.long()
        for b in range(tree.tokens.shape[0]):
            n = int(ours.accept_length[b]) + 1
            got = res.predicts[flat[b, :n]].long()
            assert torch.equal(got, tgt.view(-1)[flat[b, :n]])


def test_verify_input_subclasses_sglang_dflash_verify_input():
    if not D.SGLANG_AVAILABLE:
        pytest.skip("sglang.srt.speculative.dflash_info does not import here")
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput
    from sglang.srt.speculative.spec_info import SpecInputType

    tree, _ = batch(0, 2, 8)
    vi = D.DDTreeVerifyInput.from_tree(tree, torch.tensor([4, 6]),
                                       positions_out=torch.zeros(18, dtype=torch.int64),
                                       prefix_lens_sum=10)
    assert isinstance(vi, DFlashVerifyInput)
    assert vi.spec_input_type == SpecInputType.DFLASH_VERIFY and vi.is_verify_input()
    assert vi.num_tokens_per_req == 9 and vi.num_tokens_for_logprob_per_req == 9


def test_draft_input_subclasses_dflash_draft_input_and_pristine_lacks_the_reserve_hook():
    if D.DDTreeDraftInputV2 is None:
        pytest.skip("sglang.srt.speculative.dflash_info_v2 does not import here")
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    di = D.make_ddtree_draft_input(bonus_tokens=torch.tensor([3, 4]), new_seq_lens=torch.tensor([9, 12]))
    assert isinstance(di, DFlashDraftInputV2) and isinstance(di, D.DDTreeDraftInputV2)
    assert di.bonus_tokens.dtype == torch.int64 and di.new_seq_lens.tolist() == [9, 12]
    assert di.num_tokens_per_req == 1
    # Pristine 0.5.23 hard-codes 2 * block_size: revision 2 must add the hook (the worker checks).
    if "decode_reserve_tokens" not in DFlashDraftInputV2.__dict__:
        import inspect

        assert "reserve = 2 * block_size" in inspect.getsource(DFlashDraftInputV2.prepare_for_decode)
