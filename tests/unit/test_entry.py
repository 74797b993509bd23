"""The ``sglpatch`` script's entry point: a Ctrl-C while the command line loads is "Aborted." and
exit 130, never a traceback (a new user pressed it in the first half second and got one)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from sglang_patcher.entry import INTERRUPTED


def test_ctrl_c_while_the_cli_loads_is_aborted_130_not_a_traceback():
    # a fresh interpreter whose import of sglang_patcher.cli is interrupted (as SIGINT would): the
    # package itself must load without it (its public names load lazily)
    code = textwrap.dedent("""
        import sys
        class Interrupt:
            def find_spec(self, name, path=None, target=None):
                if name == "sglang_patcher.cli":
                    raise KeyboardInterrupt
                return None
        sys.meta_path.insert(0, Interrupt())
        from sglang_patcher.entry import main
        sys.exit(main(["--json", "hosts"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == INTERRUPTED == 130, proc.stderr
    assert proc.stderr.strip() == "Aborted." and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout) == {"ok": False, "error": "aborted (interrupted)", "hint": None,
                                       "exit_code": 130, "type": "Aborted"}


def test_the_package_loads_nothing_heavy_until_a_name_is_used():
    code = ("import sys, sglang_patcher; heavy = [m for m in ('click', 'rich', 'paramiko', 'unidiff', "
            "'sglang_patcher.cli') if m in sys.modules]; print(heavy); "
            "sglang_patcher.load_patchset; print('sglang_patcher.patchset' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["[]", "True"], proc.stdout + proc.stderr


def test_the_entry_runs_the_cli(capsys):
    from sglang_patcher.entry import main

    assert main(["--version"]) == 0
    assert "sglpatch" in capsys.readouterr().out
