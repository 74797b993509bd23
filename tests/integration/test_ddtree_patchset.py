"""The ddtree patchset (current revision: 6) against the real sglang wheels of every release it
targets (0.5.23, 0.5.22 and 0.5.21), and its L1 check for real.

* Per release: the series applies to the pristine wheel tree with GNU ``patch --fuzz=0`` and with
  the project's strict applier (``Patchset.render``), and both give exactly the manifest's
  ``expected`` hashes; the ``pristine`` hashes are the wheel's RECORD hashes; the patched files
  compile.
* The patchset README lists every DFLASH check site of the pristine 0.5.23 tree (an AST scan), and
  every site of another release either has a 0.5.23 site of the same source line in the same file
  (the README's row holds for it) or is listed in that release's own table — so a port cannot
  silently skip one.
* L1 (marker ``l1``), per release: the check script, run by a real target venv's interpreter,
  reports every check ``skipped`` on a ``--no-deps`` venv, ``failed`` on an unpatched L1 venv
  (``from_string("DDTREE")`` raises there), and ``passed`` on the patched L1 venv
  (sglang_patcher/data/sglang-0.5.23-cpu-requirements.txt: CPU torch + light deps; the same set
  serves 0.5.22 and 0.5.21). The venvs are the shared cached ones of ``tests/support/venvs.py``.
"""

from __future__ import annotations

import ast
import base64
import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from sglang_patcher.errors import PatchsetError
from sglang_patcher.patchset import load_patchset
from tests.support import venvs

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]
DDTREE = REPO / "patchsets" / "ddtree"
L1_SCRIPT = DDTREE / "checks" / "l1_ddtree.py"
README = DDTREE / "README.md"
V = "0.5.23"             # the release the revision history and the README's site table are of
RELEASES = load_patchset(DDTREE).versions
L1_CHECKS = 35          # revision 11 (9 and 10 had 33, 7 and 8 had 32, 4 to 6 had 30, revision 3 had 26, revision 2 had 25, revision 1 had 10)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def ps():
    return load_patchset(DDTREE)


def _pristine_tree(version: str):
    from sglang_patcher.wheelcache import pristine_tree

    home = Path(os.environ.get("SGLPATCH_TEST_WHEEL_HOME", "/var/tmp/sglpatch-tests/wheel-home"))
    home.mkdir(parents=True, exist_ok=True)
    try:
        return pristine_tree(version, home=home)
    except PatchsetError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot fetch the sglang {version} wheel: {exc}")


@pytest.fixture(scope="module")
def tree():
    """The pristine sglang 0.5.23 tree from the PyPI wheel (cached download, fresh verified tree)."""
    return _pristine_tree(V)


@pytest.fixture(scope="module", params=RELEASES)
def release(request):
    """``(version, pristine tree)`` for each SGLang release the current revision targets."""
    return request.param, _pristine_tree(request.param)


def _record_hashes(tree, version: str) -> dict[str, str]:
    rec = tree.read(f"sglang-{version}.dist-info/RECORD").decode()
    out = {}
    for row in csv.reader(rec.splitlines()):
        if len(row) >= 2 and row[1].startswith("sha256="):
            out[row[0]] = base64.urlsafe_b64decode(row[1][7:] + "==").hex()
    return out


def _patched_copy(ps, tree, dest: Path, version: str) -> Path:
    """Copy the touched files of the pristine tree to ``dest`` and apply the series with GNU patch."""
    target = ps.target(version)
    for path, sha in target.pristine.items():
        if sha is None:
            continue                        # a new module (new_files), absent from the release
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_bytes(tree.read(path))
    for rel in target.series:
        proc = subprocess.run(["patch", "-p1", "--fuzz=0", "--forward", "--batch",
                               "--no-backup-if-mismatch", "-i", str(DDTREE / rel)],
                              cwd=dest, capture_output=True, text=True)
        assert proc.returncode == 0, f"{rel} does not apply with --fuzz=0:\n{proc.stdout}{proc.stderr}"
        assert "offset" not in proc.stdout and "fuzz" not in proc.stdout, proc.stdout
    return dest


