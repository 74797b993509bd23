"""The ``sglpatch`` console script: the command line imported inside the Ctrl-C handler.

Importing the CLI (click, rich, every command's modules) takes a few tenths of a second; a Ctrl-C
then used to end in a Python traceback, before :func:`sglang_patcher.cli.main` could say
"Aborted.". Here that import is guarded too: the same word and exit code 130 either way. The
package's ``__init__`` imports nothing eagerly (its public names load on first use), so this
module is the first thing the script loads.
"""

from __future__ import annotations

import json
import sys

__all__ = ["main"]

INTERRUPTED = 130   # the shell's code for SIGINT, as cli.main gives


def main(argv: list[str] | None = None) -> int:
    """Run the ``sglpatch`` command line (``argv``: the arguments, default ``sys.argv[1:]``);
    return its exit code, 130 when interrupted while it loads."""
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        # what cli.main says for a Ctrl-C (nothing had started: no hint about a lock or a host)
        print("Aborted.", file=sys.stderr)
        if "--json" in (sys.argv[1:] if argv is None else argv):
            print(json.dumps({"ok": False, "error": "aborted (interrupted)", "hint": None,
                              "exit_code": INTERRUPTED, "type": "Aborted"}))
        return INTERRUPTED
    return cli_main(argv)
