"""``sglpatch patchset refresh``: re-pin a patchset's ``pristine``/``expected`` hashes for a release,
from its PyPI wheel or a release tree checked against its RECORD."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .errors import ConfigError
from .patchset import load_patchset
from .progress import SILENT, Meter
from .service import Log, quiet

__all__ = ["RefreshReport", "refresh_patchset"]


@dataclass
class RefreshReport:
    patchset: str
    version: str
    hashes: dict[str, dict[str, str | None]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"patchset": self.patchset, "sglang_version": self.version, **self.hashes}

    def __rich__(self):
        t = Table(title=f"{self.patchset}: hashes for sglang {self.version}", title_justify="left")
        t.add_column("file")
        t.add_column("pristine")
        t.add_column("expected")
        for p in sorted(self.hashes.get("expected", {})):
            pr = self.hashes["pristine"].get(p)
            ex = self.hashes["expected"].get(p)
            t.add_row(p, (pr or "absent")[:16], (ex or "deleted")[:16])
        merged = self.hashes.get("already_applied") or []
        if not merged:
            return t
        return Group(t, Text(f"{len(merged)} change(s) already in sglang {self.version} (merged upstream: "
                             f"drop them from this release's series):", style="yellow"),
                     *(Text(f"  {m}", style="yellow") for m in merged))


def _release_tree_reader(base: Path, version: str, log: Log, *, unverified: bool = False,
                         supported: list[str] | None = None) -> Callable[[str], bytes | None]:
    """A reader of the release files under ``base`` (a site-packages-like directory) for refresh.

    Where ``base`` holds ``sglang-<v>.dist-info`` (an install or an unpacked wheel), its version
    must be ``version`` and every file read must match its RECORD: a patched or hand-edited install
    is refused (its hashes would be pinned as "pristine"). Without dist-info (a source checkout)
    nothing can check the files: refused unless ``unverified``. ``supported``: the patchset's
    releases, for the hint. Raises ConfigError naming the directory."""
    from .manifest import read_record, sha256_bytes

    if not (base / "sglang").is_dir():
        raise ConfigError(f"{base}: no sglang/ package there",
                          hint="--tree takes a site-packages directory: the one that holds sglang/")
    infos = sorted(base.glob("sglang-*.dist-info"))
    record: dict[str, str | None] | None = None
    if infos:
        found = infos[-1].name[len("sglang-"):-len(".dist-info")]
        if len(infos) > 1 or found != version:
            other = (f", or --sglang {found}" if len(infos) == 1 and found in (supported or [found]) else
                     f" (the patchset has no target {found}: add one to patchset.yaml first)" if len(infos) == 1
                     else "")
            raise ConfigError(f"{base}: holds {', '.join(i.name for i in infos)}, not sglang {version}",
                              hint=f"give the site-packages of sglang {version}{other}")
        try:
            record = read_record((infos[-1] / "RECORD").read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{infos[-1]}: cannot read RECORD ({exc.strerror or exc})",
                              hint="give an intact install or unpacked wheel") from exc
        log(f"pristine tree: {base} (sglang {version}, each file checked against its RECORD)")
    elif not unverified:
        raise ConfigError(f"{base}: no sglang-*.dist-info/RECORD to check its files against, so nothing shows "
                          f"they are the sglang {version} release's (an edited file would be pinned as pristine)",
                          hint="give an install or an unpacked wheel of that release, or pass --unverified if "
                               "these files are the release's as published (e.g. a source checkout of its tag)")
    else:
        log(f"pristine tree: {base} (no sglang-*.dist-info: taken as sglang=={version} unchecked, --unverified)")

    def read(p: str) -> bytes | None:
        f = base / p
        data = f.read_bytes() if f.is_file() else None
        if record is not None and (data is not None or p in record):
            want = record.get(p)
            got = None if data is None else sha256_bytes(data)
            if p not in record or got != want:
                why = "is not in its RECORD" if p not in record else (
                    "is missing" if data is None else "differs from its RECORD (patched or edited)")
                raise ConfigError(f"{base}: {p} {why}: not the sglang {version} release file",
                                  hint="refresh from a pristine install (e.g. drop --tree: the PyPI wheel), "
                                       "or roll the patchset back on that install first")
        return data
    return read


def refresh_patchset(name: str, version: str, *, tree: Path | None = None, unverified: bool = False,
                     home: Path | None = None, log: Log = quiet, meter: Meter = SILENT) -> RefreshReport:
    """Recompute and rewrite ``pristine``/``expected`` of ``name`` for ``version``.

    The pristine files come from the PyPI wheel of ``version`` (downloaded once, then cached) or,
    with ``tree``, from that site-packages-like directory (the one holding ``sglang/``: a release
    not on PyPI, or an unpacked wheel), checked against its RECORD (``unverified``: a tree without
    one is taken as it is). Raises UnsupportedVersionError (before any download) when
    ``name`` has no target ``version``, ConfigError when ``tree`` holds no ``sglang/`` package,
    ApplyError when the series no longer applies to that release."""
    from .patchset_write import refresh_hashes
    from .wheelcache import pristine_tree

    ps = load_patchset(name)
    ps.target(version)  # an unsupported version fails before any download (as diff does)
    if tree is not None:
        read = _release_tree_reader(Path(tree), version, log, unverified=unverified, supported=ps.versions)
    else:
        log(f"pristine tree: sglang=={version} from the PyPI wheel (downloaded once, then cached)")
        read = pristine_tree(version, home=home, log=log, meter=meter).read
    hashes = refresh_hashes(ps.root, version, read)
    return RefreshReport(ps.name, version, hashes)