def test_pristine_hashes_are_the_wheel_record(ps, release):
    version, tree = release
    record = _record_hashes(tree, version)
    for path, sha in ps.target(version).pristine.items():
        if sha is None:                     # a module the patchset adds: not in the release
            assert path not in record and tree.read(path) is None, path
            continue
        assert sha == record[path] == _sha(tree.read(path)), path


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed")
def test_series_applies_with_gnu_patch_fuzz0_to_expected_hashes(ps, release, tmp_path):
    version, tree = release
    out = _patched_copy(ps, tree, tmp_path, version)
    target = ps.target(version)
    assert set(target.expected) == set(target.pristine)
    for path, sha in target.expected.items():
        if path in target.new_files:        # installed whole, not patched
            assert target.pristine[path] is None
            assert _sha((DDTREE / target.new_files[path]).read_bytes()) == sha, path
            continue
        assert _sha((out / path).read_bytes()) == sha, path


def test_series_renders_with_the_strict_applier(ps, release):
    version, tree = release
    res = ps.render(version, tree.read)    # checks pristine and expected hashes itself
    assert sorted(res.files) == sorted(ps.target(version).expected)
    for path, change in res.files.items():
        assert _sha(change.new) == ps.target(version).expected[path], path
    assert "+    DDTREE = auto()" in res.diff_text()
    assert "+    speculative_ddtree_budget: A[" in res.diff_text()
    # revision 2: the worker is dispatched, the revision-1 refusal is gone
    assert "+            return DDTreeWorker" in res.diff_text()
    assert "_ddtree_worker_missing" not in res.diff_text()


def test_revision_1_is_frozen_and_recognised_by_revision_2(ps, tree):
    r1, r2 = load_patchset("ddtree@1"), load_patchset("ddtree@2")
    assert (r2.revision, r1.revision) == (2, 1)
    assert r1.root == DDTREE / "history" / "r1"
    res = r1.render(V, tree.read)           # r1 still renders against the wheel, hashes checked
    assert "raise _ddtree_worker_missing(\"serving\")" in res.diff_text()
    assert r2.spec.history[1][V] == r1.target(V).expected
    changed = set()
    for path, sha in r1.target(V).expected.items():
        same = r2.target(V).expected[path] == sha      # a file r2 leaves as r1 made it
        assert r2.classify(path, sha, version=V) == ("patched" if same else "patched@r1"), path
        changed |= set() if same else {path}
    assert changed == {"sglang/srt/speculative/spec_info.py", "sglang/srt/arg_groups/speculative_hook.py"}
    # every file r1 touches is touched by r2 too (so an upgrade leaves nothing of r1 behind)
    assert set(r1.target(V).expected) <= set(r2.target(V).expected)


def test_revision_2_is_frozen_and_recognised_by_revision_3(ps, tree):
    """Revision 3 changes the worker (its start-up checks, the budget schedule), adds
    ddtree_budget.py and the schedule's argument and validation; revision 2 stays loadable and
    rendering as ``ddtree@2`` and is recognised by its hashes (by revision 3 and by the current one)."""
    r2, r3 = load_patchset("ddtree@2"), load_patchset("ddtree@3")
    assert (r3.revision, r2.revision) == (3, 2)
    assert r2.root == DDTREE / "history" / "r2"
    r2.render(V, tree.read)
    assert r3.spec.history[2][V] == ps.spec.history[2][V] == r2.target(V).expected
    assert ps.spec.history[1][V] == r3.spec.history[1][V] == r2.spec.history[1][V]
    changed = {p for p, sha in r2.target(V).expected.items() if r3.target(V).expected[p] != sha}
    assert changed == {"sglang/srt/speculative/ddtree_worker.py", "sglang/srt/arg_groups/fields/spec.py",
                       "sglang/srt/arg_groups/speculative_hook.py"}
    for path, sha in r2.target(V).expected.items():
        assert r3.classify(path, sha, version=V) == ("patched@r2" if path in changed else "patched"), path
    assert set(r3.target(V).expected) - set(r2.target(V).expected) == {"sglang/srt/speculative/ddtree_budget.py"}


