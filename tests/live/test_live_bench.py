"""``sglpatch bench`` end to end on the loopback SSH test host (real sshd, real launch_server, the
tiny model fixtures): a run of the three arms at two concurrencies (sglpatch's client), DDTREE at
budget 8 and under the ``auto`` planner, stores its figures and draws its plot; a server killed in the middle of a run measured by SGLang's own
benchmark client fails the bench (exit 9, saying the server died) and nothing is left running.
Timed figures are printed, never asserted (speed on the Triton interpreter means nothing)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

from tests.support.live_ssh import SshHost, cpu_serve_profile, port_range


def test_bench_measures_every_arm_stores_and_plots(host: SshHost, live_models, tmp_path: Path) -> None:
    host.write(cpu_serve_profile(live_models["trained"], port_range(),
                                 bench={"concurrency": [1, 2], "requests": 2, "max_new_tokens": 6}))
    png = tmp_path / "bench.png"
    proc = host.run("bench", "--host", host.name, "--budgets", "8,auto", "--plot", str(png), "--client",
                    "sglpatch", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads(proc.stdout)
    rows = {(r["arm"], r["concurrency"]): r for r in run["rows"]}
    arms = ("target", "DFLASH", "DDTREE n8", "DDTREE auto<=8")
    assert set(rows) == {(a, c) for a in arms for c in (1, 2)}, sorted(rows)
    assert {r["schedule"] for r in run["rows"]} == {None, "auto"}
    for (arm, c), r in rows.items():
        assert r["requests"] == 2 and r["failed"] == 0 and r["output_tokens"] == 2 * 6, r
        assert r["tok_s"] > 0 and r["tpot_ms"] and r["ttft_ms"], r
        assert (r["accept_length"] is None) == (arm == "target"), r
    assert run["patchset"] == "ddtree" and run["revision"] >= 3
    assert png.stat().st_size > 1000
    history = Path(run["history"])
    assert history.is_file() and len(history.read_text().splitlines()) == 1
    print("\n[measure] bench on the CPU test host (Triton interpreter; not a speed figure):")
    for (arm, c), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"  {arm:10} c={c}: {r['tok_s']:.2f} tok/s, accept {r['accept_length']}")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_a_server_dying_mid_bench_fails_it_with_its_log(host: SshHost, live_models) -> None:
    host.write(cpu_serve_profile(live_models["random"], port_range(),
                                 bench={"concurrency": [2], "requests": 40, "max_new_tokens": 64}))
    client = host.popen("bench", "--host", host.name, "--arms", "none", "--client", "sglang", "--json")
    try:
        deadline, killed = time.monotonic() + 300, None
        while time.monotonic() < deadline and killed is None and client.poll() is None:
            for rec in host.running():
                if _healthy(int(rec["port"])):       # serving: let the warm-up and the run begin
                    time.sleep(8)
                    os.killpg(int(rec["pgid"]), signal.SIGKILL)
                    killed = rec
            time.sleep(1)
        assert killed is not None, "the bench's server never became healthy"
        out, err = client.communicate(timeout=300)
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate(timeout=60)
    assert client.returncode == 9, (out + err)[-3000:]
    doc = json.loads(out)
    assert doc["ok"] is False and doc["exit_code"] == 9, doc
    assert "failed" in doc["error"] and killed["name"] in doc["error"], doc["error"][-2000:]
    assert not host.running()
