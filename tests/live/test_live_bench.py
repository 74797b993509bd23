"""``sglpatch bench`` end to end on the loopback SSH test host (real sshd, real launch_server, the
tiny model fixtures): a run of the three arms at two concurrencies stores its figures, draws its
plot and compares with the previous run; a server killed in the middle of a run fails the bench
(exit 9, the server's log tail) and nothing is left running. Timed figures are printed, never
asserted (speed on the Triton interpreter means nothing)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.support.live_ssh import SshHost, cpu_serve_profile, port_range


def test_bench_measures_every_arm_stores_and_plots(host: SshHost, live_models, tmp_path: Path) -> None:
    host.write(cpu_serve_profile(live_models["trained"], port_range(),
                                 bench={"concurrency": [1, 3], "requests": 3, "max_new_tokens": 8}))
    png = tmp_path / "bench.png"
    proc = host.run("bench", "--host", host.name, "--plot", str(png), "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads(proc.stdout)
    rows = {(r["arm"], r["concurrency"]): r for r in run["rows"]}
    assert set(rows) == {(a, c) for a in ("target", "DFLASH", "DDTREE n8") for c in (1, 3)}, sorted(rows)
    for (arm, c), r in rows.items():
        assert r["requests"] == 3 and r["failed"] == 0 and r["output_tokens"] == 3 * 8, r
        assert r["tok_s"] > 0 and r["tpot_ms"] and r["ttft_ms"], r
        assert (r["accept_length"] is None) == (arm == "target"), r
    assert run["patchset"] == "ddtree" and run["revision"] >= 3
    assert png.stat().st_size > 1000
    history = Path(run["history"])
    assert history.is_file() and len(history.read_text().splitlines()) == 1
    print("\n[measure] bench on the CPU test host (Triton interpreter; not a speed figure):")
    for (arm, c), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"  {arm:10} c={c}: {r['tok_s']:.2f} tok/s, accept {r['accept_length']}")


def test_a_server_dying_mid_bench_fails_it_with_its_log(host: SshHost, live_models) -> None:
    host.write(cpu_serve_profile(live_models["random"], port_range(),
                                 bench={"concurrency": [2], "requests": 40, "max_new_tokens": 64}))
    client = host.popen("bench", "--host", host.name, "--arms", "none", "--json")
    deadline = time.monotonic() + 300
    killed = None
    while time.monotonic() < deadline and killed is None:     # once it serves: kill it under load
        for rec in host.running():
            log = Path(rec["log"]).read_text(errors="replace") if Path(rec["log"]).exists() else ""
            if "POST /generate" in log or "Decode batch" in log:
                os.killpg(int(rec["pgid"]), signal.SIGKILL)
                killed = rec
        time.sleep(1)
    assert killed is not None, "the bench's server never started serving"
    out, _ = client.communicate(timeout=300)
    assert client.returncode == 9, out[-3000:]
    doc = json.loads(out[out.index("{"):])
    assert doc["ok"] is False and "failed" in doc["error"], doc
    assert not host.running()
