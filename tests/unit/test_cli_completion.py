"""Shell completion (issue 18: click's undocumented built-in, completing no host or patchset
names): what bash gets from `_SGLPATCH_COMPLETE=bash_complete`, run as the shell runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml


def complete(words: str, cwd, **env) -> list[str]:
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    out = subprocess.run([sys.executable, "-m", "sglang_patcher"], cwd=cwd, capture_output=True, text=True,
                         env={**os.environ, "_SGLPATCH_COMPLETE": "bash_complete", "COMP_WORDS": words,
                              "COMP_CWORD": str(cword), "PYTHONPATH": os.getcwd(), **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line.split(",", 1)[1] for line in out.stdout.splitlines()]


def test_hosts_of_the_inventory_in_use_and_patchsets_with_their_revisions_complete(tmp_path):
    inv = tmp_path / "lab.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"gpu1": {"hostname": "a", "python": "/p"},
                                             "gpu2": {"hostname": "b", "python": "/p"}}}))
    assert complete(f"sglpatch --hosts {inv} status --host gp", tmp_path) == ["gpu1", "gpu2"]
    assert complete("sglpatch rollback --host ", tmp_path, SGLPATCH_HOSTS=str(inv)) == ["gpu1", "gpu2", "sandbox"]
    assert complete("sglpatch snapshot s", tmp_path) == ["sandbox"]        # no inventory: the sandbox
    got = complete("sglpatch apply dd", os.getcwd())
    assert "ddtree" in got and "ddtree@1" in got
    assert complete("sglpatch patchset show ddtree@", os.getcwd())[:1] == ["ddtree@1"]
