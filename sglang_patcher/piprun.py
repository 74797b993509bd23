"""Run pip (``pip download``, ``pip install``) with its downloads measured for a progress
:class:`~sglang_patcher.progress.Task`: bytes as they land, the total as pip announces it.

pip writes each download into a temporary directory (``pip-unpack-*``) before it moves or installs
it; pip runs with ``TMPDIR`` set to a directory of ours, whose download directories are polled.
Only those count: pip's HTTP cache buffers the same bytes in a temporary file beside them, which
counted every download twice. Each download is hard-linked aside on first sight, so that its
final size is read once pip is done (and has deleted it). pip's ``Downloading NAME (SIZE)`` lines
give the total while it runs (rounded by pip); at the end the total is the bytes that arrived,
pip's figure standing in only for a download too quick to be seen. Its output is captured whole,
as with ``subprocess.run(capture_output=True, text=True)``, for the caller's error messages.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Sequence

from .progress import Task

_DOWNLOADING = re.compile(r"Downloading (\S+) \(([\d.]+) (B|kB|MB|GB)\)")
_UNIT = {"B": 1, "kB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}
POLL_S = 0.25


def announced(output: str) -> dict[str, int]:
    """{file name: size} of the downloads pip announces in ``Downloading NAME (SIZE)`` lines
    (metadata files left out; NAME may be a URL: its last part)."""
    out: dict[str, int] = {}
    for name, size, unit in _DOWNLOADING.findall(output):
        if not name.endswith(".metadata"):
            out[name.rsplit("/", 1)[-1]] = int(float(size) * _UNIT[unit])
    return out


def announced_bytes(output: str) -> int:
    """The sum of the sizes pip announces in ``Downloading NAME (SIZE)`` lines (metadata files
    left out)."""
    return sum(announced(output).values())


_INSTALLING = re.compile(r"^Installing collected packages: (.+)$", re.M)


def phase(output: str) -> str | None:
    """What pip is doing past its downloads, from its output so far: ``"installing N package(s)"``
    once it prints ``Installing collected packages: ...`` (the bar stands full meanwhile: that
    step downloads nothing), else None."""
    m = _INSTALLING.search(output)
    if m is None:
        return None
    n = len([p for p in m.group(1).split(",") if p.strip()])
    return f"installing {n} package{'' if n == 1 else 's'} (downloads done)"


KEEP = "sglpatch-downloads"   # where each download is hard-linked, under our TMPDIR


def _scan(root: str, seen: dict[str, int]) -> int:
    """The bytes of pip's downloads under ``root`` so far, summed: ``seen`` maps each download's
    file name to the largest size it reached. Only files in pip's download directories
    (``pip-unpack-*``) count, metadata files left out; each is hard-linked into ``root/KEEP`` on
    first sight (its final size stays readable after pip deletes it)."""
    keep = os.path.join(root, KEEP)
    for dirpath, _dirs, files in os.walk(root):
        if not os.path.basename(dirpath).startswith("pip-unpack-"):
            continue
        for f in files:
            if f.endswith(".metadata"):
                continue
            kept = os.path.join(keep, f)
            if not os.path.exists(kept):
                try:
                    os.makedirs(keep, exist_ok=True)
                    os.link(os.path.join(dirpath, f), kept)
                except OSError:   # gone already, or no hard links here: its size as seen now
                    kept = os.path.join(dirpath, f)
            try:
                size = os.lstat(kept).st_size
            except OSError:
                continue
            if size > seen.get(f, 0):
                seen[f] = size
    if os.path.isdir(keep):   # the kept links: sizes grow as pip writes, and stay after it deletes
        for f in os.listdir(keep):
            try:
                size = os.lstat(os.path.join(keep, f)).st_size
            except OSError:
                continue
            if size > seen.get(f, 0):
                seen[f] = size
    return sum(seen.values())


def run_pip(argv: Sequence[str], *, task: Task, timeout: float | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (a pip command line) to the end, telling ``task`` the bytes downloaded so far
    and the total announced; return its exit code and whole output. Raises
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds (pip killed)."""
    tmp = tempfile.mkdtemp(prefix="sglpatch-pip-")
    run_env = dict(env if env is not None else os.environ, TMPDIR=tmp)
    out: list[str] = []
    err: list[str] = []
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env)

    def drain(stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    threads = [threading.Thread(target=drain, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, err), daemon=True)]
    for t in threads:
        t.start()
    seen: dict[str, int] = {}
    done = 0
    doing: str | None = None
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            try:
                proc.wait(POLL_S)
                finished = True
            except subprocess.TimeoutExpired:
                finished = False
            text = "".join(out)
            now_doing = phase(text)
            if now_doing is not None and now_doing != doing:
                task.note(now_doing)
                doing = now_doing
            total = announced_bytes(text)
            if total:
                task.total(nbytes=max(total, done))
            now = _scan(tmp, seen)
            if now > done:
                task.advance(nbytes=now - done)
                done = now
            if finished:
                break
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise subprocess.TimeoutExpired(list(argv), timeout or 0)
        for t in threads:
            t.join()
        _scan(tmp, seen)   # the kept downloads at their final sizes
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    # the bytes that arrived; pip's (rounded) figure only for a download too quick to be seen
    final = sum(seen.values()) + sum(n for name, n in announced("".join(out)).items() if name not in seen)
    if final != done:
        task.advance(nbytes=final - done)
    if final or task.total_bytes:
        task.total(nbytes=final)
    return subprocess.CompletedProcess(list(argv), proc.returncode, "".join(out), "".join(err))


__all__ = ["run_pip", "announced", "announced_bytes", "phase"]
