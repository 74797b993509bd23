"""Hashed file lists: the manifest of a mirror, a wheel tree or a deployment.

Paths are posix and relative to site-packages (as in a wheel's RECORD). Hashes are lowercase hex
sha256. ``mode`` is the permission bits (``st_mode & 0o7777``).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import StateError


def sha256_bytes(data: bytes) -> str:
    """Lowercase hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Lowercase hex sha256 of the file at ``path`` (streamed in ``chunk`` bytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One file: ``path`` relative to site-packages, ``sha256`` hex, ``size`` in bytes, ``mode`` bits."""

    path: str
    sha256: str
    size: int
    mode: int = 0o644


@dataclass
class Manifest:
    """A set of :class:`FileEntry` plus where it came from.

    ``source`` says what was hashed (``host:<name>`` or ``wheel:sglang==X``), ``site_packages`` is the
    remote absolute path it mirrors (None for a wheel), ``sglang_version`` the release.
    """

    source: str
    sglang_version: str
    site_packages: str | None = None
    files: dict[str, FileEntry] = field(default_factory=dict)
    created: str | None = None

    def to_json(self) -> str:
        data = {
            "source": self.source,
            "sglang_version": self.sglang_version,
            "site_packages": self.site_packages,
            "created": self.created,
            "files": {p: {"path": e.path, "sha256": e.sha256, "size": e.size, "mode": e.mode}
                      for p, e in sorted(self.files.items())},
        }
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, *, origin: str = "manifest") -> "Manifest":
        """Parse :meth:`to_json` output; raises :class:`StateError` naming ``origin`` when malformed."""
        try:
            data = json.loads(text)
            files = {p: FileEntry(**e) for p, e in data["files"].items()}
            return cls(source=data["source"], sglang_version=data["sglang_version"],
                       site_packages=data.get("site_packages"), files=files,
                       created=data.get("created"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateError(f"{origin}: not a valid sglpatch manifest ({exc})",
                             hint="delete it and run the snapshot again") from exc

    def save(self, path: Path) -> None:
        """Write atomically (temp file + rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "Manifest":
        try:
            text = path.read_text()
        except OSError as exc:
            raise StateError(f"{path}: cannot read manifest ({exc.strerror})") from exc
        return cls.from_json(text, origin=str(path))


def read_record(text: str) -> dict[str, str | None]:
    """Parse a wheel RECORD (CSV ``path,sha256=<urlsafe b64>,size``) into ``{path: hex sha256 | None}``.

    Entries without a hash (the RECORD itself, ``.pyc`` files written at install) map to None.
    """
    out: dict[str, str | None] = {}
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        path = row[0]
        digest = row[1] if len(row) > 1 else ""
        if digest.startswith("sha256="):
            raw = base64.urlsafe_b64decode(digest[len("sha256="):] + "==")
            out[path] = raw.hex()
        else:
            out[path] = None
    return out
