"""Round trips and seconds of snapshot / apply / status / rollback of a real sglang 0.5.23 install over
a real OpenSSH sshd on 127.0.0.1 (the same fixtures the integration tests use).

    python bench/deploy_loopback.py [--repeat 5] [--patchset ddtree]

Prints one row per operation: median seconds over the repeats (min and max beside it) and the
round trips (exec channels) each took. Needs root (it creates the sshd test user) or runs sshd as the
current user. Not a test: a recorded run goes into bench/results/<date>-<machine>-deploy-loopback.md
(date, machine, command and the printed table), by hand.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import venvs  # noqa: E402
from tests.support.sshd import start_sshd  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--patchset", default="ddtree")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sglpatch-bench-"))
    work.chmod(0o755)   # the sshd target user reads authorized_keys below it
    os.environ["SGLPATCH_HOME"] = str(work / "home")
    from sglang_patcher import discovery, mirror, deploy, load_patchset  # noqa: E402
    from sglang_patcher.transport import connect  # noqa: E402

    server = start_sshd(work / "sshd")
    try:
        pristine = venvs.pristine_venv("sglang")
        parent = server.home / "bench-venvs" if os.geteuid() == 0 else work / "venvs"
        parent.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(parent, server.uid, server.gid)
        target = venvs.clone_venv(pristine, parent / "sglang", server.uid, server.gid)
        host = server.host_entry(target, name="bench")
        ps = load_patchset(args.patchset)
        rows: dict[str, list[tuple[float, int]]] = {}

        def timed(name: str, transport, fn):
            r0, t0 = transport.round_trips, time.perf_counter()
            out = fn()
            rows.setdefault(name, []).append((time.perf_counter() - t0, transport.round_trips - r0))
            return out

        changed = "sglang/srt/speculative/spec_utils.py"
        for i in range(args.repeat):
            shutil.rmtree(work / "home", ignore_errors=True)
            target.reset()
            t = connect(host)
            try:
                info = timed("discover (probe + RECORD)", t, lambda: discovery.discover(t, host))
                snap = timed("snapshot, cold (whole install)", t,
                             lambda: mirror.snapshot(t, host, info))
                timed("snapshot, warm (nothing changed)", t, lambda: mirror.snapshot(t, host, info))
                p = target.site_packages / changed
                p.write_bytes(p.read_bytes() + b"\n")
                timed("snapshot, one file changed", t, lambda: mirror.snapshot(t, host, info))
                target.reset()
                snap = mirror.snapshot(t, host, info)
                timed(f"apply {ps.name} r{ps.revision} (push + L0/L1)", t,
                      lambda: deploy.apply_to_host(t, host, info, ps, pristine=snap.mirror))
                timed("status", t, lambda: deploy.host_status(t, host, info, ps))
                timed("re-apply (clean no-op)", t,
                      lambda: deploy.apply_to_host(t, host, info, ps, pristine=snap.mirror))
                timed("rollback", t, lambda: deploy.rollback_host(t, host, info))
            finally:
                t.close()
            if i == 0:
                files = len(snap.mirror.manifest.files)
                size = sum(e.size for e in snap.mirror.manifest.files.values())
        print(f"sglang 0.5.23 over loopback SSH ({host.address}); mirror: {files} files, "
              f"{size / 2**20:.1f} MiB (no __pycache__); {args.repeat} repeats")
        print(f"{'operation':42s} {'median s':>9s} {'min s':>7s} {'max s':>7s} {'round trips':>12s}")
        for name, vals in rows.items():
            secs = [v[0] for v in vals]
            trips = sorted({v[1] for v in vals})
            print(f"{name:42s} {statistics.median(secs):9.3f} {min(secs):7.3f} {max(secs):7.3f} "
                  f"{'/'.join(map(str, trips)):>12s}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
