"""Run one stdlib-only script from :mod:`sglang_patcher.remote` on a host, in one round trip.

A script is one module (``probe``) or a package of modules joined into one source (``deploy_agent``,
see :mod:`.bundle`). The source is zlib-compressed and base64-encoded into the argv of
``<interpreter> -c <bootstrap>``; the operation name and its JSON arguments follow. Binary payloads
travel on stdin/stdout.

Protocol for JSON operations: the script prints exactly one JSON object on stdout and exits 0 on
success; on an expected failure it prints ``{"ok": false, "kind": ..., "error": ...}`` and exits 3.
Any other exit is an unexpected crash and becomes :class:`RemoteCommandError` with the output tail.
"""

from __future__ import annotations

import base64
import json
import zlib
from functools import lru_cache
from typing import Any, Callable

from ..errors import RemoteCommandError
from ..transport.base import CommandResult, Transport
from .bundle import script_source

EXPECTED_FAILURE_EXIT = 3

# ``python -c`` puts the working directory first on sys.path; drop it before any import so a stray
# ``base64.py`` in the remote user's home cannot shadow the standard library (``sys`` is built in).
_BOOTSTRAP = (
    "import sys;sys.path.pop(0);"
    "import base64,zlib;"
    "src=zlib.decompress(base64.b64decode(sys.argv[1])).decode();"
    "sys.argv=sys.argv[1:];"
    "exec(compile(src,'<sglpatch-remote>','exec'),{'__name__':'__main__'})"
)


@lru_cache(maxsize=None)
def _encoded_source(script: str) -> str:
    return base64.b64encode(zlib.compress(script_source(script), 9)).decode("ascii")


def script_argv(interpreter: str, script: str, op: str, args: dict[str, Any] | None = None) -> list[str]:
    """The argv that runs the remote script ``script`` (``remote/<script>.py``, or the package
    ``remote/<script>/`` joined) operation ``op`` with ``args`` under ``interpreter``.

    Inside the script, ``sys.argv == [<b64 source>, op, json_args]``.
    """
    return [interpreter, "-c", _BOOTSTRAP, _encoded_source(script), op, json.dumps(args or {})]


def run_script(transport: Transport, interpreter: str, script: str, op: str,
               args: dict[str, Any] | None = None, *, stdin: bytes | None = None,
               sudo: bool = False, timeout: float | None = None,
               stdout_sink: Callable[[bytes], None] | None = None) -> CommandResult:
    """Run a remote script operation; returns the raw result (binary stdout allowed; handed to
    ``stdout_sink`` piece by piece as it arrives instead, when given)."""
    if stdout_sink is None:
        return transport.run(script_argv(interpreter, script, op, args), stdin=stdin,
                             sudo=sudo, timeout=timeout)
    return transport.run(script_argv(interpreter, script, op, args), stdin=stdin,
                         sudo=sudo, timeout=timeout, stdout_sink=stdout_sink)


def call_json(transport: Transport, interpreter: str, script: str, op: str,
              args: dict[str, Any] | None = None, *, stdin: bytes | None = None,
              sudo: bool = False, timeout: float | None = None) -> dict[str, Any]:
    """Run a JSON operation and return its object.

    Returns the object for exit 0 and for an expected failure (exit 3, ``ok`` false) — the caller
    maps ``kind`` to the right :mod:`sglang_patcher.errors` class. Raises
    :class:`RemoteCommandError` for anything else (crash, missing interpreter, unparsable output).
    """
    res = run_script(transport, interpreter, script, op, args, stdin=stdin, sudo=sudo,
                     timeout=timeout)
    short = f"{interpreter} <sglpatch {script}> {op}"
    if res.exit_code not in (0, EXPECTED_FAILURE_EXIT):
        hint = None
        if res.exit_code == 127:
            where = getattr(getattr(transport, "host", None), "inventory_file", "the inventory file")
            hint = f"is the interpreter path {interpreter!r} right for {transport.name}? Set it in {where}"
        raise RemoteCommandError(transport.name, short, res.exit_code,
                                 res.stdout.decode("utf-8", "replace"),
                                 res.stderr.decode("utf-8", "replace"), hint=hint)
    out = last_json(res.stdout)
    if out is None:
        raise RemoteCommandError(transport.name, short, res.exit_code,
                                 res.stdout.decode("utf-8", "replace"),
                                 res.stderr.decode("utf-8", "replace"),
                                 hint="the remote script printed no JSON; rerun with --debug")
    if not isinstance(out, dict):
        raise RemoteCommandError(transport.name, short, res.exit_code, str(out), "",
                                 hint="the remote script printed unexpected JSON")
    return out


def last_json(stdout: bytes) -> Any:
    """The JSON value on the last line of a remote script's stdout (how our scripts answer, also
    for an expected failure: ``{"ok": false, "kind": ..., "error": ...}``); None when there is none."""
    try:
        return json.loads(stdout.decode("utf-8").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def source_argv(interpreter: str, source: bytes, *extra: str) -> list[str]:
    """The argv that runs the Python ``source`` (bytes) under ``interpreter``, in one exec channel.

    Inside the script, ``sys.argv == [<b64 source>, *extra]`` and ``__name__ == "__main__"``; it is
    compiled under the file name ``<sglpatch-remote>``.
    """
    encoded = base64.b64encode(zlib.compress(source, 9)).decode("ascii")
    return [interpreter, "-c", _BOOTSTRAP, encoded, *extra]


def run_source(transport: Transport, interpreter: str, source: bytes, *extra: str,
               stdin: bytes | None = None, sudo: bool = False,
               timeout: float | None = None) -> CommandResult:
    """Run a script given as source bytes (e.g. a patchset's L1 check) on a host; raw result.

    One exec channel. Used for scripts that are not part of :mod:`sglang_patcher.remote`.
    """
    return transport.run(source_argv(interpreter, source, *extra), stdin=stdin, sudo=sudo,
                         timeout=timeout)
