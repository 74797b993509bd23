"""The snapshot's tar extraction refuses anything but the regular files it asked for (no mocks:
real tar streams built with tarfile, unpacked by the real extractor)."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

from sglang_patcher.errors import StateError, TransportError
from sglang_patcher.manifest import FileEntry
from sglang_patcher.mirror import _extract
from tests.support.inode_flags import chattr  # noqa: F401  (the fixture)


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]], gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def _file(name: str, data: bytes):
    return tarfile.TarInfo(name), data


def _remote(**files: bytes) -> dict[str, FileEntry]:
    return {p: FileEntry(p, hashlib.sha256(d).hexdigest(), len(d), 0o644) for p, d in files.items()}


@pytest.mark.parametrize("gz", [False, True])
def test_extracts_requested_files(tmp_path, gz):
    remote = _remote(**{"sglang/a.py": b"A", "sglang/sub/b.py": b"BB"})
    stream = _tar([_file(p, d) for p, d in (("sglang/a.py", b"A"), ("sglang/sub/b.py", b"BB"))], gz)
    assert _extract("h", stream, list(remote), remote, tmp_path) == 3
    assert (tmp_path / "sglang/sub/b.py").read_bytes() == b"BB"


@pytest.mark.parametrize("name", ["/etc/evil", "../evil", "sglang/../../evil", "./sglang/a.py"])
def test_refuses_unsafe_names(tmp_path, name):
    remote = _remote(**{"sglang/a.py": b"A"})
    with pytest.raises(TransportError, match="unsafe path"):
        _extract("h", _tar([_file(name, b"A")]), ["sglang/a.py"], remote, tmp_path / "t")
    assert not (tmp_path / "evil").exists()


def test_refuses_links_and_unrequested_members(tmp_path):
    remote = _remote(**{"sglang/a.py": b"A"})
    link = tarfile.TarInfo("sglang/a.py")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    with pytest.raises(TransportError, match="not a regular file"):
        _extract("h", _tar([(link, None)]), ["sglang/a.py"], remote, tmp_path)
    hard = tarfile.TarInfo("sglang/a.py")
    hard.type = tarfile.LNKTYPE
    hard.linkname = "sglang/x"
    with pytest.raises(TransportError, match="not a regular file"):
        _extract("h", _tar([(hard, None)]), ["sglang/a.py"], remote, tmp_path)
    with pytest.raises(TransportError, match="not requested"):
        _extract("h", _tar([_file("sglang/other.py", b"A")]), ["sglang/a.py"], remote, tmp_path)
    assert not (tmp_path / "sglang/other.py").exists()


def test_refuses_symlinked_directory_in_the_mirror(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "sglang").symlink_to(tmp_path / "outside")
    remote = _remote(**{"sglang/a.py": b"A"})
    with pytest.raises(TransportError, match="escapes the mirror"):
        _extract("h", _tar([_file("sglang/a.py", b"A")]), ["sglang/a.py"], remote, tmp_path / "tree")
    assert not (tmp_path / "outside" / "a.py").exists()


def test_a_mirror_this_machine_cannot_write_is_a_local_error_naming_the_file(tmp_path, chattr):
    """A mirror directory this machine refuses to write (chattr +i here; a 0555 directory, a full
    or read-only disk alike): an OSError naming the file — the CLI's local-file error, exit 1 —
    not the host's fault (was TransportError 'is not a regular file', exit 5)."""
    (tmp_path / "tree" / "sglang").mkdir(parents=True)
    chattr("+i", tmp_path / "tree" / "sglang")
    remote = _remote(**{"sglang/a.py": b"A"})
    with pytest.raises(OSError) as exc:
        _extract("h", _tar([_file("sglang/a.py", b"A")]), ["sglang/a.py"], remote, tmp_path / "tree")
    assert not isinstance(exc.value, TransportError) and exc.value.filename.endswith("a.py"), exc.value


def test_hash_mismatch_means_the_file_changed_during_the_snapshot(tmp_path):
    remote = _remote(**{"sglang/a.py": b"A"})
    with pytest.raises(StateError, match="changed on the host during the snapshot"):
        _extract("h", _tar([_file("sglang/a.py", b"B")]), ["sglang/a.py"], remote, tmp_path)
    assert not (tmp_path / "sglang/a.py").exists()
    assert list((tmp_path / "sglang").iterdir()) == []    # no temp file left behind


def test_missing_and_corrupt_streams(tmp_path):
    remote = _remote(**{"sglang/a.py": b"A", "sglang/b.py": b"B"})
    with pytest.raises(TransportError, match="lacks 1 file"):
        _extract("h", _tar([_file("sglang/a.py", b"A")]), ["sglang/a.py", "sglang/b.py"], remote,
                 tmp_path)
    with pytest.raises(TransportError, match="tar stream"):
        _extract("h", b"this is not a tar stream at all" * 40, ["sglang/a.py"], remote, tmp_path)
    good = _tar([_file("sglang/a.py", b"A"), _file("sglang/b.py", b"B")])
    with pytest.raises(TransportError, match="tar stream"):
        _extract("h", good[:700], ["sglang/a.py", "sglang/b.py"], remote, tmp_path / "x")


from hypothesis import given, settings, strategies as st  # noqa: E402

_segment = st.sampled_from(["..", ".", "", "sglang", "a.py", "srt", "x y", "\\", "~"])


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(_segment, min_size=1, max_size=5), lead=st.sampled_from(["", "/", "//"]))
def test_whatever_the_name_nothing_lands_outside_the_tree(tmp_path_factory, parts, lead):
    base = tmp_path_factory.mktemp("prop")
    tree = base / "tree"
    name = lead + "/".join(parts)
    remote = _remote(**{name: b"payload"}) if name else {}
    try:
        _extract("h", _tar([_file(name, b"payload")]), [name], remote, tree)
    except TransportError:
        pass
    for p in base.rglob("*"):
        if p.is_file():
            assert p.resolve().is_relative_to(tree.resolve()), p
