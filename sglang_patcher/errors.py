"""The one exception tree of sglpatch, with exit codes.

Every error a user can meet derives from :class:`SglpatchError`; the CLI's single top-level handler
prints ``str(exc)`` (plus the hint) and exits with ``exc.exit_code``. Errors of the libraries below us
(paramiko, invoke, OSError, unidiff) are translated into these at ONE boundary each, ``raise ... from``.

::

    SglpatchError (1)
    ├── ConfigError (2)                 bad hosts.yaml, bad patchset manifest, unknown host name
    │   └── InventoryError (2)
    ├── PatchsetError (3)               unknown patchset / unsupported SGLang version / malformed diff
    │   └── UnsupportedVersionError (3)
    ├── ApplyError (4)                  a hunk does not apply strictly (fuzz 0, ambiguity, missing file)
    ├── TransportError (5)              cannot reach or authenticate to a host
    │   ├── HostKeyError (5)            unknown or changed host key (fails closed)
    │   └── RemoteCommandError (5)      a command on the host failed (command, exit code, output tail)
    ├── DiscoveryError (6)              interpreter missing, no SGLang, several SGLang installs
    ├── DriftError (7)                  live remote file matches neither pristine nor expected hash
    ├── DeployError (8)                 the deployment transaction failed (lock held, disk, permission)
    │   └── LockHeldError (8)
    ├── CheckFailedError (9)            a smoke check failed (after an automatic rollback)
    └── StateError (10)                 local or remote deployment records missing or inconsistent
"""

from __future__ import annotations

from collections.abc import Sequence


class SglpatchError(Exception):
    """Base of all sglpatch errors. ``hint`` says what the user should do next."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


class ConfigError(SglpatchError):
    exit_code = 2


class InventoryError(ConfigError):
    pass


class PatchsetError(SglpatchError):
    exit_code = 3


class UnsupportedVersionError(PatchsetError):
    pass


class ApplyError(SglpatchError):
    exit_code = 4


class TransportError(SglpatchError):
    exit_code = 5


class HostKeyError(TransportError):
    pass


class IdentityFileError(ConfigError, TransportError):
    """A host's ``identity_file`` cannot serve as its SSH key (missing, unreadable, a directory, or
    not a private key): bad configuration (exit 2), found before any connection is attempted — a
    TransportError too, for callers that catch connection failures."""


class RemoteCommandError(TransportError):
    """A command on a host exited non-zero. Carries the command, the exit code and the output tail."""

    def __init__(self, host: str, command: str, exit_code: int, stdout: str, stderr: str,
                 *, hint: str | None = None):
        tail = [line if len(line) <= 240 else line[:240] + f" … ({len(line)} characters)"
                for line in (stderr or stdout or "").strip().splitlines()[-15:]]
        msg = f"{host}: command failed with exit code {exit_code}: {command}"
        if tail:
            msg += "\n    " + "\n    ".join(tail)
        super().__init__(msg, hint=hint)
        self.host = host
        self.command = command
        self.returncode = exit_code
        self.stdout = stdout
        self.stderr = stderr


class DiscoveryError(SglpatchError):
    exit_code = 6


class DriftError(SglpatchError):
    exit_code = 7


class DeployError(SglpatchError):
    exit_code = 8


class LockHeldError(DeployError):
    pass


class CheckFailedError(SglpatchError):
    exit_code = 9


class StateError(SglpatchError):
    exit_code = 10


def first_few(items: Sequence[str], shown: int, *, sep: str = ", ", noun: str = "") -> str:
    """The first ``shown`` of ``items`` joined by ``sep``, then ``and N more [noun]`` for the rest
    (joined by ``sep`` when it is not a comma): how a message names a long list of files or changes."""
    head = sep.join(items[:shown])
    rest = len(items) - shown
    if rest <= 0:
        return head
    joiner = " " if sep.strip() == "," else sep
    return f"{head}{joiner}and {rest} more" + (f" {noun}" if noun else "")
