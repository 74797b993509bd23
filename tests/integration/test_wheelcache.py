"""The pristine wheel cache on real (small, built here) wheels: RECORD checks, atomic publication,
an extraction killed half-way, a corrupt cached wheel. No network: the wheel is put in the cache."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from sglang_patcher.errors import PatchsetError
from sglang_patcher.wheelcache import pristine_tree, tree_from_wheel

V = "9.9.9"
REPO = Path(__file__).resolve().parents[2]


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(path: Path, files: dict[str, bytes], *, version: str = V, tamper: dict[str, bytes] | None = None,
                unlisted: dict[str, bytes] | None = None, modes: dict[str, int] | None = None) -> Path:
    """A wheel with ``files`` (+ METADATA, RECORD). ``tamper`` replaces content after RECORD is made;
    ``unlisted`` adds members missing from RECORD."""
    di = f"sglang-{version}.dist-info"
    allf = dict(files)
    allf[f"{di}/METADATA"] = f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n".encode()
    allf[f"{di}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "\n".join([record_line(n, d) for n, d in allf.items()] + [f"{di}/RECORD,,"]) + "\n"
    allf.update(tamper or {})
    allf.update(unlisted or {})
    allf[f"{di}/RECORD"] = record.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in allf.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = ((modes or {}).get(name, 0o644) | 0o100000) << 16
            zf.writestr(info, data)
    return path


FILES = {
    "sglang/__init__.py": b"__version__ = '9.9.9'\n",
    "sglang/srt/speculative/spec_info.py": b"class SpeculativeAlgorithm: pass\n",
    "sglang/srt/server_args.py": b"x = 1\n",
    "sglang/bin/tool.sh": b"#!/bin/sh\n",
    "sglang/__pycache__/__init__.cpython-311.pyc": b"\x00bytecode",
}


def cached_wheel(home: Path, **kw) -> Path:
    return build_wheel(home / "wheels" / f"sglang-{V}-py3-none-any.whl", FILES, **kw)


def test_tree_is_extracted_verified_and_cached(tmp_path):
    home = tmp_path / "home"
    cached_wheel(home, modes={"sglang/bin/tool.sh": 0o755})
    t = pristine_tree(V, home=home)
    assert t.root == home / "wheels" / f"sglang-{V}"
    assert t.read("sglang/server_args.py") is None
    assert t.read("sglang/srt/server_args.py") == b"x = 1\n"
    assert "sglang/__pycache__/__init__.cpython-311.pyc" not in t.manifest.files   # derived, left out
    assert f"sglang-{V}.dist-info/RECORD" in t.manifest.files
    assert t.manifest.files["sglang/bin/tool.sh"].mode == 0o755
    assert t.manifest.source == f"wheel:sglang=={V}" and t.manifest.sglang_version == V
    assert (t.root / "manifest.json").is_file() and t.verify() == []
    # cached: the second call does not touch the wheel at all
    (home / "wheels" / f"sglang-{V}-py3-none-any.whl").unlink()
    assert pristine_tree(V, home=home).manifest.files == t.manifest.files
    # no temporary directories are left behind
    assert [p.name for p in (home / "wheels").iterdir()] == [f"sglang-{V}"]


def test_a_modified_cache_is_never_read_as_pristine_and_verify_rebuilds_it(tmp_path):
    """An edited cached file: verify names it, read refuses it (naming the file and the command
    that heals the cache), a missing one likewise; pristine_tree(verify=True) rebuilds the cache
    from the cached wheel, and a cache whose tree/ is gone is rebuilt without asking."""
    home = tmp_path / "home"
    cached_wheel(home)
    t = pristine_tree(V, home=home)
    t.path_of("sglang/srt/server_args.py").write_bytes(b"x = 2\n")
    assert t.verify() == ["sglang/srt/server_args.py"]
    with pytest.raises(PatchsetError) as ei:
        t.read("sglang/srt/server_args.py")
    assert "was modified" in ei.value.message and f"sglpatch patchset tree {V}" in ei.value.hint
    t.path_of("sglang/__init__.py").unlink()
    with pytest.raises(PatchsetError, match="lacks sglang/__init__.py"):
        t.read("sglang/__init__.py")
    said = []
    t = pristine_tree(V, home=home, verify=True, log=said.append)
    assert t.verify() == [] and t.read("sglang/srt/server_args.py") == b"x = 1\n"
    assert "2 cached file(s) missing or modified" in said[0] and "rebuilding" in said[0], said
    import shutil
    shutil.rmtree(t.tree)
    t = pristine_tree(V, home=home)
    assert t.read("sglang/__init__.py") == FILES["sglang/__init__.py"] and t.verify() == []
    for junk in ("{}", "not json at all"):  # a damaged manifest: rebuilt too, never an error to the user
        (t.root / "manifest.json").write_text(junk)
        said.clear()
        t = pristine_tree(V, home=home, log=said.append)
        assert t.verify() == [] and "manifest is damaged" in said[0], said


def test_directory_without_manifest_is_rebuilt(tmp_path):
    home = tmp_path / "home"
    cached_wheel(home)
    half = home / "wheels" / f"sglang-{V}" / "tree" / "sglang"
    half.mkdir(parents=True)
    (half / "__init__.py").write_text("half written\n")
    t = pristine_tree(V, home=home)
    assert t.read("sglang/__init__.py") == FILES["sglang/__init__.py"] and t.verify() == []


@pytest.mark.parametrize("kind", ["tamper", "unlisted", "missing"])
def test_record_mismatch_publishes_nothing_and_drops_the_wheel(tmp_path, kind):
    home = tmp_path / "home"
    if kind == "tamper":
        whl = cached_wheel(home, tamper={"sglang/srt/server_args.py": b"x = 666\n"})
        needle = "sglang/srt/server_args.py: sha256"
    elif kind == "unlisted":
        whl = cached_wheel(home, unlisted={"sglang/evil.py": b"import os\n"})
        needle = "sglang/evil.py: in the wheel but not in RECORD"
    else:
        whl = home / "wheels" / f"sglang-{V}-py3-none-any.whl"
        files = dict(FILES)
        build_wheel(whl, files)
        # rebuild without one member but with the full RECORD
        with zipfile.ZipFile(whl) as zf:
            members = {n: zf.read(n) for n in zf.namelist() if n != "sglang/srt/server_args.py"}
        with zipfile.ZipFile(whl, "w") as zf:
            for n, d in members.items():
                zf.writestr(n, d)
        needle = "sglang/srt/server_args.py: in RECORD but not in the wheel"
    with pytest.raises(PatchsetError) as exc:
        pristine_tree(V, home=home)
    assert needle in str(exc.value) and "does not match its RECORD" in str(exc.value)
    assert not (home / "wheels" / f"sglang-{V}").exists()
    assert not whl.exists()                             # a wheel that failed verification is not kept
    assert [p.name for p in (home / "wheels").iterdir()] == []


def test_metadata_version_must_match(tmp_path):
    whl = build_wheel(tmp_path / "w" / f"sglang-{V}-py3-none-any.whl", FILES, version="1.0.0")
    with pytest.raises(PatchsetError, match="RECORD|METADATA"):
        tree_from_wheel(whl, V, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_corrupt_cached_wheel_is_removed(tmp_path):
    home = tmp_path / "home"
    whl = home / "wheels" / f"sglang-{V}-py3-none-any.whl"
    whl.parent.mkdir(parents=True)
    whl.write_bytes(b"PK\x03\x04 truncated download")
    with pytest.raises(PatchsetError, match="not a valid zip") as exc:
        pristine_tree(V, home=home)
    assert "run the command again" in str(exc.value) and not whl.exists()


def test_a_wheel_damaged_inside_a_member_is_removed(tmp_path):
    """Bytes flipped inside a compressed member (zlib's 'invalid distance too far back' and the
    like, where the zip's directory is intact): one clear error, the wheel removed, never a
    traceback or a wheel that keeps failing."""
    import random
    import zlib

    home = tmp_path / "home"
    big = {**FILES, "sglang/srt/big.py": "".join(f"x{i} = {random.Random(i).random()!r}\n"
                                                 for i in range(4000)).encode()}
    stored = build_wheel(tmp_path / "stored" / f"sglang-{V}-py3-none-any.whl", big)
    whl = home / "wheels" / stored.name
    whl.parent.mkdir(parents=True)
    with zipfile.ZipFile(stored) as src, zipfile.ZipFile(whl, "w") as dst:   # deflated, as PyPI's are
        for member in src.infolist():
            data = src.read(member)
            member.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(member, data)
    with zipfile.ZipFile(whl) as zf:
        info = zf.getinfo("sglang/srt/big.py")
    good = whl.read_bytes()
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for at in range(start + 64, start + info.compress_size - 8, 29):   # find a damage zlib refuses
        raw = bytearray(good)
        for i in range(at, at + 7):
            raw[i] ^= 0xFF
        whl.write_bytes(bytes(raw))
        try:
            with zipfile.ZipFile(whl) as zf:
                zf.read("sglang/srt/big.py")
        except zlib.error:
            break
        except (zipfile.BadZipFile, EOFError):
            continue
    else:
        pytest.fail("no 7-byte damage of the member made zlib fail (the test's own premise)")
    with pytest.raises(PatchsetError, match="not a valid zip") as exc:
        pristine_tree(V, home=home)
    assert "run the command again" in exc.value.hint and not whl.exists()
    assert not (home / "wheels" / f"sglang-{V}").exists()


def test_unsafe_member_names_are_refused(tmp_path):
    whl = build_wheel(tmp_path / "w.whl", {**FILES, "sglang/../../escape.py": b"x\n"})
    with pytest.raises(PatchsetError, match="unsafe path"):
        tree_from_wheel(whl, V, tmp_path / "w" / "out")
    assert not (tmp_path / "escape.py").exists() and not (tmp_path / "w" / "out").exists()


def test_extraction_killed_half_way_is_never_trusted(tmp_path):
    """SIGKILL a real extraction while its temporary tree is half written; the next call must rebuild
    a complete, verified tree (and sweep the dead process's temporary directory)."""
    home = tmp_path / "home"
    many = {f"sglang/pkg{i // 100}/mod{i}.py": os.urandom(4096) for i in range(3000)}
    build_wheel(home / "wheels" / f"sglang-{V}-py3-none-any.whl", many)
    code = ("import sys; from pathlib import Path; from sglang_patcher.wheelcache import pristine_tree; "
            f"pristine_tree({V!r}, home=Path(sys.argv[1]))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(home)], cwd=REPO)
    wheels = home / "wheels"
    deadline = time.time() + 60
    killed = False
    while time.time() < deadline and proc.poll() is None:
        tmps = [d for d in wheels.iterdir() if ".tmp-" in d.name]
        if tmps and sum(1 for _ in tmps[0].rglob("*.py")) > 200:
            proc.send_signal(signal.SIGKILL)
            killed = True
            break
        time.sleep(0.01)
    proc.wait()
    if not killed:
        pytest.skip("extraction finished before it could be interrupted")
    assert not (wheels / f"sglang-{V}").exists()           # nothing half-built was published
    assert any(".tmp-" in d.name for d in wheels.iterdir())
    t = pristine_tree(V, home=home)
    assert len(t.manifest.files) == 3000 + 3 and t.verify() == []
    assert not any(".tmp-" in d.name for d in wheels.iterdir())


def test_invalid_version_string(tmp_path):
    with pytest.raises(PatchsetError, match="not a valid SGLang version"):
        pristine_tree("not a version", home=tmp_path)


def test_a_release_written_another_way_is_refused_not_cached_twice(tmp_path):
    """``9.9.9.0`` equals 9.9.9 as a version and pip would hand over 9.9.9's wheel; ``v9.9.9`` is
    9.9.9 too. Each is refused with the release's own spelling, and no second tree is built."""
    home = tmp_path / "home"
    cached_wheel(home)
    for text in ("9.9.9.0", "v9.9.9", "9.9.9.00"):  # each straight to the release's own spelling
        with pytest.raises(PatchsetError, match="write it as 9.9.9"):
            pristine_tree(text, home=home)
    assert sorted(p.name for p in (home / "wheels").iterdir() if p.is_dir()) == []
    assert pristine_tree(V, home=home).root.name == "sglang-9.9.9"
