"""Round trips and seconds of snapshot / apply / status / rollback of a real sglang 0.5.23 install over
a real OpenSSH sshd on 127.0.0.1 (the same fixtures the integration tests use), and the mirror's
snapshot side by side with rsync, measured in the same run.

    python bench/deploy_loopback.py [--repeat 3] [--patchset ddtree] [--rtt-ms 0,50] [--no-rsync]

Part 1 prints one row per operation: median seconds over the repeats (min and max beside it) and
the round trips (exec channels) each took, on one open connection (the library).

Part 2 puts the mirror beside rsync (``rsync -a --delete``, ``__pycache__``/``*.pyc`` excluded, as
the mirror excludes them) for the same files, at each ``--rtt-ms`` (a round-trip time added by a
TCP proxy in this process that holds every piece 1/2 RTT in each direction): a first copy into an
empty directory, a copy with nothing changed, and one with one ``.py`` changed. Three columns,
measured in rotated order within each repeat: ``sglpatch`` (the library's ``snapshot`` on an open
connection), ``sglpatch CLI`` (``sglpatch snapshot HOST`` as a user runs it: a new process that
connects, discovers and snapshots) and ``rsync`` (also a new process and connection each time).
Medians over the repeats; the ratios are sglpatch / rsync.

Needs root (it creates the sshd test user) or runs sshd as the current user; rsync on PATH for
part 2 (``apt-get install rsync``). Not a test: a recorded run goes into
``bench/results/<date>-<machine>-deploy-loopback*.md`` (date, machine, command and the printed
table), by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import venvs  # noqa: E402
from tests.support.sshd import start_sshd  # noqa: E402

CHANGED = "sglang/srt/speculative/spec_utils.py"


class DelayProxy:
    """A TCP proxy on 127.0.0.1 to ``port`` that delivers every piece ``one_way_s`` after it
    arrived, in each direction (an added round-trip time of twice that; bandwidth unchanged)."""

    def __init__(self, port: int, one_way_s: float):
        self.target, self.delay = port, one_way_s
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
        self.loop.run_until_complete(start())
        self.loop.run_forever()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while data := await reader.read(1 << 16):
                queue.put_nowait((loop.time() + self.delay, data))
        except ConnectionError:
            pass
        queue.put_nowait((loop.time() + self.delay, None))
        try:
            await sender
        except ConnectionError:
            pass

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer))
        for w in (writer, up_w):
            w.close()

    def stop(self) -> None:
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def median_row(vals: list[float]) -> tuple[float, float, float]:
    return statistics.median(vals), min(vals), max(vals)


def part1(args, server, target, work: Path) -> tuple[str, int, float]:
    from sglang_patcher import deploy, discovery, load_patchset, mirror
    from sglang_patcher.transport import connect

    host = server.host_entry(target, name="bench")
    ps = load_patchset(args.patchset)
    rows: dict[str, list[tuple[float, int]]] = {}

    def timed(name: str, transport, fn):
        r0, t0 = transport.round_trips, time.perf_counter()
        out = fn()
        rows.setdefault(name, []).append((time.perf_counter() - t0, transport.round_trips - r0))
        return out

    for i in range(args.repeat):
        shutil.rmtree(work / "home", ignore_errors=True)
        target.reset()
        t = connect(host)
        try:
            info = timed("discover (probe + RECORD)", t, lambda: discovery.discover(t, host))
            snap = timed("snapshot, first (whole install)", t, lambda: mirror.snapshot(t, host, info))
            timed("snapshot, nothing changed", t, lambda: mirror.snapshot(t, host, info))
            p = target.site_packages / CHANGED
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
    files = len(snap.mirror.manifest.files)
    size = sum(e.size for e in snap.mirror.manifest.files.values())
    lines = [f"sglang 0.5.23 over loopback SSH ({host.address}); mirror: {files} files, "
             f"{size / 2**20:.1f} MiB (no __pycache__); {args.repeat} repeats",
             f"{'operation':42s} {'median s':>9s} {'min s':>7s} {'max s':>7s} {'round trips':>12s}"]
    for name, vals in rows.items():
        med, lo, hi = median_row([v[0] for v in vals])
        trips = sorted({v[1] for v in vals})
        lines.append(f"{name:42s} {med:9.3f} {lo:7.3f} {hi:7.3f} {'/'.join(map(str, trips)):>12s}")
    return "\n".join(lines), files, size


def part2(args, server, target, work: Path, rtt_ms: float) -> str:
    import yaml

    from sglang_patcher import discovery, mirror
    from sglang_patcher.transport import connect

    proxy = DelayProxy(server.port, rtt_ms / 2000) if rtt_ms else None
    port = proxy.port if proxy else server.port
    known = work / f"known_hosts-{port}"
    known.write_text(Path(server.known_hosts).read_text().replace(f"]:{server.port} ", f"]:{port} "))
    host = server.host_entry(target, name="bench", port=port, known_hosts=str(known))
    home = work / f"home-rtt{rtt_ms:g}"
    inv = work / f"hosts-rtt{rtt_ms:g}.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"bench": host.model_dump(exclude_none=True, exclude={"name"})}}))
    env = dict(os.environ, SGLPATCH_HOME=str(home), COLUMNS="100")
    ssh = (f"ssh -i {server.identity_file} -p {port} -o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes "
           f"-o BatchMode=yes")
    site = target.site_packages
    dest = work / f"rsync-rtt{rtt_ms:g}"
    dist = next(p.name for p in site.glob("sglang-*.dist-info"))
    mirror_root = home / "mirrors" / "bench" / "0.5.23"
    t = connect(host)
    info = discovery.discover(t, host)
    os.environ["SGLPATCH_HOME"] = str(home)

    def lib() -> None:
        mirror.snapshot(t, host, info)

    def cli() -> None:
        subprocess.run([sys.executable, "-m", "sglang_patcher", "--hosts", str(inv), "snapshot", "bench"],
                       env=env, check=True, capture_output=True, cwd=work)

    def rsync() -> None:
        dest.mkdir(exist_ok=True)
        subprocess.run(["rsync", "-a", "--delete", "--exclude", "__pycache__", "--exclude", "*.pyc", "-e", ssh,
                        f"{server.user}@127.0.0.1:{site}/sglang", f"{server.user}@127.0.0.1:{site}/{dist}",
                        f"{dest}/"], check=True, capture_output=True)

    def clear(tool: str) -> None:
        shutil.rmtree(dest if tool == "rsync" else mirror_root, ignore_errors=True)

    tools = {"sglpatch": lib, "sglpatch CLI": cli, "rsync": rsync}
    if args.no_rsync:
        tools.pop("rsync")
    ops = ("first copy (empty destination)", "nothing changed", "one .py changed")
    secs: dict[tuple[str, str], list[float]] = {}
    edit = 0
    try:
        for i in range(args.repeat):
            order = list(tools)[i % len(tools):] + list(tools)[:i % len(tools)]
            for op in ops:
                for tool in order:
                    if op == ops[0]:
                        clear(tool)
                    elif op == ops[2]:
                        edit += 1
                        p = site / CHANGED
                        p.write_bytes(p.read_bytes() + f"# edit {edit}\n".encode())
                    t0 = time.perf_counter()
                    tools[tool]()
                    secs.setdefault((op, tool), []).append(time.perf_counter() - t0)
            target.reset()
    finally:
        t.close()
        if proxy:
            proxy.stop()
    cols = list(tools)
    head = f"{'RTT ' + format(rtt_ms, 'g') + ' ms':34s}" + "".join(f"{c:>14s}" for c in cols)
    if "rsync" in tools:
        head += f"{'sglpatch/rsync':>16s}{'CLI/rsync':>11s}"
    lines = [head]
    for op in ops:
        med = {c: statistics.median(secs[(op, c)]) for c in cols}
        row = f"{op:34s}" + "".join(f"{med[c]:12.2f} s" for c in cols)
        if "rsync" in tools:
            row += f"{med['sglpatch'] / med['rsync']:15.2f}x{med['sglpatch CLI'] / med['rsync']:10.2f}x"
        lines.append(row)
        lines.append(f"{'  (min-max)':34s}" + "".join(
            f"{min(secs[(op, c)]):>6.2f}-{max(secs[(op, c)]):<5.2f}  " for c in cols))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--patchset", default="ddtree")
    ap.add_argument("--rtt-ms", default="0,50", help="added round-trip times for part 2, comma-separated")
    ap.add_argument("--no-rsync", action="store_true", help="part 2 without the rsync column")
    ap.add_argument("--skip-part1", action="store_true")
    args = ap.parse_args()
    if not args.no_rsync and shutil.which("rsync") is None:
        ap.error("rsync is not installed (apt-get install rsync), or pass --no-rsync")

    work = Path(tempfile.mkdtemp(prefix="sglpatch-bench-"))
    work.chmod(0o755)   # the sshd target user reads authorized_keys below it
    os.environ["SGLPATCH_HOME"] = str(work / "home")
    server = start_sshd(work / "sshd")
    try:
        pristine = venvs.pristine_venv("sglang")
        parent = server.home / "bench-venvs" if os.geteuid() == 0 else work / "venvs"
        parent.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(parent, server.uid, server.gid)
        target = venvs.clone_venv(pristine, parent / f"sglang-{os.getpid()}", server.uid, server.gid)
        if not args.skip_part1:
            text, _, _ = part1(args, server, target, work)
            print(text, flush=True)
            print(flush=True)
        print(f"the mirror beside rsync: medians of {args.repeat} repeats (tools in rotated order)", flush=True)
        for rtt in [float(x) for x in args.rtt_ms.split(",") if x.strip()]:
            print(part2(args, server, target, work, rtt), flush=True)
            print(flush=True)
        venvs.remove_venv(parent / f"sglang-{os.getpid()}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
