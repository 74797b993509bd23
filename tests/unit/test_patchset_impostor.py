"""A patchset copy that says it is the catalog's NAME rN but makes other files is refused at apply.

Found by a new user: an edited copy of patchsets/ddtree (one module changed, hashes refreshed)
deployed as "ddtree r5"; the host then read patched r5 while its bytes were not r5's, and applying
the real ddtree r5 called sglpatch's own files drift.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from sglang_patcher.errors import PatchsetError
from sglang_patcher.patchset import load_patchset
from sglang_patcher.patchset_identity import check_not_an_impostor

REPO = Path(__file__).resolve().parents[2]
DDTREE = REPO / "patchsets" / "ddtree"
BUDGET = "sglang/srt/speculative/ddtree_budget.py"


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "ddtree"
    shutil.copytree(DDTREE, root, ignore=shutil.ignore_patterns("__pycache__", "history"))
    return root


def _edit_module(root: Path) -> None:
    mod = root / "modules" / "ddtree_budget.py"
    old = hashlib.sha256(mod.read_bytes()).hexdigest()
    mod.write_bytes(mod.read_bytes() + b"# edited\n")
    new = hashlib.sha256(mod.read_bytes()).hexdigest()
    yaml = root / "patchset.yaml"
    yaml.write_text(yaml.read_text().replace(old, new))


def test_an_edited_copy_under_the_same_name_and_revision_is_refused(tmp_path):
    root = _copy(tmp_path)
    _edit_module(root)
    ps = load_patchset(root)
    with pytest.raises(PatchsetError) as exc:
        check_not_an_impostor(ps, "0.5.23")
    assert f"says ddtree r{ps.revision}" in str(exc.value) and BUDGET in str(exc.value)
    assert "own revision" in exc.value.hint


def test_an_unchanged_copy_the_catalog_and_its_history_pass(tmp_path):
    check_not_an_impostor(load_patchset(_copy(tmp_path)), "0.5.23")
    check_not_an_impostor(load_patchset("ddtree"), "0.5.23")
    check_not_an_impostor(load_patchset("ddtree@4"), "0.5.23")


def test_an_edited_copy_with_its_own_revision_or_only_a_new_release_passes(tmp_path):
    root = _copy(tmp_path)
    _edit_module(root)
    yaml = root / "patchset.yaml"
    rev = load_patchset("ddtree").revision
    yaml.write_text(yaml.read_text().replace(f"\nrevision: {rev}\n", f"\nrevision: {rev + 1}\n", 1))
    check_not_an_impostor(load_patchset(root), "0.5.23")        # a maintainer's next revision
    check_not_an_impostor(load_patchset(_copy(tmp_path / "b")), "0.5.22")
