"""The transport interface: run one command on a host, bytes in, bytes out.

Everything above this layer (discovery, mirror, deploy, checks) is the same code for every transport.
A transport opens exactly one exec channel per :meth:`Transport.run` call and counts them in
``round_trips`` so callers and benchmarks can prove the count does not grow with the number of files.
No SFTP is used anywhere: file contents travel as tar streams on stdin/stdout.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, runtime_checkable

from ..errors import RemoteCommandError


@dataclass
class CommandResult:
    """Outcome of one command on a host. ``stdout``/``stderr`` are raw bytes."""

    host: str
    argv: list[str]
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def check(self, *, hint: str | None = None) -> "CommandResult":
        """Return self, or raise :class:`RemoteCommandError` (command, exit code, output tail)."""
        if self.exit_code != 0:
            cmd = self.command
            if len(cmd) > 300:
                cmd = cmd[:300] + " …"
            raise RemoteCommandError(
                self.host, cmd, self.exit_code,
                self.stdout.decode("utf-8", "replace"), self.stderr.decode("utf-8", "replace"),
                hint=hint,
            )
        return self


@runtime_checkable
class Transport(Protocol):
    """What every transport offers.

    ``name``: the host name used in messages. ``round_trips``: exec channels opened so far.
    ``run(argv, stdin=..., timeout=..., sudo=...)`` runs ``argv`` (a list, quoted by the transport
    where a shell is involved); with ``sudo=True`` it is prefixed with ``sudo -n``. With
    ``stdout_sink`` each piece of stdout is handed to it as it arrives (from another thread), and
    the result's ``stdout`` is empty: a large stream is consumed while it travels.
    Raises :class:`~sglang_patcher.errors.TransportError` when the host cannot be reached, never for
    a non-zero exit (that is in the result; call ``.check()``).
    """

    name: str
    round_trips: int

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = None, sudo: bool = False,
            stdout_sink: Callable[[bytes], None] | None = None) -> CommandResult: ...

    def close(self) -> None: ...


@dataclass
class RoundTripCounter:
    """Mixin state for transports."""

    round_trips: int = field(default=0)
