"""``python -m sglang.launch_server --speculative-algorithm DDTREE`` (the HTTP server) on the
ddtree-patched live venv: requests one at a time and several at once give the target's own greedy
tokens (the Engine runs of the greedy tests are the reference), and the server reports its accept
length. The server is always stopped, with its children."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.live import matrix
from tests.support import live_sglang as ls


def test_ddtree_http_server_gives_the_target_tokens(ddtree_venv, live_models, greedy_runs,
                                                    tmp_path: Path) -> None:
    fx = live_models["trained"]
    base = greedy_runs["trained"]["target"]
    assert base.ok
    single, batch = matrix.phases(fx, matrix.NEW_TOKENS["trained"])
    port = ls.free_port()
    # --decode-log-interval 1: SGLang folds its accept counters into /server_info's running average
    # only every decode-log-interval decode batches (40 by default, more than this test runs)
    argv = ls.server_argv(ddtree_venv.python, fx.target, port=port,
                          extra=ls.speculative_flags(fx.drafts[4], "DDTREE", speculative_ddtree_budget=8)
                          + ["--decode-log-interval", "1"])
    with ls.ServerProcess(argv, tmp_path / "server.log", port) as server:
        server.wait_healthy()

        def generate(prompt: str) -> dict:
            return server.post("/generate", {"text": prompt, "sampling_params": single.sampling})

        one_at_a_time = [generate(p) for p in single.prompts]
        with ThreadPoolExecutor(len(batch.prompts)) as pool:     # concurrent: batched by the scheduler
            at_once = list(pool.map(generate, batch.prompts))
        info = server.get("/server_info")

    for phase, outs in (("single", one_at_a_time), ("batch", at_once)):
        for want, got in zip(base.phases[phase], outs):
            assert got["output_ids"] == want.output_ids, (
                f"{phase} {want.prompt!r}: HTTP DDTREE {got['output_ids']} != target {want.output_ids}")
            assert got["meta_info"].get("spec_verify_ct", 0) >= 1, got["meta_info"]
    # SGLang's running average over every request since start (one per internal state)
    accept = [s.get("avg_spec_accept_length") for s in info.get("internal_states", [])]
    assert accept and all(a and a > 1.0 for a in accept), info.get("internal_states")
