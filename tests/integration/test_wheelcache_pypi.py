"""The wheel cache against the real sglang==0.5.23 wheel from PyPI (marker ``sglang``).

The download is cached between runs under ``$SGLPATCH_TEST_WHEEL_HOME`` (default
``/var/tmp/sglpatch-tests/wheel-home``); every run extracts and verifies a fresh tree from it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from sglang_patcher.errors import PatchsetError
from sglang_patcher.manifest import read_record, sha256_bytes
from sglang_patcher.patchset import load_patchset
from sglang_patcher.wheelcache import pristine_tree, tree_from_wheel, wheels_dir

pytestmark = pytest.mark.sglang

V = "0.5.23"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_home() -> Path:
    home = Path(os.environ.get("SGLPATCH_TEST_WHEEL_HOME", "/var/tmp/sglpatch-tests/wheel-home"))
    home.mkdir(parents=True, exist_ok=True)
    return home


@pytest.fixture(scope="module")
def tree(wheel_home):
    try:
        return pristine_tree(V, home=wheel_home)
    except PatchsetError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot fetch sglang=={V}: {exc}")


def _record(whl: Path) -> tuple[str, dict[str, str | None]]:
    with zipfile.ZipFile(whl) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        return name, read_record(zf.read(name).decode())


def test_fresh_extraction_matches_record(tree, wheel_home, tmp_path):
    whls = sorted(wheels_dir(wheel_home).glob(f"sglang-{V}-*.whl"))
    assert whls, "the wheel is kept in the cache"
    record_name, record = _record(whls[0])
    t0 = time.monotonic()
    fresh = tree_from_wheel(whls[0], V, tmp_path / f"sglang-{V}")
    took = time.monotonic() - t0
    files = fresh.manifest.files
    hashed = {p: h for p, h in record.items() if h is not None}
    assert set(files) == set(hashed) | {record_name}          # the wheel has no .pyc; RECORD lists all
    assert all(files[p].sha256 == h for p, h in hashed.items())
    assert len(files) > 5000 and took < 120
    assert fresh.verify() == []
    assert files == tree.manifest.files                        # the cached tree is the same


def test_cached_tree_reads_release_files(tree):
    t0 = time.monotonic()
    again = pristine_tree(V, home=tree.root.parent.parent)
    assert time.monotonic() - t0 < 2                           # manifest only, no download
    spec = again.read("sglang/srt/speculative/spec_info.py")
    assert spec is not None and b"class SpeculativeAlgorithm" in spec and b"DFLASH" in spec
    assert again.read("sglang/srt/speculative/ddtree_worker.py") is None
    assert again.read(f"sglang-{V}.dist-info/METADATA").startswith(b"Metadata-Version")


def test_version_not_on_pypi_is_one_clear_error(tmp_path, tree):
    with pytest.raises(PatchsetError) as exc:
        pristine_tree("0.0.999", home=tmp_path)
    msg = str(exc.value)
    assert "sglang==0.0.999 is not on PyPI" in msg and "pypi.org/project/sglang" in msg
    assert not any(wheels_dir(tmp_path).iterdir())             # no half download left



def test_a_missing_release_on_the_command_line_says_it_is_not_available_and_what_to_do(capsys, sglpatch_home):
    """`sglpatch patchset tree 0.0.999` printed "download sglang==0.0.999: interrupted after done in
    2.0 s" before the error: nothing was interrupted. The progress line and the error say the release
    is not available, and the hint names a release to use instead; exit 3."""
    from sglang_patcher.cli import main

    capsys.readouterr()
    code = main(["patchset", "tree", "0.0.999"])
    out, err = capsys.readouterr()
    err = " ".join(err.split())
    assert code == 3, out + err
    assert "interrupted" not in err and "after done" not in err, err
    assert "download sglang==0.0.999: failed after" in err and "sglang 0.0.999 is not available" in err, err
    assert "sglang release 0.0.999 is not available" in err and "name a released version" in err, err


def test_an_unreachable_index_is_named_as_such_not_as_a_missing_version(tmp_path, monkeypatch):
    """pip reaching no index lists no sglang release at all: that is exit 5 (the index), not
    'not on PyPI' with a hint to pick another version; nothing is left in the cache."""
    from sglang_patcher.errors import TransportError

    links = tmp_path / "links"
    links.mkdir()
    for k, v in {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                 "PIP_FIND_LINKS": str(links), "PIP_RETRIES": "0", "PIP_TIMEOUT": "3",
                 "PIP_DEFAULT_TIMEOUT": "3"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(TransportError) as exc:
        pristine_tree(V, home=tmp_path / "home")
    assert exc.value.exit_code == 5
    msg, hint = str(exc.value), exc.value.hint or ""
    assert f"sglang=={V}" in msg and "index is unreachable" in msg and "not on PyPI" not in msg, msg
    assert "http://127.0.0.1:9/simple" in msg, msg  # the index pip tried is named
    assert "PIP_INDEX_URL" in hint and "PIP_FIND_LINKS" in hint
    assert not any(wheels_dir(tmp_path / "home").iterdir())


@pytest.mark.skipif(not (REPO / "patchsets/ddtree/patchset.yaml").is_file(),
                    reason="patchsets/ddtree/patchset.yaml is not written yet")
def test_ddtree_renders_cleanly_on_the_release(tree):
    ps = load_patchset(REPO / "patchsets" / "ddtree")
    result = ps.render(V, tree.read)                           # pristine + expected hashes checked
    assert result.changed_files()
    assert all(h.status in ("applied", "offset") for h in result.hunks), \
        [h for h in result.hunks if h.status == "already_applied"]
    text = result.diff_text()
    assert "DDTREE" in text
    for path, change in result.files.items():                  # hashes say patched, classify agrees
        assert ps.classify(path, sha256_bytes(change.new), version=V) == "patched"
        assert ps.classify(path, None if change.old is None else sha256_bytes(change.old), version=V) == "pristine"
    # and it is the named lookup that the CLI uses
    assert load_patchset("ddtree", search=[REPO / "patchsets"]).revision == ps.revision


@pytest.mark.skipif(not (REPO / "patchsets/ddtree/patchset.yaml").is_file() or shutil.which("git") is None,
                    reason="needs patchsets/ddtree/patchset.yaml and git")
def test_ddtree_series_agrees_with_git_apply(tree, tmp_path):
    """An independent applier (git apply, fuzz 0 by default here) gives the same bytes as ours."""
    ps = load_patchset(REPO / "patchsets" / "ddtree")
    result = ps.render(V, tree.read)
    for path, change in result.files.items():
        if change.old is not None:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_bytes(change.old)
    for rel in ps.target(V).series:
        run = subprocess.run(["git", "apply", "-C3", "--whitespace=nowarn", str(ps.root / rel)], cwd=tmp_path,
                             capture_output=True, text=True)
        assert run.returncode == 0, f"git apply {rel}: {run.stderr}"
    for rel_new, src in ps.target(V).new_files.items():
        (tmp_path / rel_new).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel_new).write_bytes((ps.root / src).read_bytes())
    for path, change in result.files.items():
        disk = tmp_path / path
        assert (disk.read_bytes() if disk.exists() else None) == change.new, path
