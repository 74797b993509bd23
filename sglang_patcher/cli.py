"""The ``sglpatch`` command line: thin over the library (each command is a few library calls).

``--json``, ``--debug`` and ``--hosts FILE`` are accepted before or after the subcommand. One
top-level handler turns every :class:`~sglang_patcher.errors.SglpatchError` into its message and
exit code (``--debug`` shows the traceback); Ctrl-C prints "Aborted" and exits 130. ``--json`` makes
every command print one JSON document on stdout instead of tables.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback

import click
from rich.console import Console
from rich.text import Text

from . import cli_commands  # noqa: F401  (registers the subcommands on `cli`)
from .cli_app import AppContext, cli, pass_app, wire_completion  # the frame: the click group and its context
from .errors import SglpatchError

__all__ = ["main", "cli", "AppContext", "pass_app"]

wire_completion(cli)   # host and patchset names complete in the shell (README: shell completion)


def _global_flags(argv: list[str]) -> set[str]:
    """The group-level flags given before the subcommand (``--json``, ``--debug``)."""
    flags = set()
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--hosts":
            skip = True
        elif a.startswith("-"):
            flags.add(a)
        else:
            break
    return flags


def _interrupt_hint(args: list[str]) -> str | None:
    """What to do after Ctrl-C, for the command line ``args``: an ``apply`` or ``rollback`` may
    have left its journal on the host (named from ``--host``), any other command changed no host."""
    cmd = next((a for i, a in enumerate(args) if not a.startswith("-")
                and (i == 0 or args[i - 1] != "--hosts")), None)
    if cmd not in ("apply", "rollback"):
        return None
    host = "HOST"
    for i, a in enumerate(args):
        if a == "--host" and i + 1 < len(args):
            host = args[i + 1]
        elif a.startswith("--host="):
            host = a.split("=", 1)[1]
    return (f"if the {cmd} had started changing {host}, the host holds its journal: `sglpatch status "
            f"--host {host}` shows it, and the next `sglpatch apply` or `sglpatch rollback` on {host} "
            f"finishes or undoes it")


def _hoist_hosts(args: list[str]) -> list[str]:
    """Move ``--hosts FILE`` / ``--hosts=FILE`` given after the subcommand in front of it, where
    the group option is parsed (``sglpatch status --host h --hosts other.yaml``). A ``--``
    ends the options: nothing after it moves. Raises click.UsageError for a ``--hosts`` with
    no file after it."""
    lead = 0
    while lead < len(args) and args[lead].startswith("-") and args[lead] != "--":
        lead += 2 if args[lead] == "--hosts" else 1
    lead = min(lead, len(args))
    moved: list[str] = []
    rest: list[str] = []
    j = lead
    while j < len(args):
        a = args[j]
        if a == "--":
            rest += args[j:]
            break
        if a == "--hosts":
            if j + 1 >= len(args):
                raise click.UsageError("Option '--hosts' requires an argument: the inventory file "
                                       "(sglpatch --hosts FILE COMMAND ...)")
            moved += args[j : j + 2]
            j += 2
            continue
        if a.startswith("--hosts="):
            moved.append(a)
        else:
            rest.append(a)
        j += 1
    return args[:lead] + moved + rest


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush of output that could not
    be written (a closed pipe, a full disk) does not print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI and map errors to exit codes (documented in README.md).

    With ``--json`` an error also prints one JSON document on stdout:
    ``{"ok": false, "error": ..., "hint": ..., "exit_code": ..., "type": ...}``.
    """
    raw = list(argv if argv is not None else sys.argv[1:])
    try:
        args, usage_error = _hoist_hosts(raw), None
    except click.UsageError as exc:
        args, usage_error = raw, exc
    # --json and --debug are accepted anywhere on the line (`sglpatch status --host h --json`)
    for flag in ("--json", "--debug"):
        if flag in args[1:] and flag not in _global_flags(args):
            args = [flag] + [a for a in args if a != flag]
    flags = _global_flags(args)

    def json_error(message: str, code: int, hint: str | None = None, kind: str = "UsageError"):
        if "--json" in flags:
            click.echo(json.dumps({"ok": False, "error": message, "hint": hint,
                                   "exit_code": code, "type": kind}))
    debug = "--debug" in flags
    err = Console(stderr=True, highlight=False, soft_wrap=True)  # messages whole, never re-wrapped
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    if debug:
        logging.basicConfig(level=logging.DEBUG)
    try:
        if usage_error is not None:
            raise usage_error
        rv = cli.main(args=args, prog_name="sglpatch", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except SglpatchError as exc:
        if debug:
            traceback.print_exc()
        err.print(Text.assemble(("error: ", "bold red"), exc.message))
        if exc.hint:
            err.print(f"  hint: {exc.hint}", markup=False)
        json_error(exc.message, exc.exit_code, exc.hint, type(exc).__name__)
        return exc.exit_code
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say to it
        _silence_stdout()
        return 1
    except OSError as exc:  # a local file or stdout: no traceback, say which and what to do
        if debug:
            traceback.print_exc()
        where = f": {exc.filename}" if exc.filename else ""
        err.print(Text.assemble(("error: ", "bold red"), f"{exc.strerror or exc}{where}"))
        err.print("  hint: sglpatch could not read or write a local file or its output; check the "
                  "path, its permissions and free space (local state: $SGLPATCH_HOME); --debug "
                  "shows the traceback", markup=False)
        try:
            json_error(f"{exc.strerror or exc}{where}", 1, None, type(exc).__name__)
        except OSError:
            pass  # stdout itself is what failed
        _silence_stdout()
        return 1
    except (click.exceptions.Abort, KeyboardInterrupt):
        hint = _interrupt_hint(args)
        err.print("Aborted." + (f"\n  hint: {hint}" if hint else ""), markup=False)
        json_error("aborted (interrupted)", 130, hint, "Aborted")
        return 130
    except click.ClickException as exc:
        exc.show()
        code = getattr(exc, "exit_code", 2)
        code = 2 if code == 1 and isinstance(exc, click.UsageError) else code
        json_error(exc.format_message(), code, "run `sglpatch --help` or `sglpatch COMMAND --help`",
                   type(exc).__name__)
        return code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return 0

