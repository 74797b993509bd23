"""Where the pristine bytes of a touched file come from, each checked against the sha256 it must have.

The plan renders a patchset against pristine bytes; a rollback whose backups were lost on the host
puts back originals found the same way. The sources, in the order a plan asks them: the host's
mirror, this machine's copies of earlier backups (:class:`LocalBackups`), the host's own backups
(:class:`HostBackups`, fetched only when needed) and the release's PyPI wheel
(:func:`wheel_reader`, downloaded on first use). Bytes are taken only when their hash is right.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import SglpatchError, StateError
from ..mirror import Mirror
from ..remote.agent_client import AgentClient
from ..state import safe_component

if TYPE_CHECKING:
    from ..wheelcache import WheelTree

# ``read(path) -> bytes | None``: a site-packages-relative path's bytes, None when absent
Reader = Callable[[str], bytes | None]

#: ``PristineSource.used``'s source for a file the release does not have (one a patchset adds)
ABSENT = "absent from the release"


def sha256_or_none(data: bytes | None) -> str | None:
    """The hex sha256 of ``data``; None for None (an absent file)."""
    return None if data is None else hashlib.sha256(data).hexdigest()


class PristineSource:
    """Pristine bytes of the touched files, each checked against the patchset's pristine sha256.

    ``hashes`` maps path → pristine sha256 (None: the file does not exist in the release).
    ``readers`` are tried in order — ``(name, read(path) -> bytes | None)`` — and the first whose
    bytes match the hash wins (``used[path]`` names it). Typical order: the host's mirror, the
    PyPI wheel cache, local backups, the host's backups. Raises :class:`StateError` naming the path,
    the wanted hash and what each reader had, when none matches.
    """

    def __init__(self, hashes: dict[str, str | None], readers: list[tuple[str, Reader]]):
        self.hashes = hashes
        self.readers = readers
        self.used: dict[str, str] = {}
        self._cache: dict[str, bytes | None] = {}

    def __call__(self, path: str) -> bytes | None:
        return self.read(path)

    @property
    def read_so_far(self) -> dict[str, bytes | None]:
        """Every path read so far, with its bytes (None: not in the release)."""
        return dict(self._cache)

    def read(self, path: str) -> bytes | None:
        if path in self._cache:
            return self._cache[path]
        if path not in self.hashes:
            # the patchset format lets ``pristine`` omit files the patchset creates: absent in the
            # release. (Patchset.render refuses a file that exists but has no pristine hash.)
            self._cache[path] = None
            self.used[path] = ABSENT
            return None
        want = self.hashes[path]
        if want is None:
            self._cache[path] = None
            self.used[path] = ABSENT
            return None
        tried = []
        for name, reader in self.readers:
            try:
                data = reader(path)
            except (KeyError, OSError, ValueError, SglpatchError) as exc:
                tried.append(f"{name}: {type(exc).__name__}")
                continue
            if data is None:
                tried.append(f"{name}: missing")
                continue
            got = hashlib.sha256(data).hexdigest()
            if got == want:
                self._cache[path] = data
                self.used[path] = name
                return data
            tried.append(f"{name}: sha256 {got[:12]}…")
        raise StateError(f"no pristine copy of {path} (sha256 {want[:12]}…): " + "; ".join(tried),
                         hint="re-snapshot the host from a pristine install, or let the wheel cache "
                              "fetch the release from PyPI")


def reader_of(obj: Mirror | Reader | None) -> Reader | None:
    """``read(path)`` of a Mirror (or anything with a ``read`` method) or of a plain callable."""
    if obj is None:
        return None
    if hasattr(obj, "read") and callable(obj.read):
        return obj.read
    if callable(obj):
        return obj
    raise TypeError(f"not a pristine reader: {obj!r}")


def wheel_reader(version: str, home: Path | None = None) -> Reader:
    """``read(path)`` over the pristine PyPI wheel of sglang ``version`` (downloaded on first use)."""
    tree: list[WheelTree] = []

    def read(path: str) -> bytes | None:
        if not tree:
            from .. import wheelcache  # fetched lazily: only when the mirror holds patched files
            tree.append(wheelcache.pristine_tree(version, home=home))
        return tree[0].read(path)

    return read


def local_backups_all(home: Path, host: str, path: str) -> list[bytes]:
    """Every local copy of ``path`` among the backups of ``host``'s deployments, oldest first."""
    base = home / "backups" / safe_component(host)
    out = []
    if base.is_dir():
        for dep in sorted(base.iterdir()):
            f = dep.joinpath(*path.split("/"))
            if f.is_file():
                out.append(f.read_bytes())
    return out


class LocalBackups:
    """Reader over all local backups of a host that returns the copy matching the wanted hash."""

    def __init__(self, home: Path, host: str, hashes: dict[str, str | None]):
        self.home, self.host, self.hashes = home, host, hashes

    def __call__(self, path: str) -> bytes | None:
        want = self.hashes.get(path)
        for data in local_backups_all(self.home, self.host, path):
            if sha256_or_none(data) == want:
                return data
        return None


class HostBackups:
    """Reader over the host's backups: fetches (one round trip each) deployments whose record says
    their original of the path had the wanted hash."""

    def __init__(self, agent: AgentClient, deployments: list[dict[str, Any]], hashes: dict[str, str | None]):
        self.agent, self.deployments, self.hashes = agent, deployments, hashes
        self._fetched: dict[str, dict[str, bytes]] = {}

    def __call__(self, path: str) -> bytes | None:
        want = self.hashes.get(path)
        for rec in self.deployments:
            f = rec.get("files", {}).get(path)
            if not f or f.get("before") != want or rec.get("backups_pruned"):
                continue
            if rec["id"] not in self._fetched:
                try:
                    self._fetched[rec["id"]] = self.agent.backup_tar(rec["id"])
                except StateError:  # gone or unreadable on the host: the next source is asked
                    self._fetched[rec["id"]] = {}
            data = self._fetched[rec["id"]].get(path)
            if data is not None:
                return data
        return None