def test_revision_3_is_frozen_and_recognised_by_revision_4(ps, tree):
    """Revision 4 (chain steps in the budget schedule; the Triton kernels by pipeline stage in
    sglang/kernels/ops/speculative/) no longer installs revision 3's ddtree_kernels.py: revision 3
    stays loadable and rendering as ``ddtree@3``, its files are recognised by their hashes, the
    kernel module among them (an upgrade deletes it), and nothing of revision 3 is left untracked."""
    r3, r4 = load_patchset("ddtree@3"), load_patchset("ddtree@4")
    assert (r4.revision, r3.revision) == (4, 3)
    assert r3.root == DDTREE / "history" / "r3"
    r3.render(V, tree.read)
    e3, e4 = r3.target(V).expected, r4.target(V).expected
    assert ps.spec.history[3][V] == r4.spec.history[3][V] == e3
    retired = set(e3) - set(e4)
    assert retired == {"sglang/srt/speculative/ddtree_kernels.py"}
    assert set(e4) - set(e3) == {f"sglang/kernels/ops/speculative/ddtree_{m}.py"
                                 for m in ("keys", "prep", "beam", "verify_inputs", "walk")}
    changed = {p for p, sha in e3.items() if p in e4 and e4[p] != sha}
    # the kernels' callers changed with the move (their imports), the rest is the chain steps' change
    assert {"sglang/srt/speculative/ddtree_tree.py", "sglang/srt/speculative/ddtree_accept.py"} <= changed
    for path, sha in e3.items():
        assert r4.classify(path, sha, version=V) == ("patched@r3" if path in changed | retired else "patched"), path
    # the current revision knows every frozen one (history/): a host without r3's module is pristine there
    assert ps.classify("sglang/srt/speculative/ddtree_kernels.py", None, version=V) == "pristine"


def test_revision_4_is_frozen_and_recognised_by_revision_5(ps, tree):
    """Revision 5 adds SGLang 0.5.22 (its own series) and adapts the DDTree modules to it; for
    0.5.23 it changes no SGLang file. Revision 4 stays loadable and rendering as ``ddtree@4``
    (0.5.23 only) and a host carrying it is recognised file by file (patched@r4 where r5 differs),
    by revision 5 and by the current revision."""
    r4, r5 = load_patchset("ddtree@4"), load_patchset("ddtree@5")
    assert (r5.revision, r4.revision) == (5, 4)
    assert r4.root == DDTREE / "history" / "r4"
    assert r4.versions == ["0.5.23"] and r5.versions == ["0.5.22", "0.5.23"]
    r4.render(V, tree.read)
    e4, e5 = r4.target(V).expected, r5.target(V).expected
    assert r5.spec.history[4][V] == ps.spec.history[4][V] == e4
    assert set(e4) == set(e5)
    assert [(r5.root / rel).read_bytes() for rel in r5.target(V).series] == \
        [(r4.root / rel).read_bytes() for rel in r4.target(V).series]
    changed = {p for p, sha in e4.items() if e5[p] != sha}
    assert "sglang/srt/speculative/ddtree_worker.py" in changed
    assert changed <= set(r5.target(V).new_files), changed     # only the DDTree modules changed
    for path, sha in e4.items():
        assert r5.classify(path, sha, version=V) == ("patched@r4" if path in changed else "patched"), path
        got = ps.classify(path, sha, version=V)
        if ps.target(V).expected[path] == sha:
            assert got == "patched", path
        else:       # the newest revision with these bytes (r4's file may have stayed so until r6)
            assert got.startswith("patched@r") and ps.spec.history[int(got[9:])][V][path] == sha, (path, got)


@pytest.mark.parametrize("version", ["0.5.22", "0.5.23"])
def test_revision_5_is_frozen_and_recognised_by_revision_6(ps, version):
    """Revision 6 adds SGLang 0.5.21 (its own series) and adapts ddtree_worker.py and
    ddtree_info.py to 0.5.21's DFlash worker; for 0.5.22 and 0.5.23 it changes no SGLang file and
    no series byte. Revision 5 stays loadable and rendering as ``ddtree@5`` and a host carrying it
    is recognised file by file: patched@r5 exactly where revision 6's bytes differ."""
    tree = _pristine_tree(version)
    r5, r6 = load_patchset("ddtree@5"), load_patchset("ddtree@6")
    assert (r6.revision, r5.revision) == (6, 5)
    assert r5.root == DDTREE / "history" / "r5"
    assert r5.versions == ["0.5.22", "0.5.23"] and r6.versions == ["0.5.21", "0.5.22", "0.5.23"]
    r5.render(version, tree.read)
    e5, e6 = r5.target(version).expected, r6.target(version).expected
    assert r6.spec.history[5][version] == ps.spec.history[5][version] == e5
    assert "0.5.21" not in ps.spec.history[5]
    assert set(e5) == set(e6)
    assert [(r6.root / rel).read_bytes() for rel in r6.target(version).series] == \
        [(r5.root / rel).read_bytes() for rel in r5.target(version).series]
    changed = {p for p, sha in e5.items() if e6[p] != sha}
    assert changed == {"sglang/srt/speculative/ddtree_worker.py", "sglang/srt/speculative/ddtree_info.py"}
    for path, sha in e5.items():
        assert r6.classify(path, sha, version=version) == ("patched@r5" if path in changed else "patched"), path


