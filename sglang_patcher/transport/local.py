"""The ``local`` transport: the same interface as SSH, for this machine (embedded default, fast tests)."""

from __future__ import annotations

import subprocess
from typing import Sequence

from ..errors import TransportError
from .base import CommandResult


class LocalTransport:
    """Runs argv with :mod:`subprocess` (no shell). ``round_trips`` counts the commands run."""

    def __init__(self, name: str = "local"):
        self.name = name
        self.round_trips = 0

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = None, sudo: bool = False) -> CommandResult:
        argv = list(argv)
        if sudo:
            argv = ["sudo", "-n", *argv]
        self.round_trips += 1
        try:
            proc = subprocess.run(argv, input=stdin if stdin is not None else b"",
                                  capture_output=True, timeout=timeout)
        except FileNotFoundError as exc:   # as a shell reports it: 127 command not found
            return CommandResult(self.name, argv, 127, b"", str(exc).encode())
        except PermissionError as exc:     # 126: found but not executable
            return CommandResult(self.name, argv, 126, b"", str(exc).encode())
        except subprocess.TimeoutExpired as exc:
            raise TransportError(f"{self.name}: command timed out after {timeout} s: {argv[0]}") from exc
        return CommandResult(self.name, argv, proc.returncode, proc.stdout, proc.stderr)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
