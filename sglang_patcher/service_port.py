"""``sglpatch patchset port``: carry a patchset's series to another SGLang release, in place, into a
copy, or only checked (:mod:`sglang_patcher.port` does the carrying)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .patchset import load_patchset
from .service import Log, quiet
from .state import sglpatch_home

__all__ = ["port_patchset"]


def port_patchset(name: str, from_version: str, to_version: str, *, check: bool = False,
                  out: Path | None = None, partial: bool = False, home: Path | None = None,
                  log: Log = quiet) -> Any:
    """``sglpatch patchset port``: carry ``name``'s series for ``from_version`` to ``to_version``
    (both pristine trees from their PyPI wheels; :mod:`sglang_patcher.port` says how).

    Where it writes: ``check`` — nothing but, with ``out``, the conflicted files and the report;
    ``out`` — a copy of the patchset at ``out/<name>/`` gets the port (the patchset itself is not
    touched), conflicted files under ``out/conflicts/sglang-<to>/``, the report at
    ``out/report-sglang-<to>.json``; neither — the patchset itself, conflicted files under
    ``$SGLPATCH_HOME/port/<name>/sglang-<to>/``. The target goes into ``patchset.yaml`` only when
    every hunk carried, or with ``partial``. Returns the :class:`~sglang_patcher.port.PortResult`
    (what did not carry is in it, not raised). Raises UnsupportedVersionError (no target
    ``from_version``), ConfigError (``to_version`` already a target, ``out/<name>`` exists),
    PatchsetError (the ``from`` target does not render on its wheel, a release not on PyPI)."""
    from .port import port_series, save_report, write_conflicts, write_port
    from .wheelcache import pristine_tree

    ps = load_patchset(name)
    ps.target(from_version)
    if from_version == to_version:
        raise ConfigError(f"--from and --to are both {from_version}", hint="port to another release")
    if partial and check:
        raise ConfigError("--check writes nothing, so --partial has nothing to do", hint="drop one of them")
    if not check:
        if to_version in ps.versions:
            raise ConfigError(f"patchset {ps.name} already has a target {to_version}",
                              hint=f"`--check` only reports how the port goes; to port again, remove "
                                   f"targets.{to_version} and its series first")
        if out is None and "@" in name:
            raise ConfigError(f"{name} is a frozen earlier revision: a port is not written into history",
                              hint="port it into a scratch copy with --out DIR")
    dest = Path(out) / ps.name if out is not None else None
    if dest is not None and not check and dest.exists():
        raise ConfigError(f"{dest} exists: --out makes a fresh copy of the patchset there",
                          hint="give another directory, or port that copy in place: "
                               f"`sglpatch patchset port {dest} --from {from_version} --to {to_version}`")
    t0 = time.monotonic()
    log(f"pristine trees: sglang=={from_version} and sglang=={to_version} from their PyPI wheels "
        "(downloaded once, then cached)")
    old = pristine_tree(from_version, home=home, log=log)
    new = pristine_tree(to_version, home=home, log=log)
    tree_seconds = time.monotonic() - t0
    result = port_series(ps, from_version, to_version, old.read, new.read,
                         old_paths=old.manifest.files, new_paths=new.manifest.files)
    result.tree_seconds = tree_seconds
    if check:
        result.mode = "check"
        result.written = {"patchset_yaml": None, "reason": "--check writes nothing"}
    elif dest is not None:
        import shutil

        result.mode = "out"
        shutil.copytree(ps.root, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        result.written = write_port(result, dest, new.read, partial=partial)
        result.written["copy"] = str(dest)
    else:
        result.mode = "in_place"
        result.written = write_port(result, ps.root, new.read, partial=partial)
    if out is not None:
        where = write_conflicts(result, Path(out) / "conflicts" / f"sglang-{to_version}")
        result.written["report"] = str(Path(out) / f"report-sglang-{to_version}.json")
    elif not check:
        where = write_conflicts(result, (home or sglpatch_home()) / "port" / ps.name / f"sglang-{to_version}")
    else:
        where = None
    if where is not None:
        result.written["conflicts_dir"] = str(where)
    if out is not None:
        save_report(result, Path(result.written["report"]))
    return result
