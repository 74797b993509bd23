"""Rollback: put a deployment's originals back on the host, verified by hash — and, when the host
lost some of those originals, find them first.

A user's ``sglpatch rollback`` is :func:`rollback_host`. The agent restores each backup of the
deployment (stage, verify, rename), as one step per deployment, newest first. A backup lost on the
host is looked for where its bytes may still be (:func:`recover_backups`): this machine's copies
of the deployment's backups, the host's mirror, the release's PyPI wheel — only bytes with the
sha256 the record names count — and put back (agent ``put_backups``) before the rollback runs.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from ..discovery import HostInfo
from ..errors import StateError
from ..inventory import Host
from ..mirror import Mirror
from ..remote.agent_client import AgentStateError, make_holder
from ..state import sglpatch_home
from ..transport.base import Transport
from ..transport.local import LocalTransport
from .agent import Progress, agent_for, host_name, lock_takeover, no_progress
from .preflight import refuse_blocked
from .pristine import LocalBackups, PristineSource, Reader, wheel_reader
from .records import (ACTIVE, SUPERSEDED, check_host_records, check_local_writable, local_paths, lost_records,
                      save_local_record, supersede_local_records, sync_local_records)
from .results import RollbackResult


def rollback_host(transport: Transport, host: Host, info: HostInfo, deployment_id: str | None = None, *,
                  break_lock: bool = False, force: bool = False, home: Path | None = None,
                  progress: Progress | None = None) -> RollbackResult:
    """Roll back ``deployment_id`` (None: the latest active one; an interrupted one first).

    With an id, every active deployment after it that touches the same files is rolled back too,
    newest first, so the host ends in the state before ``deployment_id``; where that one was rolled
    back already, only those later ones are, and ``to_rolled_back`` says so. The agent restores each
    backup (stage, verify, rename, original owner and mode), removes added files, purges bytecode and
    verifies every file against its recorded pre-deploy sha256. A file edited on the host since the
    deployment wrote it is drift: :class:`DriftError` naming the files and nothing is changed, unless
    ``force`` (the edited bytes are then kept on the host under ``backups/<id>.drifted/``).
    Nothing active (rolled back already, or never deployed) is no error: the result names no
    deployment (``already``: the latest rolled-back one, if any). Backups lost on the host are put
    back first, each that is found by its recorded sha256 in the local copies, the host's mirror
    or the release's wheel (``backups_put_back`` says which came from where); if any is found
    nowhere, no file is restored. Local copies of records that say active but that the host has no
    record of are judged by the live files: where none of its files carries the bytes it wrote, the
    install it patched was replaced (re-created, reinstalled) — the copy is marked superseded and
    named (``superseded``), nothing to roll back; where some still do, the host's record was lost:
    StateError naming the copy and where it goes. An id the host has no record of is what this
    machine's copy says it is (:func:`not_on_host`: superseded or rolled back is no error). Raises
    StateError (unknown id, that lost record, a backup missing or not matching that none of those
    holds), LockHeldError, DriftError.
    """
    t0 = time.monotonic()
    rt0 = transport.round_trips
    to_rolled_back: dict[str, str] = {}
    home = home or sglpatch_home()
    progress = progress or no_progress
    name = host_name(host, transport)
    agent = agent_for(transport, host, info)
    hist = agent.history()
    check_host_records(name, hist)
    sync_local_records(home, name, hist.get("deployments", []))
    records = {d["id"]: d for d in hist.get("deployments", [])}
    j = hist.get("journal")
    if j is not None:
        records[j["id"]] = j
    order = sorted(records.values(), key=lambda d: (d.get("times", {}).get("started", ""), d["id"]))
    active = [d for d in order if d.get("phase") in ACTIVE]
    if deployment_id is None:
        if not active:
            lost = lost_records(agent, home, name, set(records))
            gone = [r for r in lost if not r["carried"]]   # the install they patched was replaced
            superseded: dict[str, dict[str, Any]] = {}
            if gone:
                why = replaced_reason(info)
                marked = supersede_local_records(home, [Path(r["local"]) for r in gone], why)
                superseded = {r["id"]: {"local": r["local"], "site_packages": r["site_packages"],
                                        "files": r["files"], **backup_copies(home, name, r["id"])}
                              for r in gone if r["id"] in marked}
            kept = [r for r in lost if r["carried"]]
            if not kept:  # rolled back already, never deployed, or its install gone: the wanted state holds
                # the one rolled back last (a stack is rolled back newest first: not the latest started)
                done = sorted((d for d in order if d.get("phase") == "rolled_back"),
                              key=lambda d: d.get("times", {}).get("rolled_back", ""))
                return RollbackResult(host=name, rolled_back=[], files={}, already=[d["id"] for d in done][-1:],
                                      round_trips=transport.round_trips - rt0, seconds=time.monotonic() - t0,
                                      superseded=superseded)
            raise lost_record_error(name, host, info, kept[-1], order, superseded)
        todo = [active[-1]]
    else:
        if deployment_id not in records:
            return not_on_host(agent, home, name, host, info, deployment_id, order, records, t0=t0,
                               rt0=rt0, transport=transport)
        start = order.index(records[deployment_id])
        todo = [d for d in order[start:] if d.get("phase") in ACTIVE]
        first = records[deployment_id]
        todo = [d for d in todo if d is first or set(d.get("files", {})) & set(first.get("files", {}))]
        todo.reverse()
        if todo and first.get("phase") not in ACTIVE:   # said with the result: it undoes later ones only
            to_rolled_back = {"id": deployment_id, "rolled_back_at": first.get("times", {}).get("rolled_back", "")}
    refuse_other_release(name, info, todo, home)
    takeover = lock_takeover(name, hist.get("lock"), break_lock, "cannot roll back")
    if todo:
        check_local_writable(home, name)
    refuse_unrestorable(name, agent, todo)
    rolled: list[str] = []
    already: list[str] = []
    final: dict[str, str | None] = {}
    if deployment_id is not None and not todo:
        already.append(deployment_id)
    put_back: dict[str, dict[str, str]] = {}
    kept: dict[str, str] = {}
    bytecode: dict[str, Any] = {}
    for d in todo:
        holder = make_holder(d["id"])
        progress("rollback", f"{d['id']} ({d.get('patchset')} r{d.get('revision')}, {len(d.get('files', {}))} files)")
        try:
            out = agent.rollback(d["id"], holder, break_lock=takeover, force=force)
        except AgentStateError as exc:
            if exc.kind != "backup_missing":
                raise
            missing = exc.details.get("backups", {})
            if not missing:
                raise
            found = recover_backups(home, name, info, d, missing)
            if found:  # verified originals: harmless to put back even when others stay lost
                agent.put_backups(d["id"], {p: data for p, (data, _) in found.items()}, holder,
                                  break_lock=takeover)
                put_back[d["id"]] = {p: src for p, (_, src) in found.items()}
                progress("rollback", f"{d['id']}: put back {len(found)} lost backup(s) from "
                                     f"{', '.join(sorted(set(put_back[d['id']].values())))}")
            nowhere = {p: b for p, b in missing.items() if p not in found}
            if nowhere:
                raise StateError(
                    f"{name}: {len(nowhere)} backup(s) of deployment {d['id']} are missing or damaged on the host "
                    f"and no copy with the recorded sha256 is left (local copies, mirror, release wheel): "
                    f"{', '.join(sorted(nowhere.values()))}; nothing was restored"
                    + (f" ({len(found)} other lost backup(s) were put back)" if found else ""),
                    hint=missing_backups_hint(home, name, d["id"], nowhere,
                                              local=isinstance(transport, LocalTransport))) from exc
            out = agent.rollback(d["id"], holder, break_lock=takeover, force=force)
        (already if out.get("already") else rolled).append(d["id"])
        kept.update(out["deployment"].get("drift_kept") or {})
        if not out.get("already"):
            bc = out["deployment"].get("bytecode") or {}
            bytecode.setdefault("recompiled", []).extend(bc.get("recompiled", []))
            bytecode.setdefault("failed", {}).update(bc.get("failed", {}))
            if bc.get("skipped"):
                bytecode["skipped"] = bc["skipped"]
        save_local_record(home, name, out["deployment"])
        for p, f in out["deployment"].get("files", {}).items():
            final[p] = f.get("before")
    return RollbackResult(host=name, rolled_back=rolled, files=final, already=already,
                          round_trips=transport.round_trips - rt0, seconds=time.monotonic() - t0,
                          backups_put_back=put_back, drift_kept=kept, to_rolled_back=to_rolled_back,
                          bytecode={k: (sorted(set(v)) if k == "recompiled" else v) for k, v in bytecode.items()})


def refuse_unrestorable(name: str, agent: Any, todo: list[dict[str, Any]]) -> None:
    """Before a rollback of several deployments (``todo``, newest first) writes anything: every file
    it would restore or delete — the live file not at the ``before`` of the oldest deployment that
    touched it —, their directories and the state dir, judged as a push judges them (``inspect``'s
    ``blocked``, :func:`.preflight.refuse_blocked`: exit 8 naming each file and why). One
    deployment needs no round trip for it: the agent's ``rollback`` makes the same test before its
    first write (so does the rollback of each deployment here, a race after this check included)."""
    if len(todo) < 2:
        return
    final: dict[str, str | None] = {}
    for d in todo:                     # newest first: the oldest's ``before`` is what stays
        for p, f in d.get("files", {}).items():
            final[p] = f.get("before") if isinstance(f, dict) else None
    ins = agent.inspect(sorted(final))
    live = ins.get("files") or {}
    actions = {}
    for p, before in final.items():
        info = live.get(p) or {}
        if before is None:
            if info.get("exists"):
                actions[p] = "delete"
        elif info.get("sha256") != before:
            actions[p] = "write"
    ids = ", ".join(d["id"] for d in todo)
    refuse_blocked(name, f"cannot roll back {ids}", "restore or delete", actions, ins)


def not_on_host(agent: Any, home: Path, name: str, host: Host, info: HostInfo, deployment_id: str,
                order: list[dict[str, Any]], records: dict[str, dict[str, Any]], *, t0: float, rt0: int,
                transport: Transport) -> RollbackResult:
    """``rollback --to ID`` where the host has no record of ID: what this machine's copy of the
    record says it is. Superseded (its install was replaced), or active here but carrying none of
    its bytes on the host (then marked superseded now): nothing to roll back, no error — the result
    names it (``superseded``) and why. Rolled back (the host's state went since): ``already``.
    Active here and some of its files still carry its bytes: the host's record was lost —
    StateError naming the copy and where it goes. No copy here: StateError naming the host's
    deployments, and the host whose record it is when it is another one."""
    plain = bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", deployment_id))  # an id, not a path
    local = local_paths(home, name, deployment_id)[0]
    try:
        rec = json.loads(local.read_text()) if plain else None
    except (OSError, ValueError):
        rec = None
    done = dict(round_trips=transport.round_trips - rt0, seconds=time.monotonic() - t0)
    phase = rec.get("phase") if isinstance(rec, dict) else None
    if phase == SUPERSEDED:
        sup = rec.get("superseded") if isinstance(rec.get("superseded"), dict) else {}
        return RollbackResult(host=name, rolled_back=[], files={}, **done, superseded={deployment_id: {
            "local": str(local), "site_packages": rec.get("site_packages"),
            "files": len(rec.get("files") or {}), "at": sup.get("at"), "reason": sup.get("reason"),
            "marked_before": True, **backup_copies(home, name, deployment_id)}}, active=[d["id"] for d in order if d.get("phase") in ACTIVE])
    if phase == "rolled_back":
        return RollbackResult(host=name, rolled_back=[], files={}, already=[deployment_id], **done)
    if phase in ACTIVE:
        lost = [r for r in lost_records(agent, home, name, set(records)) if r["id"] == deployment_id]
        if lost and not lost[0]["carried"]:
            r = lost[0]
            why = replaced_reason(info)
            if supersede_local_records(home, [Path(r["local"])], why):
                return RollbackResult(host=name, rolled_back=[], files={}, **done, superseded={deployment_id: {
                    "local": r["local"], "site_packages": r["site_packages"], "files": r["files"],
                    "reason": why, **backup_copies(home, name, deployment_id)}}, active=[d["id"] for d in order if d.get("phase") in ACTIVE])
        if lost:
            raise lost_record_error(name, host, info, lost[0], order, {})
    base = home / "deployments"
    elsewhere = sorted(d.name for d in base.iterdir() if d.name != local.parent.name
                       and (d / f"{deployment_id}.json").is_file()) if plain and base.is_dir() else []
    shown = [d["id"] for d in order]
    raise StateError(
        f"{name}: no deployment {deployment_id} on this host (its deployments: "
        f"{', '.join(shown[-5:]) or 'none'}{f', and {len(shown) - 5} earlier' if len(shown) > 5 else ''})"
        + (f"; this machine's records name it as a deployment of {', '.join(elsewhere)}" if elsewhere else ""),
        hint=(f"name that host: `sglpatch rollback --host {elsewhere[0]} --to {deployment_id}`" if elsewhere else
              f"`sglpatch status --host {name}` lists the host's deployments; "
              f"`sglpatch rollback --host {name}` undoes the latest active one"))


def backup_copies(home: Path, name: str, deployment_id: str) -> dict[str, str]:
    """``{"backups": dir}`` when this machine still holds backup copies of the deployment (for a
    superseded one, `sglpatch prune` deletes them), else {}."""
    bdir = local_paths(home, name, deployment_id)[1]
    return {"backups": str(bdir)} if bdir.is_dir() else {}


def replaced_reason(info: HostInfo) -> str:
    """Why a local copy of a record is superseded: its install was replaced."""
    return ("the host has no record of it and none of its files carries the bytes it wrote: the "
            f"install it patched was replaced (re-created or reinstalled; now {info.site_packages})")


def lost_record_error(name: str, host: Host, info: HostInfo, r: dict[str, Any], order: list[dict[str, Any]],
                      superseded: dict[str, Any]) -> StateError:
    """A deployment active in this machine's records whose host record was lost while some of its
    files still carry its bytes: nothing is rolled back; the hint says where the copy goes."""
    shown = [d['id'] + ' ' + str(d.get('phase')) for d in order]
    state_dir = str(getattr(host, "state_dir", None) or f"{info.site_packages}/.sglpatch")
    return StateError(
        f"{name}: deployment {r['id']} is active in this machine's records ({r['local']}) but the host "
        f"has no record of it, and {len(r['carried'])} of its {r['files']} files still carry the bytes it "
        f"wrote ({', '.join(r['carried'][:3])}{', …' if len(r['carried']) > 3 else ''}): the host's record "
        f"was lost, so nothing was rolled back (the host's history: {', '.join(shown[-5:]) or 'empty'}"
        f"{f', and {len(shown) - 5} earlier' if len(shown) > 5 else ''})"
        + (f"; the local records of {', '.join(superseded)}, whose install was replaced, are now marked "
           f"superseded" if superseded else ""),
        hint=f"copy the record back: {r['local']} into the host's {state_dir}/deployments/, then run "
             f"`sglpatch rollback --host {name}` again")


def recover_backups(home: Path, name: str, info: HostInfo, record: dict[str, Any],
                    missing: dict[str, str]) -> dict[str, tuple[bytes, str]]:
    """Originals of deployment ``record`` whose host backups are lost (``missing``: {path: backup
    path on the host}), found where their bytes still are: the local copies ``save_local_record``
    kept, the host's mirror, the release's PyPI wheel (fetched if not cached). Each must have the
    sha256 the record names as ``before`` (else it is not the original: left out). Returns
    {path: (bytes, source name)} for the paths found; never raises for a path not found."""
    hashes = {p: f.get("before") for p, f in record.get("files", {}).items()
              if p in missing and isinstance(f, dict) and f.get("before")}
    version = str(record.get("sglang_version") or info.sglang_version or "")
    readers: list[tuple[str, Reader]] = [("local copies", LocalBackups(home, name, hashes))]
    mirror = Mirror(home, name, version) if version else None
    if mirror is not None and mirror.exists():
        readers.append((f"the mirror of {name}", mirror.read))
    if version:
        readers.append((f"wheel sglang=={version}", wheel_reader(version, home)))
    src = PristineSource(hashes, readers)
    found: dict[str, tuple[bytes, str]] = {}
    for p in sorted(hashes):
        try:
            data = src.read(p)
        except StateError:
            continue
        if data is not None:
            found[p] = (data, src.used[p])
    return found


def refuse_other_release(name: str, info: HostInfo, todo: list[dict[str, Any]], home: Path) -> None:
    """Refuse to roll back a deployment made on another SGLang release than the host has now:
    its backups are the old release's files, and restoring them (``--force`` included) would
    write them over the new install. Raises :class:`StateError` naming both releases."""
    now = str(info.sglang_version or "")
    other = [d for d in todo if d.get("sglang_version") and now and str(d["sglang_version"]) != now]
    if not other:
        return
    d = other[0]
    created = sorted(p for p, f in d.get("files", {}).items() if f.get("before") is None)
    local = local_paths(home, name, d["id"])[0]
    raise StateError(
        f"{name}: deployment {d['id']} was made on sglang {d['sglang_version']}, but the host now has "
        f"sglang {now}: its backups are {d['sglang_version']}'s files, and restoring them (even with "
        f"--force) would write them over the {now} install; nothing was changed",
        hint=(f"installing sglang {now} replaced the patched files it ships"
              + (f"; files the deployment added are still there: {', '.join(created)} — delete them if "
                 f"sglang {now} does not ship them" if created else "")
              + f"; then move the host's record deployments/{d['id']}.json out of its .sglpatch/ state "
                f"directory (a local copy stays at {local}) and check with `sglpatch status --host {name}`; "
                f"or reinstall sglang {d['sglang_version']} on the host and roll back"))


def missing_backups_hint(home: Path, host: str, deployment_id: str, backups: dict[str, str], *,
                        local: bool = False) -> str:
    """What to do when the host lost backups of a deployment: the local copies that
    ``save_local_record`` kept (under $SGLPATCH_HOME/backups/HOST/ID/), each with where it goes
    (``local``: the host is this machine, so a plain copy, not scp)."""
    bdir = local_paths(home, host, deployment_id)[1]
    have = {rel: bdir / rel for rel in backups if (bdir / rel).is_file()}
    to = "" if local else host + ":"
    # the host's backups/<id>/ directory each backup lies in (None: a path not ending in its rel)
    roots = {backups[rel][:-len(rel) - 1] if backups[rel].endswith("/" + rel) else None for rel in have}
    whole = len(have) > 2 and len(roots) == 1 and None not in roots  # one copy of the whole tree
    if whole:
        dest = roots.pop()
        lines = [f"copy the files under {bdir}/ into {to}{dest}/, keeping their paths"
                 f" ({'cp' if local else 'scp'} -r {bdir}/. {to}{dest}/)"]
    else:
        lines = [f"copy {have[rel]} to {to}{backups[rel]}" for rel in sorted(have)]
    lost = sorted(set(backups) - set(have))
    how = "" if local or whole else " (e.g. with scp)"
    text = ("; ".join(lines) + how + ", then rerun `sglpatch rollback --host " + host + "`") if lines else ""
    if lost:
        text += ("; " if text else "") + (f"no local copy of {', '.join(lost)} either: put a copy with the sha256 "
                                          "the deployment's record names as `before` at each backup path and "
                                          "roll back again (only those bytes are the originals); failing that, "
                                          "reinstall the SGLang release on the host — which does not bring "
                                          "back what those originals held — and check `sglpatch status`")
    return text
