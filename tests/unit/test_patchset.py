"""patchset.yaml: loading (by path, name, name@N), errors, rendering, hash states, refresh."""

from __future__ import annotations

import os

import difflib
import hashlib
import json
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from sglang_patcher.errors import ApplyError, ConfigError, PatchsetError, UnsupportedVersionError
from sglang_patcher.patchset import available_patchsets, load_patchset
from sglang_patcher.patchset_write import refresh_hashes

V = "0.5.23"
SPEC = "sglang/srt/speculative/spec_info.py"
ARGS = "sglang/srt/server_args.py"
NEW = "sglang/srt/speculative/ddtree_x.py"


def sha(b: bytes | None) -> str | None:
    return None if b is None else hashlib.sha256(b).hexdigest()


def udiff(path: str, old: bytes, new: bytes) -> str:
    body = list(difflib.unified_diff(old.decode().splitlines(True), new.decode().splitlines(True), n=3))[2:]
    return f"--- a/{path}\n+++ b/{path}\n" + "".join(body)


RELEASE = {
    SPEC: b"".join(f"spec line {i}\n".encode() for i in range(1, 30)),
    ARGS: b"".join(f"args line {i}\n".encode() for i in range(1, 30)),
}
PATCHED = {
    SPEC: RELEASE[SPEC].replace(b"spec line 10\n", b"spec line 10\nDDTREE = 1\n"),
    ARGS: RELEASE[ARGS].replace(b"args line 20\n", b"args line 20\nddtree_budget = 16\n"),
}
MODULE = b"def build_tree():\n    return 1\n"


def read_release(path: str) -> bytes | None:
    return RELEASE.get(path)


def make_patchset(base: Path, name: str = "demo", revision: int = 1, *, hashes: bool = True,
                  extra_yaml: str = "") -> Path:
    root = base / name
    (root / f"sglang-{V}").mkdir(parents=True, exist_ok=True)
    (root / "modules").mkdir(exist_ok=True)
    (root / "checks").mkdir(exist_ok=True)
    (root / f"sglang-{V}/0001-spec.patch").write_text(udiff(SPEC, RELEASE[SPEC], PATCHED[SPEC]))
    (root / f"sglang-{V}/0002-args.patch").write_text(udiff(ARGS, RELEASE[ARGS], PATCHED[ARGS]))
    (root / "modules/ddtree_x.py").write_bytes(MODULE)
    (root / "checks/l1.py").write_text("print('{}')\n")
    pristine = {SPEC: sha(RELEASE[SPEC]), ARGS: sha(RELEASE[ARGS])}
    expected = {SPEC: sha(PATCHED[SPEC]), ARGS: sha(PATCHED[ARGS]), NEW: sha(MODULE)}
    doc = {
        "name": name, "revision": revision, "description": "demo patchset",
        "targets": {V: {"series": [f"sglang-{V}/0001-spec.patch", f"sglang-{V}/0002-args.patch"],
                        "new_files": {NEW: "modules/ddtree_x.py"},
                        "pristine": pristine if hashes else {}, "expected": expected if hashes else {}}},
        "checks": {"l1": "checks/l1.py"},
    }
    (root / "patchset.yaml").write_text("# demo patchset (comment kept by refresh)\n"
                                        + yaml.safe_dump(doc, sort_keys=False) + extra_yaml)
    return root


# --------------------------------------------------------------------------------------- loading

def test_load_by_path_and_by_name(tmp_path):
    root = make_patchset(tmp_path)
    ps = load_patchset(root)
    assert (ps.name, ps.revision, ps.versions) == ("demo", 1, [V])
    assert ps.l1_check == root / "checks/l1.py"
    assert load_patchset("demo", search=[tmp_path]).root == root
    assert load_patchset(str(root / "patchset.yaml")).name == "demo"