def _frozen_and_recognised(ps, version: str, old: int) -> set[str]:
    """Revision ``old`` stays loadable as ``ddtree@old`` from history/r{old}, renders on the
    pristine release, its expected hashes are the current patchset's ``history`` map, and a host
    carrying it is recognised file by file: patched@rN exactly where the current revision's bytes
    differ (N: the newest revision with those bytes, ``old`` unless later ones kept them), patched
    elsewhere. Returns those differing paths."""
    tree = _pristine_tree(version)
    older = load_patchset(f"ddtree@{old}")
    assert ps.revision > old and older.revision == old
    assert older.root == DDTREE / "history" / f"r{old}" and older.versions == ps.versions
    older.render(version, tree.read)
    e_old, e_now = older.target(version).expected, ps.target(version).expected
    assert ps.spec.history[old][version] == e_old and set(e_old) <= set(e_now)
    # files added since (revision 11's attention kernel) are new DDTree files, not SGLang's
    assert set(e_now) - set(e_old) <= set(ps.target(version).new_files) - set(older.target(version).new_files)
    changed = {p for p, sha in e_old.items() if e_now[p] != sha}
    for path, sha in e_old.items():
        # bytes that several revisions share are credited to the newest of them (classify's rule)
        newest = max(r for r, per in ps.spec.history.items() if per.get(version, {}).get(path) == sha)
        assert newest >= old
        assert ps.classify(path, sha, version=version) == (f"patched@r{newest}" if path in changed else "patched"), path
    return changed


_SPEC_FIELDS = "sglang/srt/arg_groups/fields/spec.py"
_SPEC_HOOK = "sglang/srt/arg_groups/speculative_hook.py"
_PREP = "sglang/kernels/ops/speculative/ddtree_prep.py"
_BUDGET = "sglang/srt/speculative/ddtree_budget.py"
_WORKER = "sglang/srt/speculative/ddtree_worker.py"
_TRITON = "sglang/srt/layers/attention/triton_backend.py"
_VERIFY_ATTN = "sglang/kernels/ops/speculative/ddtree_verify_attention.py"


