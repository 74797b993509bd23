"""``patchset port`` on small synthetic releases: each outcome (as is, offset, merged, already in the
release, conflict, vanished, moved), what is written (and when nothing is), the CLI and its exit code.

The two releases are dicts of files; the CLI tests put them where the wheel cache keeps verified
pristine trees (``$SGLPATCH_HOME/wheels/sglang-<v>/``), so no download happens.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from sglang_patcher.applier import apply_series
from sglang_patcher.cli import main
from sglang_patcher.errors import ConfigError, PatchsetError
from sglang_patcher.manifest import FileEntry, Manifest
from sglang_patcher.patchset import load_patchset
from sglang_patcher.patchset_write import refresh_hashes
from sglang_patcher.patchset_identity import check_port_finished
from sglang_patcher.port import port_series, write_port

OLD, NEW = "1.0", "1.1"
A = "sglang/srt/a.py"              # the release adds lines above the hunk: offset
B = "sglang/srt/b.py"              # the release changes a context line: merged
C = "sglang/srt/c.py"              # the release changes the line the hunk changes: conflict
U = "sglang/srt/u.py"              # the release already has the change: already_applied
V = "sglang/srt/gone/v.py"         # not in the new release: vanished
V_TWIN = "sglang/srt/other/v.py"   # same name, in both releases, other content: not where V went
M_OLD = "sglang/srt/old_place/m.py"
M_NEW = "sglang/srt/new_place/m.py"  # M moved here in the new release (a file new in it)
NEW_MODULE = "sglang/srt/ddx_mod.py"


def body(tag: str, n: int = 30) -> bytes:
    return b"".join(f"{tag} line {i}\n".encode() for i in range(1, n + 1))


def replace(data: bytes, old: str, new: str) -> bytes:
    assert old.encode() in data, old
    return data.replace(old.encode(), new.encode(), 1)


def sha(b: bytes | None) -> str | None:
    return None if b is None else hashlib.sha256(b).hexdigest()


OLD_TREE = {
    A: body("a"), B: body("b"), C: body("c"), U: body("u"), V: body("v"),
    V_TWIN: b"".join(f"unrelated {i}\n".encode() for i in range(40)),
    M_OLD: body("m"), "sglang/srt/untouched.py": b"x = 1\n",
}
NEW_TREE = {
    A: b"# new header\n" * 4 + body("a"),
    B: replace(body("b"), "b line 13\n", "b line 13 (changed upstream)\n"),
    C: replace(body("c"), "c line 10\n", "c line 10 (upstream)\n"),
    U: replace(body("u"), "u line 5\n", "u line 5\nUDD = 1\n"),
    V_TWIN: OLD_TREE[V_TWIN],
    M_NEW: replace(body("m"), "m line 29\n", "m line 29 (moved with it)\n"),
    "sglang/srt/untouched.py": b"x = 2\n",
}
PATCHED = {   # what the series makes of the old release
    A: replace(body("a"), "a line 10\n", "a line 10\nDDX_A = 1\n"),
    B: replace(body("b"), "b line 10\n", "b line 10 with ddx\n"),
    C: replace(body("c"), "c line 10\n", "c line 10 with ddx\n"),
    U: replace(body("u"), "u line 5\n", "u line 5\nUDD = 1\n"),
    V: replace(body("v"), "v line 8\n", "v line 8\nDDX_V = 1\n"),
    M_OLD: replace(body("m"), "m line 15\n", "m line 15\nDDX_M = 1\n"),
}
A_AGAIN = replace(PATCHED[A], "DDX_A = 1\n", "DDX_A = 1\nDDX_A2 = 2\n")   # patch 3 builds on patch 1
MODULE = b"def ddx():\n    return 1\n"


def udiff(path: str, old: bytes, new: bytes) -> str:
    out = list(difflib.unified_diff(old.decode().splitlines(True), new.decode().splitlines(True), n=3))[2:]
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n" + "".join(out)


def make_patchset(base: Path, patched: dict[str, bytes] | None = None) -> Path:
    patched = patched or PATCHED
    root = base / "ddx"
    (root / f"sglang-{OLD}").mkdir(parents=True)
    (root / "modules").mkdir()
    (root / "modules/ddx_mod.py").write_bytes(MODULE)
    series = {
        "0001-a-b.patch": [A, B],
        "0002-rest.patch": [p for p in (C, U, V, M_OLD) if p in patched],
    }
    for name, paths in series.items():
        text = f"ddx (1/3): {name}\n\nWhat this patch does.\n\n"
        text += "".join(udiff(p, OLD_TREE[p], patched[p]) for p in paths)
        (root / f"sglang-{OLD}/{name}").write_text(text)
    (root / f"sglang-{OLD}/0003-a-again.patch").write_text(udiff(A, patched[A], A_AGAIN))
    doc = {"name": "ddx", "revision": 2, "description": "test patchset",
           "targets": {OLD: {"series": [f"sglang-{OLD}/{n}" for n in (*series, "0003-a-again.patch")],
                             "new_files": {NEW_MODULE: "modules/ddx_mod.py"}}}}
    (root / "patchset.yaml").write_text("# ddx: a test patchset (comment kept)\n"
                                        + yaml.safe_dump(doc, sort_keys=False) + "# trailing comment\n")
    refresh_hashes(root, OLD, OLD_TREE.get)
    return root


def port(root: Path, new_tree: dict[str, bytes] = NEW_TREE):
    return port_series(load_patchset(root), OLD, NEW, OLD_TREE.get, new_tree.get,
                       old_paths=OLD_TREE, new_paths=new_tree)


def by_path(result) -> dict[str, list]:
    out: dict[str, list] = {}
    for h in result.hunks:
        out.setdefault(h.path, []).append(h)
    return out


def test_each_hunk_reports_how_it_carried(tmp_path):
    result = port(make_patchset(tmp_path))
    hunks = by_path(result)
    assert [(h.status, h.offset) for h in hunks[A]] == [("offset", 4), ("offset", 4)]
    assert [h.line for h in hunks[A]] == [12, 13]   # after the 4 new header lines (0001 adds DDX_A first)
    (b,) = hunks[B]
    assert b.status == "merged" and (b.line, b.offset) == (7, 0) and "does not apply" in b.detail
    (c,) = hunks[C]
    assert c.status == "conflict" and len(c.conflicts) == 1
    region = c.conflicts[0]
    assert region.ours == (b"c line 10 (upstream)\n",) and region.base == (b"c line 10\n",)
    assert region.theirs == (b"c line 10 with ddx\n",) and region.ours_start == 9
    assert [h.status for h in hunks[U]] == ["already_applied"]
    assert [h.status for h in hunks[V]] == ["vanished"]
    assert hunks[V][0].new_path is None and "none of its context lines" in hunks[V][0].detail
    (m,) = hunks[M_OLD]
    assert m.status == "applied" and m.new_path == M_NEW
    assert result.counts() == {"applied": 1, "offset": 2, "already_applied": 1, "merged": 1, "conflict": 1,
                               "vanished": 1}
    assert not result.complete and {h.path for h in result.blocking} == {C, V}
    assert "0002-rest.patch: sglang/srt/c.py hunk 1" in result.failure()


def test_vanished_and_moved_files_are_named(tmp_path):
    result = port(make_patchset(tmp_path))
    moved, gone = result.files[M_OLD], result.files[V]
    assert moved.fate == "moved" and moved.new_path == M_NEW and moved.similarity > 0.9
    assert "new in 1.1" in moved.note
    assert gone.fate == "vanished" and gone.new_path is None
    assert V_TWIN not in gone.note       # the file of the same name in both releases is another module
    assert result.files[A].fate == "kept"


def test_the_ported_series_applies_strictly_and_carries_every_carried_change(tmp_path):
    result = port(make_patchset(tmp_path))
    series = [(p.dest, p.text) for p in result.patches if p.text]
    assert [p.dest for p in result.patches] == [f"sglang-{NEW}/0001-a-b.patch", f"sglang-{NEW}/0002-rest.patch",
                                                f"sglang-{NEW}/0003-a-again.patch"]
    files = apply_series(series, NEW_TREE.get).files
    assert files[A].new == b"# new header\n" * 4 + A_AGAIN
    assert files[B].new == replace(NEW_TREE[B], "b line 10\n", "b line 10 with ddx\n")
    assert files[M_NEW].new == replace(NEW_TREE[M_NEW], "m line 15\n", "m line 15\nDDX_M = 1\n")
    assert C not in files and U not in files and V not in files     # conflict, upstream, vanished
    text = result.patches[0].text
    assert text.startswith("ddx (1/3): 0001-a-b.patch\n\nWhat this patch does.\n\nPorted from sglang 1.0 to 1.1")
    assert "hunks: 1 offset, 1 merged" in text


def test_conflicted_file_is_the_three_way_merge_with_markers(tmp_path):
    result = port(make_patchset(tmp_path))
    assert sorted(result.conflict_files) == [C]
    text = result.conflict_files[C].decode()
    assert ("<<<<<<< sglang 1.1\nc line 10 (upstream)\n||||||| sglang 1.0\nc line 10\n=======\n"
            "c line 10 with ddx\n>>>>>>> ddx r2\n") in text
    assert text.startswith("c line 1\n") and text.endswith("c line 30\n")


def test_a_release_carrying_everything_writes_the_target_with_pins(tmp_path):
    clean_new = {**NEW_TREE, C: OLD_TREE[C], V: OLD_TREE[V]}
    root = make_patchset(tmp_path)
    result = port(root, clean_new)
    assert result.complete and result.counts()["conflict"] == 0
    written = write_port(result, root, clean_new.get)
    assert written["patchset_yaml"] and not written["partial"]
    text = (root / "patchset.yaml").read_text()
    assert text.startswith("# ddx: a test patchset (comment kept)\n") and "# trailing comment" in text
    assert f'"{NEW}":  # ported from {OLD} by `sglpatch patchset port`' in text
    ps = load_patchset(root)
    t = ps.target(NEW)
    assert t.series == [f"sglang-{NEW}/0001-a-b.patch", f"sglang-{NEW}/0002-rest.patch",
                        f"sglang-{NEW}/0003-a-again.patch"]
    assert t.new_files == {NEW_MODULE: "modules/ddx_mod.py"}
    assert t.pristine[B] == sha(clean_new[B]) and t.pristine[M_NEW] == sha(clean_new[M_NEW])
    assert U not in t.pristine                     # already in the release: nothing to pin
    rendered = ps.render(NEW, clean_new.get)       # pins check out
    assert rendered.files[NEW_MODULE].new == MODULE
    assert ps.target(OLD).series[0] == f"sglang-{OLD}/0001-a-b.patch"   # the old target is untouched


def test_with_a_conflict_nothing_is_written_unless_partial(tmp_path):
    root = make_patchset(tmp_path)
    before = (root / "patchset.yaml").read_text()
    result = port(root)
    written = write_port(result, root, NEW_TREE.get)
    assert written["patchset_yaml"] is None and "did not carry" in written["reason"]
    assert (root / "patchset.yaml").read_text() == before and not (root / f"sglang-{NEW}").exists()
    written = write_port(result, root, NEW_TREE.get, partial=True)
    assert written["partial"] is True
    assert "PARTIAL port from 1.0" in (root / "patchset.yaml").read_text()
    ps = load_patchset(root)
    ps.render(NEW, NEW_TREE.get)
    assert C not in ps.target(NEW).expected and B in ps.target(NEW).expected
    # what it lacks is a field of the target, not only a comment: apply refuses it by that list
    assert ps.target(NEW).left_out == result.left_out_changes and len(result.left_out_changes) == 2
    assert any(C in c and "conflict" in c for c in ps.target(NEW).left_out), ps.target(NEW).left_out
    with pytest.raises(PatchsetError) as exc:
        check_port_finished(ps, NEW)
    assert "partial port" in str(exc.value) and "2 change(s) left out" in str(exc.value)
    assert str(root / "patchset.yaml") in str(exc.value) and f"targets.{NEW}.left_out" in exc.value.hint
    check_port_finished(ps, OLD)                   # the source target is complete
    # a re-pin keeps the list; deleting it (the port finished by hand) lets the target through
    refresh_hashes(root, NEW, NEW_TREE.get)
    assert load_patchset(root).target(NEW).left_out == result.left_out_changes
    doc = yaml.safe_load((root / "patchset.yaml").read_text())
    del doc["targets"][NEW]["left_out"]
    (root / "patchset.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    check_port_finished(load_patchset(root), NEW)


def test_write_refuses_a_non_empty_series_directory_and_an_existing_target(tmp_path):
    clean_new = {**NEW_TREE, C: OLD_TREE[C], V: OLD_TREE[V]}
    root = make_patchset(tmp_path)
    result = port(root, clean_new)
    (root / f"sglang-{NEW}").mkdir()
    (root / f"sglang-{NEW}/stray.patch").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        write_port(result, root, clean_new.get)
    (root / f"sglang-{NEW}/stray.patch").unlink()
    write_port(result, root, clean_new.get)
    (root / f"sglang-{NEW}/0001-a-b.patch").unlink()
    (root / f"sglang-{NEW}/0002-rest.patch").unlink()
    (root / f"sglang-{NEW}/0003-a-again.patch").unlink()
    with pytest.raises(ConfigError, match="already has a target 1.1"):
        write_port(result, root, clean_new.get)


def test_a_from_target_that_does_not_render_is_refused(tmp_path):
    root = make_patchset(tmp_path)
    edited = {**OLD_TREE, B: OLD_TREE[B] + b"edited\n"}
    with pytest.raises(PatchsetError, match="not the sglang 1.0 release file"):
        port_series(load_patchset(root), OLD, NEW, edited.get, NEW_TREE.get, old_paths=edited, new_paths=NEW_TREE)


def test_new_file_clashing_with_a_release_file_does_not_carry(tmp_path):
    new_tree = {**NEW_TREE, C: OLD_TREE[C], V: OLD_TREE[V], NEW_MODULE: b"upstream's own\n"}
    result = port(make_patchset(tmp_path), new_tree)
    assert [n.status for n in result.new_files] == ["clash"]
    assert not result.complete and "new file sglang/srt/ddx_mod.py" in result.failure()


# ------------------------------------------------------------------------------------------- CLI


def fake_wheel_tree(home: Path, version: str, files: dict[str, bytes]) -> None:
    """A verified pristine tree where ``wheelcache.pristine_tree`` finds it (no download)."""
    root = home / "wheels" / f"sglang-{version}"
    entries = {}
    for path, data in files.items():
        f = root / "tree" / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        entries[path] = FileEntry(path, sha(data), len(data))
    Manifest(source=f"wheel:sglang=={version}", sglang_version=version, files=entries).save(root / "manifest.json")


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    fake_wheel_tree(home, OLD, OLD_TREE)
    fake_wheel_tree(home, NEW, NEW_TREE)
    monkeypatch.setenv("SGLPATCH_HOME", str(home))
    return home


class Run:
    def __init__(self, code: int, out: str, err: str):
        self.exit_code, self.stdout = code, out
        self.output = " ".join((out + err).split())    # rich wraps at the console width


@pytest.fixture()
def run(capsys):
    def run(*args: str) -> Run:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return Run(code, out, err)
    return run


def test_cli_check_exits_4_naming_the_hunks_and_writes_nothing(tmp_path, home, run):
    root = make_patchset(tmp_path)
    before = (root / "patchset.yaml").read_text()
    r = run("--json", "patchset", "port", str(root), "--from", OLD, "--to", NEW, "--check")
    assert r.exit_code == 4, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 4 and doc["type"] == "ApplyError"
    assert "sglang/srt/c.py hunk 1" in doc["error"] and "sglang/srt/gone/v.py hunk 1" in doc["error"]
    assert doc["counts"]["merged"] == 1 and doc["files"][M_OLD]["new_path"] == M_NEW
    conflict = next(h for h in doc["hunks"] if h["status"] == "conflict")
    assert conflict["conflicts"][0]["ours"] == "c line 10 (upstream)\n"
    assert (root / "patchset.yaml").read_text() == before and not (root / f"sglang-{NEW}").exists()
    assert not (home / "port").exists()


def test_cli_out_ports_into_a_copy_with_the_conflicted_files(tmp_path, home, run):
    root = make_patchset(tmp_path)
    before = (root / "patchset.yaml").read_text()
    out = tmp_path / "scratch"
    r = run("patchset", "port", str(root), "--from", OLD, "--to", NEW, "--out", str(out), "--partial")
    assert r.exit_code == 4
    assert "conflict: sglang-1.0/0002-rest.patch: sglang/srt/c.py hunk 1" in r.output
    # a PARTIAL target is said plainly, with how much it lacks and what to do next, not as a success
    head = r.output.split(" file as is offset")[0]            # the headline, above the table
    assert head.endswith("1 conflict(s), 1 vanished — PARTIAL target written: 2 change(s) left out (below)"), head
    flat = "".join(r.output.split())                         # long paths wrap anywhere

    def said(text: str) -> bool:
        return "".join(text.split()) in flat
    assert said(f"PARTIAL: wrote the target {NEW} into {out / 'ddx' / 'patchset.yaml'} WITHOUT 2 change(s)")
    assert said("next: finish it by hand (docs/patchsets.md, \"Finishing a port by hand\")")
    assert said(f"`sglpatch patchset refresh {out / 'ddx'} --sglang {NEW}`")
    assert said(f"error: ddx r2: the target {NEW} written into {out / 'ddx' / 'patchset.yaml'} is PARTIAL — 2 change(s)")
    assert "PARTIAL" not in before and (root / "patchset.yaml").read_text() == before
    copy = load_patchset(out / "ddx")
    assert copy.target(NEW).series[0] == f"sglang-{NEW}/0001-a-b.patch"
    assert len(copy.target(NEW).left_out) == 2
    # diff of the partial copy renders, and says in its summary what the target lacks
    r = run("diff", str(out / "ddx"), "--sglang", NEW)
    assert r.exit_code == 0, r.output
    assert "PARTIALport:thistargetlacks2change(s)" in "".join(r.output.split()), r.output
    r = run("--json", "diff", str(out / "ddx"), "--sglang", NEW)
    assert len(json.loads(r.stdout)["left_out"]) == 2
    # ...and so does `patchset show` (text and JSON)
    r = run("patchset", "show", str(out / "ddx"))
    assert r.exit_code == 0 and f"PARTIALport:sglang{NEW}lacks2change(s)" in "".join(r.output.split()), r.output
    r = run("--json", "patchset", "show", str(out / "ddx"))
    doc = json.loads(r.stdout)
    assert len(doc["targets"][NEW]["left_out"]) == 2 and doc["targets"][OLD]["left_out"] == [], doc["targets"]
    assert (out / "conflicts" / f"sglang-{NEW}" / C).read_bytes() .count(b"<<<<<<< sglang 1.1") == 1
    report = json.loads((out / f"report-sglang-{NEW}.json").read_text())
    assert report["written"]["partial"] is True and report["mode"] == "out"
    assert report["partial"] is True and report["left_out"] == 2 and report["complete"] is False
    # the copy exists now: a second --out to the same place is refused before any work
    r = run("patchset", "port", str(root), "--from", OLD, "--to", NEW, "--out", str(out))
    assert r.exit_code == 2 and "exists" in r.output
    r = run("--json", "patchset", "port", str(root), "--from", OLD, "--to", NEW, "--out", str(tmp_path / "j"),
            "--partial")
    doc = json.loads(r.stdout)
    assert r.exit_code == 4 and doc["exit_code"] == 4 and doc["partial"] is True and doc["left_out"] == 2, doc
    assert "is PARTIAL" in doc["error"] and "Finishing a port by hand" in doc["hint"], doc
    r = run("patchset", "port", str(root), "--from", OLD, "--to", NEW, "--out", str(tmp_path / "k"))
    assert r.exit_code == 4 and "PARTIAL" not in r.output and "--partial writes the target" in r.output


def test_cli_in_place_writes_the_target_when_everything_carries(tmp_path, home, run):
    fake_wheel_tree(home, "1.2", {**NEW_TREE, C: OLD_TREE[C], V: OLD_TREE[V]})
    root = make_patchset(tmp_path)
    r = run("--json", "patchset", "port", str(root), "--from", OLD, "--to", "1.2")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["complete"] is True and doc["mode"] == "in_place"
    assert doc["written"]["series"][0] == "sglang-1.2/0001-a-b.patch"
    assert load_patchset(root).target("1.2").series
    r = run("patchset", "port", str(root), "--from", OLD, "--to", "1.2")
    assert r.exit_code == 2 and "already has a target 1.2" in r.output
    r = run("--json", "patchset", "port", str(root), "--from", OLD, "--to", "1.2", "--check")
    assert r.exit_code == 0 and json.loads(r.stdout)["complete"] is True


def test_cli_refuses_an_unknown_from_and_the_same_release(tmp_path, home, run):
    root = make_patchset(tmp_path)
    r = run("patchset", "port", str(root), "--from", "0.9", "--to", NEW)
    assert r.exit_code == 3 and "does not support sglang 0.9" in r.output
    r = run("patchset", "port", str(root), "--from", OLD, "--to", OLD, "--check")
    assert r.exit_code == 2
