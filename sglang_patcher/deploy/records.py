"""Deployment records: the host's (the truth — read by the agent's ``inspect`` and ``history``) and
this machine's copies of them.

Local copies live under ``sglpatch_home()``: ``deployments/<host>/<id>.json`` (the host's record
plus a ``host`` key) and ``backups/<host>/<id>/<paths>`` (the originals the deployment replaced).
A host record the agent could not parse is *damaged*: apply, rollback and prune refuse to act on
it (:func:`check_host_records`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..errors import DeployError, StateError
from ..state import safe_component, sglpatch_home

# the phases of a deployment that still holds the host's files (``rolled_back`` is the other one)
ACTIVE = ("staging", "committing", "pushed", "verified", "rolling_back")
# the phase of a local copy whose install is gone (re-created or reinstalled): nothing to roll back
SUPERSEDED = "superseded"


# ------------------------------------------------------------------------------ the host's records

def is_damaged(record: dict[str, Any]) -> bool:
    """A journal or deployment record the agent could not parse, or one without its id / phase."""
    return bool(record.get("unreadable") or not record.get("id") or not record.get("phase"))


def damaged_records(answer: dict[str, Any]) -> list[str]:
    """The damaged records of an agent ``inspect`` or ``history`` answer (:func:`is_damaged`): their
    paths on the host (the journal first)."""
    damaged = []
    j = answer.get("journal")
    if j is not None and is_damaged(j):
        damaged.append(j.get("path") or f"{answer.get('state_dir', '<state dir>')}/journal.json")
    for d in answer.get("deployments", []):
        if is_damaged(d):
            damaged.append(d.get("path") or f"record {d.get('id', '?')}")
    return damaged


def damaged_hint(name: str) -> str:
    return (f"restore them from the local copies under {sglpatch_home() / 'deployments' / safe_component(name)} "
            "if present, else move them aside (the files' states are in `sglpatch status`)")


def check_host_records(name: str, answer: dict[str, Any]) -> None:
    """Refuse to act on damaged host records (:func:`damaged_records`): :class:`StateError` naming
    the files and what to do. ``answer`` is an agent ``inspect`` or ``history`` answer."""
    damaged = damaged_records(answer)
    if damaged:
        raise StateError(f"{name}: damaged deployment record(s) on the host: {', '.join(damaged)}",
                         hint=damaged_hint(name))


def record_summary(d: dict[str, Any] | None) -> dict[str, Any] | None:
    """A record as ``status --json`` shows it: its facts and the paths of its files."""
    if d is None:
        return None
    return {k: d.get(k) for k in ("id", "patchset", "revision", "sglang_version", "phase", "times",
                                  "forced", "checks")} | {"files": sorted(d.get("files", {}))}


# ------------------------------------------------------------------------------- the local copies

def local_paths(home: Path, host: str, deployment_id: str) -> tuple[Path, Path]:
    """``(record copy, backups directory)`` of one deployment under ``home``."""
    h = safe_component(host)
    return (home / "deployments" / h / f"{deployment_id}.json", home / "backups" / h / deployment_id)


def local_only_active(home: Path, host: str, on_host: set[str]) -> list[Path]:
    """Local copies of ``host``'s deployment records that are active (by their phase) but that the
    host's records do not name: their host record was lost or moved."""
    out = []
    for p in sorted((home / "deployments" / safe_component(host)).glob("*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("phase") in ACTIVE and rec.get("id") not in on_host:
            out.append(p)
    return out


def lost_records(agent: Any, home: Path, host: str, on_host: set[str],
                 live: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The local copies of ``host``'s records that are active but that the host's records do not
    name (:func:`local_only_active`), each judged by the live files: ``{id, local, record,
    site_packages, files, carried}`` — ``carried`` the paths whose live sha256 is still the one
    the deployment wrote (files it left unchanged do not count). None carried: the install it
    patched is gone (re-created or reinstalled); some: the host's record was lost. ``live`` is an
    agent ``inspect`` answer's ``files`` already at hand; the paths it lacks are inspected (one
    round trip, only when there is such a copy)."""
    out = []
    for path in local_only_active(home, host, on_host):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        files = {p: f for p, f in (rec.get("files") or {}).items() if isinstance(f, dict)}
        out.append({"id": str(rec.get("id") or path.stem), "local": str(path), "record": rec,
                    "site_packages": rec.get("site_packages"), "files": len(files), "_files": files})
    if not out:
        return []
    have = dict(live or {})
    need = sorted({p for r in out for p in r["_files"]} - set(have))
    if need:
        have.update(agent.inspect(need).get("files", {}))
    for r in out:
        files = r.pop("_files")
        r["carried"] = sorted(p for p, f in files.items() if f.get("after") != f.get("before") and (
            (have.get(p) or {}).get("sha256") if (have.get(p) or {}).get("exists") else None) == f.get("after"))
    return out


def supersede_local_records(home: Path, paths: list[Path], reason: str) -> list[str]:
    """Mark the local copies ``paths`` as superseded: ``phase`` becomes :data:`SUPERSEDED` and
    ``superseded`` says when, why and the phase it had. For copies whose install is gone, so that
    no command takes them for a deployment still on the host. Returns the ids marked; a copy that
    cannot be read or written is passed over (they are copies)."""
    done = []
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for path in paths:
        try:
            rec = json.loads(path.read_text())
            if not isinstance(rec, dict) or rec.get("phase") not in ACTIVE:
                continue
            rec["superseded"] = {"at": when, "reason": reason, "phase": rec.get("phase")}
            rec["phase"] = SUPERSEDED
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
            tmp.replace(path)
        except (OSError, ValueError):
            continue
        done.append(str(rec.get("id") or path.stem))
    return done


def superseded_backups(home: Path, host: str) -> list[dict[str, Any]]:
    """This machine's backup copies of ``host``'s deployments whose local record is superseded
    (their install was replaced: no rollback reads them again): ``{id, record, dir, bytes, files}``
    for each such record that still has its ``backups/<host>/<id>/`` directory, oldest id first."""
    out = []
    for path in sorted((home / "deployments" / safe_component(host)).glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(rec, dict) or rec.get("phase") != SUPERSEDED:
            continue
        bdir = local_paths(home, host, path.stem)[1]
        if not bdir.is_dir():
            continue
        files = [f for f in bdir.rglob("*") if f.is_file() or f.is_symlink()]
        out.append({"id": path.stem, "record": str(path), "dir": str(bdir), "files": len(files),
                    "bytes": sum(f.lstat().st_size for f in files)})
    return out


def mark_backups_pruned(record: Path) -> None:
    """Note in a local copy of a record that its backup copies were deleted (``backups_pruned``:
    when), written atomically; a copy that cannot be read or written is passed over."""
    try:
        rec = json.loads(record.read_text())
        if not isinstance(rec, dict):
            return
        rec["backups_pruned"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        tmp = record.with_name(record.name + ".tmp")
        tmp.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        tmp.replace(record)
    except (OSError, ValueError):
        return


def local_records_within(home: Path, directory: Path) -> list[Path]:
    """The active local copies, of any host, of deployments made on an install inside
    ``directory`` (their record's ``site_packages`` lies under it): the records a deleted venv
    leaves behind."""
    base = home / "deployments"
    try:
        root = directory.resolve()
    except OSError:
        return []
    out = []
    for p in sorted(base.glob("*/*.json")) if base.is_dir() else []:
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(rec, dict):
            continue
        site = rec.get("site_packages")
        if rec.get("phase") in ACTIVE and isinstance(site, str) and site:
            try:
                inside = Path(site).resolve().is_relative_to(root)
            except (OSError, ValueError):
                continue
            if inside:
                out.append(p)
    return out


def save_local_record(home: Path, host: str, record: dict[str, Any],
                      backups: dict[str, bytes] | None = None) -> Path:
    """Write the local copy of a host's deployment record (and its backups); returns the record path."""
    rec_path, bdir = local_paths(home, host, record["id"])
    record = dict(record, host=host)
    rec_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = rec_path.with_name(rec_path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    tmp.replace(rec_path)
    for path, data in (backups or {}).items():
        f = bdir.joinpath(*path.split("/"))
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    return rec_path


def sync_local_records(home: Path, host: str, host_records: list[dict[str, Any]]) -> list[str]:
    """Bring the local copies of ``host``'s records up to the host's (the host's records are the
    truth): a local copy whose phase differs — a run interrupted after the host changed and
    before the copy was written — is rewritten. Returns the ids rewritten; never raises for a
    local copy it cannot read or write (they are copies)."""
    done = []
    for rec in host_records:
        if not isinstance(rec, dict) or is_damaged(rec) or not rec.get("id"):
            continue
        path = local_paths(home, host, str(rec["id"]))[0]
        try:
            local = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(local, dict) and local.get("phase") != rec.get("phase"):
            try:
                save_local_record(home, host, rec)
            except OSError:
                continue
            done.append(str(rec["id"]))
    return done


def check_local_writable(home: Path, host: str) -> None:
    """Before a host is changed: the local copies of its records and backups can be written
    ($SGLPATCH_HOME/deployments/HOST and backups/HOST, created if missing; a probe file is written
    and removed). Raises DeployError (exit 8) naming the directory, so nothing is pushed that
    could not be recorded here."""
    rec_dir, bdir = (p.parent for p in local_paths(home, host, "probe"))
    for d in (rec_dir, bdir):
        probe = d / f".sglpatch-probe-{os.getpid()}"
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise DeployError(f"{host}: cannot write the local deployment records in {d} ({exc.strerror or exc}); "
                              "nothing was changed on the host",
                              hint="make it a writable directory (it may be a file, or lack permissions), or point "
                                   "SGLPATCH_HOME at a writable absolute path, then rerun") from exc