@pytest.mark.parametrize("version", RELEASES)
def test_revision_6_is_frozen_and_recognised_by_the_current_revision(ps, version):
    """Revision 7 adds the ``auto`` budget planner: ddtree_budget.py and ddtree_worker.py, and the
    schedule argument's help and validation (spec.py, speculative_hook.py: patch 0010's two
    changed lines); later revisions change DDTree files only, but for revision 11's triton
    backend (patch 0011)."""
    changed = _frozen_and_recognised(ps, version, 6)
    assert {_BUDGET, _WORKER, _SPEC_FIELDS, _SPEC_HOOK, _TRITON} <= changed
    others = changed - {_SPEC_FIELDS, _SPEC_HOOK, _TRITON}
    assert others <= set(ps.target(version).new_files), others    # else only the DDTree modules


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize(("old", "changed"), [
    # r8: the preps' pass A, the planner's plan counter and the worker's log of it
    (7, {_PREP, _BUDGET, _WORKER, _TRITON, _SPEC_FIELDS, _SPEC_HOOK}),
    # r9: schedules beside the target's CUDA graphs; the prep's shared exp-sum
    (8, {_PREP, _BUDGET, _WORKER, _TRITON, _SPEC_FIELDS, _SPEC_HOOK}),
    # r10: the small-K prep's row program; an unused argument of the worker's check
    (9, {_PREP, _BUDGET, _WORKER, _TRITON, _SPEC_FIELDS, _SPEC_HOOK}),
    # r11: the triton backend's verify hook (and the new kernel file)
    (10, {_TRITON, _BUDGET, _WORKER, _SPEC_FIELDS, _SPEC_HOOK}),
    # r12: verify states per tree width, --speculative-ddtree-graph-memory (patch 0010); the
    # verify kernel's causal path and FOLD_G
    (11, {_BUDGET, _WORKER, _SPEC_FIELDS, _SPEC_HOOK, _VERIFY_ATTN}),
    # r13: auto as the default (schedule_source), its help texts and the hook's use of it; the
    # verify kernel's tree-part key step (BLOCK_T) and launch rule
    (12, {_BUDGET, _WORKER, _SPEC_FIELDS, _SPEC_HOOK, _VERIFY_ATTN}),
], ids=["r7", "r8", "r9", "r10", "r11", "r12"])
def test_revisions_7_to_12_are_frozen_and_recognised_on_the_files_that_changed_since(ps, version, old, changed):
    """Revisions 8, 9 and 10 change DDTree files only; revision 11 one SGLang file (the triton
    backend, patch 0011) and adds one DDTree file (the verify attention kernel); revision 12 the
    budget schedule's two argument files (patch 0010: --speculative-ddtree-graph-memory), the
    budget and worker modules and the verify kernel; revision 13 the same five files: a host carrying revision 7 to 12 is recognised as patched@rN
    exactly on the files changed since."""
    assert _frozen_and_recognised(ps, version, old) == changed
    older = load_patchset(f"ddtree@{old}").target(version).expected
    assert _VERIFY_ATTN in ps.target(version).expected and (_VERIFY_ATTN in older) == (old >= 11)


def test_what_sglpatch_asks_a_revision_about():
    """Features by revision: several verify widths beside CUDA graphs from revision 9 on;
    revisions 10 to 12 add none that sglpatch asks about (11's verify kernel changes no option,
    12's graph memory bound has a default that serves any schedule); revision 13 makes an unset
    schedule mean auto, so sglpatch must say ``fixed`` for a fixed budget from then on."""
    ps = load_patchset("ddtree")
    assert ps.revision == 13
    assert "budget_schedule_graphs" in ps.features_at(9) and "budget_schedule_graphs" not in ps.features_at(8)
    assert ps.features_at(12) == ps.features_at(11) == ps.features_at(10) == ps.features_at(9)
    assert ps.features_at(13) - ps.features_at(12) == {"budget_auto_default"}


@pytest.mark.parametrize("version", RELEASES)
def test_new_modules_are_installed_into_sglang_speculative_and_kernels_beside_sglangs(ps, version):
    t = ps.target(version)
    want = {"ddtree_reference", "ddtree_tree", "ddtree_accept", "ddtree_info", "ddtree_budget", "ddtree_worker"}
    kernels = {"ddtree_keys", "ddtree_prep", "ddtree_beam", "ddtree_verify_inputs", "ddtree_walk",
               "ddtree_verify_attention"}
    assert t.new_files == {**{f"sglang/srt/speculative/{m}.py": f"modules/{m}.py" for m in want},
                           **{f"sglang/kernels/ops/speculative/{m}.py": f"kernels/{m}.py" for m in kernels}}


def test_patched_files_compile(ps, release):
    version, tree = release
    for path, change in ps.render(version, tree.read).files.items():
        compile(change.new, path, "exec")


# --- every DFLASH site of the pristine tree is listed in the README ---------------------------------

def dflash_sites(read, paths) -> list[str]:
    """``path:line`` of every DFLASH check in ``paths``: a call of ``.is_dflash()`` or
    ``.is_dflash_family()``, the attribute ``SpeculativeAlgorithm.DFLASH``, or the string constant
    ``"DFLASH"`` (a whole string, as compared with ``speculative_algorithm``)."""
    sites = []
    for path in paths:
        source = read(path)
        if b"DFLASH" not in source and b"is_dflash" not in source:
            continue                        # cannot hold a site; parsing all 3,000 files takes 30 s
        with warnings.catch_warnings():     # sglang's own invalid escape sequences
            warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
            tree = ast.parse(source)
        for node in ast.walk(tree):
            hit = (
                (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and node.func.attr in ("is_dflash", "is_dflash_family"))
                or (isinstance(node, ast.Attribute) and node.attr == "DFLASH"
                    and isinstance(node.value, ast.Name) and node.value.id == "SpeculativeAlgorithm")
                or (isinstance(node, ast.Constant) and node.value == "DFLASH")
            )
            if hit:
                sites.append(f"{path}:{node.lineno}")
    return sorted(set(sites))