def test_unknown_patchset_lists_available(tmp_path):
    make_patchset(tmp_path, "demo")
    make_patchset(tmp_path, "other")
    with pytest.raises(PatchsetError) as exc:
        load_patchset("nope", search=[tmp_path])
    assert "unknown patchset 'nope'" in str(exc.value) and "demo, other" in str(exc.value)
    assert set(available_patchsets([tmp_path])) == {"demo", "other"}
    with pytest.raises(PatchsetError) as exc:
        load_patchset("demoo", search=[tmp_path])
    assert "did you mean 'demo'?" in exc.value.hint
    # a directory of that name here is a path to give as ./NAME (a bare word is a name)
    mine = make_patchset(tmp_path / "cwd", "mine")
    cwd = os.getcwd()
    os.chdir(mine.parent)
    try:
        with pytest.raises(PatchsetError) as exc:
            load_patchset("mine", search=[tmp_path])
        assert "./mine holds a patchset.yaml: give it as a path, ./mine" in exc.value.hint, exc.value.hint
        assert load_patchset("./mine").name == "mine"
    finally:
        os.chdir(cwd)
    with pytest.raises(PatchsetError) as exc:
        load_patchset("demo@x", search=[tmp_path])
    assert "is not a patchset name" in str(exc.value) and "NAME@REVISION" in exc.value.hint


def test_name_is_looked_up_in_cwd_patchsets(tmp_path, monkeypatch):
    make_patchset(tmp_path / "patchsets", "cwdonly")
    monkeypatch.chdir(tmp_path)
    assert load_patchset("cwdonly").root.resolve() == (tmp_path / "patchsets/cwdonly").resolve()


def test_malformed_yaml_names_file_and_line(tmp_path):
    root = make_patchset(tmp_path)
    (root / "patchset.yaml").write_text("name: demo\nrevision: 1\ntargets:\n  \"0.5.23\": [unclosed\n")
    with pytest.raises(ConfigError) as exc:
        load_patchset(root)
    msg = str(exc.value)
    assert "patchset.yaml:" in msg and "malformed YAML" in msg and "hint" in msg
    assert ":5:" in msg or ":4:" in msg


def test_invalid_field_names_field_and_line(tmp_path):
    root = make_patchset(tmp_path)
    text = (root / "patchset.yaml").read_text().replace(sha(RELEASE[SPEC]), "not-a-sha")
    (root / "patchset.yaml").write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_patchset(root)
    msg = str(exc.value)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "not-a-sha" in l)
    assert f"patchset.yaml:{line}:" in msg and "targets.0.5.23.pristine" in msg


def test_unknown_key_is_refused(tmp_path):
    root = make_patchset(tmp_path, extra_yaml="serie: []\n")
    with pytest.raises(ConfigError, match="serie"):
        load_patchset(root)


