"""Run pip (``pip download``, ``pip install``) with its downloads measured for a progress
:class:`~sglang_patcher.progress.Task`: bytes as they land, the total as pip announces it.

pip writes each download into a temporary directory before it moves or installs it; pip runs with
``TMPDIR`` set to a directory of ours, which is polled (the largest size each file reached, summed:
files pip deletes stay counted). pip's ``Downloading NAME (SIZE)`` lines give the total. Its
output is captured whole, as with ``subprocess.run(capture_output=True, text=True)``, for the
caller's error messages.
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


def announced_bytes(output: str) -> int:
    """The sum of the sizes pip announces in ``Downloading NAME (SIZE)`` lines (metadata files
    left out)."""
    total = 0
    for name, size, unit in _DOWNLOADING.findall(output):
        if not name.endswith(".metadata"):
            total += int(float(size) * _UNIT[unit])
    return total


def _scan(root: str, seen: dict[str, int]) -> int:
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                size = os.lstat(p).st_size
            except OSError:
                continue
            if size > seen.get(p, 0):
                seen[p] = size
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
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            try:
                proc.wait(POLL_S)
                finished = True
            except subprocess.TimeoutExpired:
                finished = False
            total = announced_bytes("".join(out))
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
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    total = announced_bytes("".join(out))
    if total > done:   # a download faster than the polling: count what pip said it fetched
        task.advance(nbytes=total - done)
    return subprocess.CompletedProcess(list(argv), proc.returncode, "".join(out), "".join(err))


__all__ = ["run_pip", "announced_bytes"]