def _site_lines(tree, sites: list[str]) -> dict[str, tuple[str, str]]:
    """``path:line`` -> (path, that source line stripped)."""
    out = {}
    for site in sites:
        path, line = site.rsplit(":", 1)
        text = tree.read(path).decode("utf-8", "replace").splitlines()[int(line) - 1]
        out[site] = (path, text.strip())
    return out


def _all_sites(tree) -> list[str]:
    root = tree.tree
    paths = sorted(p.relative_to(root).as_posix() for p in (root / "sglang").rglob("*.py"))
    return dflash_sites(lambda p: (root / p).read_bytes(), paths)


def _readme_section(title_start: str) -> str:
    text = README.read_text()
    start = text.index(title_start)
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


@pytest.mark.parametrize("version", [v for v in RELEASES if v != V])
def test_readme_covers_every_dflash_site_of_another_release(tree, version):
    """Each DFLASH site of ``version`` whose source line the same file of 0.5.23 has at one of its
    sites is covered by that 0.5.23 row; each other site is in the README's table for ``version``
    (and that table lists nothing else)."""
    other = _pristine_tree(version)
    mine = _site_lines(other, _all_sites(other))
    known = set(_site_lines(tree, _all_sites(tree)).values())
    unmatched = {site for site, key in mine.items() if key not in known}
    section = _readme_section(f"## DFLASH checks of sglang {version}")
    listed = set(re.findall(r"`(sglang/[\w/]+\.py:\d+)`", section))
    assert not unmatched - listed, f"{version} DFLASH sites missing from {README.name}: {sorted(unmatched - listed)}"
    assert not listed - unmatched, f"{README.name} lists {version} sites that need no row: {sorted(listed - unmatched)}"
    assert len(mine) >= 40          # 57 in 0.5.22, 41 in 0.5.21: the scan found the release's sites


def test_readme_lists_every_dflash_site_of_the_pristine_tree(tree):
    root = tree.tree
    paths = sorted(p.relative_to(root).as_posix() for p in (root / "sglang").rglob("*.py"))
    found = dflash_sites(lambda p: (root / p).read_bytes(), paths)
    listed = set(re.findall(r"`(sglang/[\w/]+\.py:\d+)`",
                            _readme_section(f"## Every DFLASH check of sglang {V}")))
    missing = sorted(set(found) - listed)
    stale = sorted(listed - set(found))
    assert not missing, f"DFLASH sites missing from {README.name}: {missing}"
    assert not stale, f"{README.name} lists sites that are not DFLASH checks in {V}: {stale}"
    assert len(found) >= 60


# --- L1 in real target venvs -------------------------------------------------------------------------

