"""The ``local`` transport: the same interface as SSH, for this machine (embedded default, fast tests)."""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Callable, Sequence

from ..errors import TransportError
from .base import CommandResult


class LocalTransport:
    """Runs argv with :mod:`subprocess` (no shell). ``round_trips`` counts the commands run."""

    def __init__(self, name: str = "local"):
        self.name = name
        self.round_trips = 0

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = None, sudo: bool = False,
            stdout_sink: Callable[[bytes], None] | None = None) -> CommandResult:
        argv = list(argv)
        if sudo:
            argv = ["sudo", "-n", *argv]
        self.round_trips += 1
        try:
            if stdout_sink is not None:
                return self._streamed(argv, stdin, timeout, stdout_sink)
            proc = subprocess.run(argv, input=stdin if stdin is not None else b"",
                                  capture_output=True, timeout=timeout)
        except FileNotFoundError as exc:   # as a shell reports it: 127 command not found
            return CommandResult(self.name, argv, 127, b"", str(exc).encode())
        except PermissionError as exc:     # 126: found but not executable
            return CommandResult(self.name, argv, 126, b"", str(exc).encode())
        except subprocess.TimeoutExpired as exc:
            raise TransportError(f"{self.name}: command timed out after {timeout} s: {argv[0]}") from exc
        return CommandResult(self.name, argv, proc.returncode, proc.stdout, proc.stderr)

    def _streamed(self, argv: list[str], stdin: bytes | None, timeout: float | None,
                  sink: Callable[[bytes], None]) -> CommandResult:
        """``run`` with stdout handed to ``sink`` piece by piece as the command writes it."""
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err: list[bytes] = []

        def feed() -> None:
            try:
                if stdin:
                    proc.stdin.write(stdin)  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):  # it exited without reading it all: its exit code says
                pass

        def drain() -> None:
            err.append(proc.stderr.read())  # type: ignore[union-attr]

        threads = [threading.Thread(target=feed, daemon=True), threading.Thread(target=drain, daemon=True)]
        for t in threads:
            t.start()
        out = proc.stdout
        assert out is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while block := out.read1(1 << 16):
            sink(block)
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise subprocess.TimeoutExpired(argv, timeout or 0)
        for t in threads:
            t.join()
        proc.wait()
        return CommandResult(self.name, argv, proc.returncode, b"", b"".join(err))

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