def test_unquoted_float_version_key_is_refused(tmp_path):
    root = make_patchset(tmp_path)
    text = (root / "patchset.yaml").read_text()
    text = text.replace(f"'{V}':", "0.6:").replace(f"  {V}:", "  0.6:")
    assert "0.6:" in text
    (root / "patchset.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"version key 0.6 is not a string: quote it"):
        load_patchset(root)


def test_missing_series_file(tmp_path):
    root = make_patchset(tmp_path)
    (root / f"sglang-{V}/0002-args.patch").unlink()
    with pytest.raises(PatchsetError) as exc:
        load_patchset(root)
    assert "0002-args.patch does not exist" in str(exc.value) and "patchset.yaml:" in str(exc.value)


def test_series_path_escaping_the_patchset_is_refused(tmp_path):
    root = make_patchset(tmp_path)
    text = (root / "patchset.yaml").read_text().replace(f"sglang-{V}/0001-spec.patch", "../evil.patch")
    (root / "patchset.yaml").write_text(text)
    with pytest.raises(ConfigError, match="'..'"):
        load_patchset(root)


@pytest.mark.parametrize("path", ["evil.py", "sitecustomize_hook.pth", "torch/__init__.py", "sglang"])
def test_a_path_outside_the_sglang_package_is_refused(tmp_path, path):
    """A patchset touches SGLang only: no other package, top-level module or .pth (run at every
    interpreter start) — in the hash maps or as a new file — found by a new user's damaged copy."""
    root = make_patchset(tmp_path)
    text = (root / "patchset.yaml").read_text()
    (root / "patchset.yaml").write_text(text.replace(f"    {NEW}: modules/ddtree_x.py", f"    {path}: modules/ddtree_x.py"))
    with pytest.raises(ConfigError, match="outside the sglang package"):
        load_patchset(root)
    (root / "patchset.yaml").write_text(text.replace(f"    {NEW}: ", f"    {path}: ", 1))
    with pytest.raises(ConfigError, match="outside the sglang package"):
        load_patchset(root)


def test_name_must_match_directory(tmp_path):
    root = make_patchset(tmp_path, "demo")
    shutil.move(root, tmp_path / "renamed")
    with pytest.raises(ConfigError, match="name is 'demo'"):
        load_patchset("renamed", search=[tmp_path])


def test_unsupported_version_lists_supported(tmp_path):
    ps = load_patchset(make_patchset(tmp_path))
    with pytest.raises(UnsupportedVersionError) as exc:
        ps.target("0.5.22")
    assert "0.5.22" in str(exc.value) and "supported: 0.5.23" in str(exc.value)
    assert "port the patchset" in exc.value.hint
    with pytest.raises(UnsupportedVersionError):
        ps.render("0.4.0", read_release)
    for spelt in ("0.5.23.0", "v0.5.23"):  # the same release written otherwise: say how to write it
        with pytest.raises(UnsupportedVersionError) as exc:
            ps.target(spelt)
        assert exc.value.hint == f"{spelt!r} names release 0.5.23: write it as 0.5.23"


# --------------------------------------------------------------------------------------- render

def test_render_applies_series_and_new_files_and_checks_hashes(tmp_path):
    ps = load_patchset(make_patchset(tmp_path))
    r = ps.render(V, read_release)
    assert r.files[SPEC].new == PATCHED[SPEC] and r.files[ARGS].new == PATCHED[ARGS]
    assert r.files[NEW].old is None and r.files[NEW].new == MODULE and r.files[NEW].new_mode == 0o644
    assert [h.status for h in r.hunks] == ["applied", "applied", "applied"]
    assert "+DDTREE = 1" in r.diff_text() and "+def build_tree" in r.diff_text()
    assert ps.touched_paths(V) == sorted([SPEC, ARGS, NEW])


def test_render_refuses_a_file_that_is_not_the_release_file(tmp_path):
    ps = load_patchset(make_patchset(tmp_path))
    edited = dict(RELEASE)
    edited[ARGS] = RELEASE[ARGS] + b"# local edit\n"
    with pytest.raises(PatchsetError) as exc:
        ps.render(V, edited.get)
    assert f"file {ARGS} is not the sglang {V} release file this patchset was made for" in str(exc.value)


def test_render_of_an_already_patched_tree_is_refused_by_pristine_check(tmp_path):
    ps = load_patchset(make_patchset(tmp_path))
    with pytest.raises(PatchsetError, match="2 files are not the sglang 0.5.23 release files"):
        ps.render(V, {**RELEASE, **PATCHED}.get)


def test_stale_expected_hashes_say_how_to_refresh(tmp_path):
    root = make_patchset(tmp_path)
    (root / "modules/ddtree_x.py").write_bytes(MODULE + b"# changed\n")
    ps = load_patchset(root)
    with pytest.raises(PatchsetError) as exc:
        ps.render(V, read_release)
    assert "stale" in str(exc.value) and NEW in str(exc.value) and "refresh" in str(exc.value)
    assert exc.value.hint.endswith(f"sglpatch patchset refresh {root} --sglang {V}")  # the CLI's own command


def test_series_that_does_not_apply_raises_apply_error(tmp_path):
    root = make_patchset(tmp_path, hashes=False)
    other = dict(RELEASE)
    other[SPEC] = b"completely different\n" * 30
    with pytest.raises(ApplyError, match="0001-spec.patch"):
        load_patchset(root).render(V, other.get, check_hashes=False)


def test_new_file_clashing_with_a_release_file_is_refused(tmp_path):
    ps = load_patchset(make_patchset(tmp_path))
    with pytest.raises(PatchsetError, match="already exists"):
        ps.render(V, {**RELEASE, NEW: b"upstream's own\n"}.get, check_hashes=False)


# --------------------------------------------------------------------------------------- classify / history

def add_history(root: Path, old_patched_spec: bytes) -> None:
    """Freeze a revision-1 copy under history/r1 (SPEC patched differently) and bump the current to r2."""
    frozen = root / "history/r1"
    shutil.copytree(root, frozen, ignore=shutil.ignore_patterns("history"))
    (frozen / f"sglang-{V}/0001-spec.patch").write_text(udiff(SPEC, RELEASE[SPEC], old_patched_spec))
    doc = yaml.safe_load((frozen / "patchset.yaml").read_text())
    doc["targets"][V]["expected"][SPEC] = sha(old_patched_spec)
    (frozen / "patchset.yaml").write_text(yaml.safe_dump(doc))
    cur = yaml.safe_load((root / "patchset.yaml").read_text())
    cur["revision"] = 2
    cur["history"] = {"1": {V: doc["targets"][V]["expected"]}}
    (root / "patchset.yaml").write_text(yaml.safe_dump(cur))


def test_classify_by_hashes(tmp_path):
    root = make_patchset(tmp_path)
    r1_spec = RELEASE[SPEC].replace(b"spec line 10\n", b"spec line 10\nDDTREE = 0\n")
    add_history(root, r1_spec)
    ps = load_patchset(root)
    assert ps.revision == 2
    assert ps.classify(SPEC, sha(RELEASE[SPEC]), version=V) == "pristine"
    assert ps.classify(SPEC, sha(PATCHED[SPEC]), version=V) == "patched"
    assert ps.classify(SPEC, sha(r1_spec), version=V) == "patched@r1"
    assert ps.classify(SPEC, sha(b"something else"), version=V) == "drifted"
    assert ps.classify(SPEC, None, version=V) == "absent"
    assert ps.classify(NEW, None, version=V) == "pristine"        # a file the patchset creates
    assert ps.classify(NEW, sha(MODULE), version=V) == "patched"
    assert ps.classify(NEW, sha(b"x"), version=V) == "drifted"
    with pytest.raises(PatchsetError, match="not touched"):
        ps.classify("sglang/other.py", None, version=V)
    with pytest.raises(UnsupportedVersionError):
        ps.classify(SPEC, None, version="0.1")


def test_name_at_revision_loads_frozen_history(tmp_path):
    root = make_patchset(tmp_path)
    r1_spec = RELEASE[SPEC].replace(b"spec line 10\n", b"spec line 10\nDDTREE = 0\n")
    add_history(root, r1_spec)
    old = load_patchset("demo@1", search=[tmp_path])
    assert old.revision == 1 and old.root == root / "history/r1"
    assert old.render(V, read_release).files[SPEC].new == r1_spec
    assert load_patchset("demo@2", search=[tmp_path]).revision == 2
    assert load_patchset(f"{root}@1").revision == 1
    with pytest.raises(PatchsetError) as exc:
        load_patchset("demo@7", search=[tmp_path])
    assert "demo@1, demo@2" in str(exc.value)


# -------------------------------------------------------------------------------------- features

def test_features_are_on_from_their_first_revision_and_speak_for_frozen_ones(tmp_path):
    """``features`` in the newest patchset.yaml says what each revision can do; a frozen copy that
    predates the key says nothing of its own, and a patchset without it has none."""
    root = make_patchset(tmp_path)
    add_history(root, RELEASE[SPEC].replace(b"spec line 10\n", b"spec line 10\nDDTREE = 0\n"))
    assert load_patchset(root).features_at() == frozenset()            # no `features:` key
    (root / "patchset.yaml").write_text((root / "patchset.yaml").read_text()
                                        + "features: {budget_schedule: 1, budget_schedule_chain: 2}\n")
    ps = load_patchset(root)
    assert ps.features_at() == {"budget_schedule", "budget_schedule_chain"}
    assert ps.features_at(1) == {"budget_schedule"} and ps.features_at(0) == frozenset()
    assert load_patchset(f"{root}@1").features_at() == frozenset()     # the frozen r1 predates the key


@pytest.mark.parametrize("features,says", [
    ("{budget_shedule: 1}", "unknown feature(s) budget_shedule: sglpatch knows budget_auto, budget_auto_default, budget_schedule, budget_schedule_chain"),
    ("{budget_schedule: 2}", "budget_schedule: 2: a feature's revision (the first that has it) must be one of 1..1"),
    ("{budget_schedule: 0}", "must be one of 1..1"),
])
def test_bad_features_are_refused_naming_the_field(tmp_path, features, says):
    root = make_patchset(tmp_path, extra_yaml=f"features: {features}\n")
    with pytest.raises(ConfigError) as exc:
        load_patchset(root)
    assert "features" in str(exc.value) and says in str(exc.value)


def test_ddtree_declares_its_budget_schedule_features_by_revision():
    ps = load_patchset("ddtree")
    assert ps.features_at(2) == frozenset()
    assert ps.features_at(3) == {"budget_schedule"}
    assert ps.features_at(4) == {"budget_schedule", "budget_schedule_chain"}
    assert ps.features_at(6) == ps.features_at(4)
    assert ps.features_at(7) == {"budget_schedule", "budget_schedule_chain", "budget_auto"}
    assert ps.features_at(8) == ps.features_at(7)
    assert ps.features_at(9) == ps.features_at(7) | {"budget_schedule_graphs"}
    assert ps.features_at(12) == ps.features_at(9)
    assert ps.features_at() == ps.features_at(13) == ps.features_at(9) | {"budget_auto_default"}
    assert ps.at_revision(3).features_at() == frozenset()           # frozen before the key: ask the newest


# --------------------------------------------------------------------------------------- refresh

def test_refresh_hashes_rewrites_only_the_hash_maps(tmp_path):
    root = make_patchset(tmp_path, hashes=False, extra_yaml="# trailing comment\n")
    with pytest.raises(PatchsetError, match="stale"):
        load_patchset(root).render(V, read_release)
    maps = refresh_hashes(root, V, read_release)
    assert maps["expected"][NEW] == sha(MODULE) and maps["pristine"][NEW] is None
    text = (root / "patchset.yaml").read_text()
    assert text.startswith("# demo patchset (comment kept by refresh)\n") and "# trailing comment" in text
    ps = load_patchset(root)
    assert ps.target(V).pristine[SPEC] == sha(RELEASE[SPEC])
    ps.render(V, read_release)                      # now consistent
    # refreshing again is stable
    refresh_hashes(root, V, read_release)
    assert (root / "patchset.yaml").read_text() == text


def test_refresh_inserts_missing_keys(tmp_path):
    root = tmp_path / "mini"
    (root / "p").mkdir(parents=True)
    (root / "p/1.patch").write_text(udiff(SPEC, RELEASE[SPEC], PATCHED[SPEC]))
    (root / "patchset.yaml").write_text(textwrap.dedent(f"""\
        name: mini
        revision: 1
        targets:
          "{V}":
            series:
              - p/1.patch   # the only patch
        checks: {{}}
        """))
    refresh_hashes(root, V, read_release)
    ps = load_patchset(root)
    assert ps.target(V).expected == {SPEC: sha(PATCHED[SPEC])}
    assert "# the only patch" in (root / "patchset.yaml").read_text()
    ps.render(V, read_release)


def test_refresh_cli_with_a_tree_directory(tmp_path, capsys):
    """A tree without dist-info (a source checkout): nothing can check its files, so refresh
    refuses it (patchset.yaml untouched) unless --unverified says they are the release's."""
    from sglang_patcher.cli import main
    root = make_patchset(tmp_path, hashes=False)
    before = (root / "patchset.yaml").read_bytes()
    tree = tmp_path / "tree"
    for p, b in RELEASE.items():
        (tree / p).parent.mkdir(parents=True, exist_ok=True)
        (tree / p).write_bytes(b)
    assert main(["patchset", "refresh", str(root), "--sglang", V, "--tree", str(tree)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no sglang-*.dist-info/RECORD" in err and "--unverified" in err, err
    assert (root / "patchset.yaml").read_bytes() == before
    assert main(["--json", "patchset", "refresh", str(root), "--sglang", V, "--tree", str(tree), "--unverified"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["expected"]) == 3 and report["sglang_version"] == V
    load_patchset(root).render(V, read_release)


def test_refresh_tree_without_sglang_names_the_directory_and_writes_nothing(tmp_path, capsys):
    from sglang_patcher.cli import main
    root = make_patchset(tmp_path, hashes=False)
    before = (root / "patchset.yaml").read_bytes()
    (tmp_path / "empty").mkdir()
    code = main(["patchset", "refresh", str(root), "--sglang", V, "--tree", str(tmp_path / "empty")])
    err = capsys.readouterr().err
    assert code == 2 and str(tmp_path / "empty") in err and "site-packages" in err
    assert (root / "patchset.yaml").read_bytes() == before


def _site_packages(base: Path, files: dict[str, bytes], version: str = V, record: dict | None = None) -> Path:
    """A site-packages-like tree of ``files`` with sglang-<version>.dist-info/RECORD (hashes of
    ``record``, default: of ``files``)."""
    import base64
    for p, b in files.items():
        (base / p).parent.mkdir(parents=True, exist_ok=True)
        (base / p).write_bytes(b)
    rows = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).decode().rstrip('=')},{len(b)}"
            for p, b in (record if record is not None else files).items()]
    info = base / f"sglang-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "RECORD").write_text("\n".join(rows + [f"{info.name}/RECORD,,"]) + "\n")
    return base


def test_refresh_tree_is_checked_against_its_record(tmp_path, capsys):
    """--tree with a dist-info: a pristine install refreshes; a patched one (a file that differs
    from RECORD, or one RECORD lacks) or another release is refused, naming the file, and
    patchset.yaml stays as it was."""
    from sglang_patcher.cli import main
    root = make_patchset(tmp_path, hashes=False)
    before = (root / "patchset.yaml").read_bytes()
    patched = _site_packages(tmp_path / "patched", {**PATCHED, NEW: MODULE}, record=RELEASE)
    other = _site_packages(tmp_path / "other", RELEASE, version="0.5.22")
    for tree, said in ((patched, f"{SPEC} differs from its RECORD"), (other, "not sglang 0.5.23")):
        code = main(["patchset", "refresh", str(root), "--sglang", V, "--tree", str(tree)])
        err = " ".join(capsys.readouterr().err.split())
        assert code == 2 and str(tree) in err and said in err, err
        assert "--sglang 0.5.22" not in err  # the patchset has no such target: not a way out
        assert (root / "patchset.yaml").read_bytes() == before
    good = _site_packages(tmp_path / "good", RELEASE)
    assert main(["patchset", "refresh", str(root), "--sglang", V, "--tree", str(good)]) == 0
    assert "checked against its RECORD" in " ".join(capsys.readouterr().out.split())
    load_patchset(root).render(V, read_release)


def test_refresh_names_the_changes_a_release_already_carries(tmp_path, capsys):
    """A release that merged one of the series' changes (here the ARGS hunk and the new module):
    refresh still pins the hashes, and names each merged change so the maintainer drops it."""
    from sglang_patcher.cli import main
    root = make_patchset(tmp_path, hashes=False)
    merged = {SPEC: RELEASE[SPEC], ARGS: PATCHED[ARGS], NEW: MODULE}
    tree = _site_packages(tmp_path / "tree", merged)  # a release whose RECORD lists the merged bytes
    maps = refresh_hashes(root, V, merged.get)
    assert maps["already_applied"] == [f"demo r1 sglang-{V}/0002-args.patch: {ARGS} hunk 1 @@ -18,6 +18,7 @@",
                                       f"demo r1 modules/ddtree_x.py: {NEW} (new file from modules/ddtree_x.py)"]
    assert maps["expected"][ARGS] == maps["pristine"][ARGS] == sha(PATCHED[ARGS])
    assert main(["patchset", "refresh", str(root), "--sglang", V, "--tree", str(tree)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"2 change(s) already in sglang {V}" in out and "drop them" in out and ARGS in out, out


def test_refresh_writes_scalars_that_read_back_as_strings():
    from sglang_patcher.patchset_write import _scalar
    for value in ["0" * 64, "1234" * 16, "ab" * 32, "sglang/srt/x.py", "true", "null", "0.5.23", "1e5"]:
        assert yaml.safe_load(f"k: {_scalar(value)}") == {"k": value}
    assert _scalar("ab" * 32) == "ab" * 32          # plain where safe: a refresh of a plain file is a no-op diff
    assert yaml.safe_load(f"k: {_scalar(None)}") == {"k": None}


def test_shipped_patchsets_new_file_hashes_are_current():
    """Every shipped patchset's expected hash of each new file equals the file in the repo: a
    module edited without ``sglpatch patchset refresh`` fails here, not later at apply time."""
    import yaml

    root = Path(__file__).resolve().parents[2] / "patchsets"
    checked = 0
    for spec in sorted(root.glob("*/patchset.yaml")):
        data = yaml.safe_load(spec.read_text())
        for release, target in (data.get("targets") or {}).items():
            expected = (target.get("expected") or {})
            for dest, src in (target.get("new_files") or {}).items():
                want = expected.get(dest)
                got = sha((spec.parent / src).read_bytes())
                assert want == got, (
                    f"{spec}: {release} {dest} hash is stale; run "
                    f"`python -m sglang_patcher patchset refresh {data['name']} --sglang {release}`")
                checked += 1
    assert checked, "no shipped new files found"