def _run_l1(python: str, env_extra: dict[str, str] | None = None) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(env_extra or {})
    proc = subprocess.run([python, str(L1_SCRIPT)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout must be one JSON line, got:\n{proc.stdout[-2000:]}"
    checks = json.loads(lines[0])["checks"]
    assert len(checks) == L1_CHECKS and all(c["status"] in ("passed", "failed", "skipped")
                                            for c in checks), checks
    return checks


def _venv_or_skip(name: str, extra: list[str], version: str = V) -> Path:
    if extra and "PIP_FIND_LINKS" not in os.environ and Path("/opt/wheels").is_dir():
        os.environ["PIP_FIND_LINKS"] = "/opt/wheels"   # where the CPU torch wheel lies
    try:
        return venvs.pristine_venv(name, extra, version)
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot build the {name} {version} venv: {exc}")


@pytest.fixture(scope="module")
def l1_pristine_venv(release) -> Path:
    """The cached L1 venv of the release: sglang plus the CPU set (the same set serves 0.5.22 and
    0.5.21)."""
    reqs = venvs.read_requirements(REPO / "sglang_patcher" / "data" / "sglang-0.5.23-cpu-requirements.txt")
    assert reqs, "sglang_patcher/data/sglang-0.5.23-cpu-requirements.txt is empty"
    base = _venv_or_skip("sglang-l1", reqs)
    return base if release[0] == V else venvs.release_swap_venv(base, release[0], "sglang-l1")


@pytest.fixture(scope="module")
def l1_patched_venv(l1_pristine_venv, ps, release, tmp_path_factory) -> venvs.TargetVenv:
    """A working copy of the L1 venv (dependencies hard-linked) with the series applied."""
    version, tree = release
    dest = tmp_path_factory.mktemp("l1-patched") / "venv"
    target = venvs.clone_venv(l1_pristine_venv, dest, share_deps=True)
    for path, change in ps.render(version, tree.read).files.items():
        (target.site_packages / path).write_bytes(change.new)
    yield target
    venvs.remove_venv(dest)


@pytest.mark.l1
def test_l1_skips_everything_on_a_no_deps_venv(ps, release, tmp_path):
    version, tree = release
    pristine = _venv_or_skip("sglang", [], version)
    target = venvs.clone_venv(pristine, tmp_path / "venv")
    try:
        for path, change in ps.render(version, tree.read).files.items():
            (target.site_packages / path).write_bytes(change.new)
        checks = _run_l1(str(target))
    finally:
        venvs.remove_venv(tmp_path / "venv")
    assert {c["status"] for c in checks} == {"skipped"}, checks
    assert all(c["detail"].startswith("missing module ") for c in checks), checks


@pytest.mark.l1
@pytest.mark.slow
def test_l1_fails_on_the_unpatched_tree(l1_pristine_venv, release):
    checks = {c["name"]: c for c in _run_l1(str(l1_pristine_venv / "bin" / "python"))}
    assert checks["import patched modules"]["status"] == "passed"
    assert checks["from_string DDTREE"]["status"] == "failed"
    assert "Unknown speculative algorithm name: DDTREE" in checks["from_string DDTREE"]["detail"]
    others = [c for n, c in checks.items() if n != "import patched modules"]
    # failed, or skipped where the check first needs a module this venv lacks; never passed
    assert all(c["status"] == "failed" or (c["status"] == "skipped"
               and c["detail"].startswith("missing module ")) for c in others), others
    assert sum(c["status"] == "failed" for c in others) >= 17, others


@pytest.mark.l1
@pytest.mark.slow
def test_l1_passes_on_the_patched_tree(l1_patched_venv, release):
    checks = {c["name"]: c for c in _run_l1(str(l1_patched_venv))}
    # The L1 venv (sglang_patcher/data/sglang-0.5.23-cpu-requirements.txt) has no transformers:
    # the checks that import SGLang's model-executor stack say so; everything else must pass.
    needs_transformers = {"DDTreeWorker subclasses DFlashWorkerV2", "capture input carries the tree mask",
                          "KV reservation is block + max(block, budget + 1)",
                          "other verify widths run eagerly beside the CUDA graphs"}
    bad = {n: c for n, c in checks.items() if c["status"] != "passed"
           and not (n in needs_transformers and c["status"] == "skipped"
                    and c["detail"].startswith("missing module "))}
    assert not bad, json.dumps(bad, indent=1)
    assert "refused" in checks["validation refuses a hybrid target without the override"]["detail"]
    assert "refused" in checks["validation refuses a hybrid SWA target"]["detail"]
    assert "DDTreeWorker" in checks["create_worker resolves DDTREE to DDTreeWorker"]["detail"]
    assert "'target': 65" in checks["target verify width is budget + 1"]["detail"]


def test_an_edited_copys_stale_hashes_say_both_steps(tmp_path):
    """A new user edited a copy of the catalog's ddtree: the stale-hashes error said "refresh", and
    after the refresh apply refused the copy as an impostor of the catalog revision. The first
    error now says both: refresh, and give the copy its own revision or name."""
    import shutil

    root = tmp_path / "ddtree"
    shutil.copytree(DDTREE, root, ignore=shutil.ignore_patterns("__pycache__", "history"))
    mod = root / "modules" / "ddtree_budget.py"
    mod.write_bytes(mod.read_bytes() + b"# edited\n")
    copy = load_patchset(root)
    with pytest.raises(PatchsetError, match="stale for sglang") as exc:
        copy.render(V, _pristine_tree(V).read)
    assert f"sglpatch patchset refresh {root} --sglang {V}" in exc.value.hint
    assert "copy of the catalog's ddtree" in exc.value.hint and "own revision" in exc.value.hint
