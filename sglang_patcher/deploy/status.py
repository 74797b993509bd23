"""Status: the state of every touched file on a host, by hashes — and the host's deployment
history, pending journal, lock and missing backups. Reads only.

A user's ``sglpatch status`` is :func:`host_status`: judged against one patchset (its pristine,
expected and earlier revisions' sha256), or, without one, against the host's own deployment records
and the installed distribution's RECORD.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..discovery import HostInfo
from ..inventory import Host
from ..patchset import Patchset
from ..state import sglpatch_home
from ..transport.base import Transport
from .agent import agent_for, host_name
from .plan import patchset_view, record_hashes
from .records import ACTIVE, damaged_records, is_damaged, local_paths, lost_records
from .results import FileStatus, StatusReport


def host_status(transport: Transport, host: Host, info: HostInfo, patchset: Patchset | None = None, *,
                home: Path | None = None) -> StatusReport:
    """Per touched file: pristine / patched (patchset, revision) / drifted, by hashes; plus history.

    With ``patchset``: its touched files, judged against its pristine/expected/history hashes (one
    round trip). Without: the files of the host's deployment records, judged against the installed
    distribution's RECORD (pristine) and the records' ``after`` hashes (two round trips).
    ``lost_records``: this machine's copies of records that say active but that the host has no
    record of, each with the files that still carry its bytes (none: its install was replaced).
    """
    agent = agent_for(transport, host, info)
    name = host_name(host, transport)
    version = str(info.sglang_version or "") or None
    record_h = record_hashes(info)
    known: dict[str, list[tuple[str, str | None, int | None]]] = {}  # path → [(state, hash, rev)]
    ps_name = ps_rev = None
    retired: set[str] = set()  # judged against a patchset: paths only its earlier revisions touched
    if patchset is not None:
        ps_name, ps_rev = str(patchset.name), int(patchset.revision)
        paths, pristine_h, expected_h, hist = patchset_view(patchset, str(version), info)
        for p in expected_h:
            known.setdefault(p, []).append(("patched", expected_h[p], ps_rev))
        for rev, hh in sorted(hist.items(), reverse=True):
            for p, h in hh.items():
                paths.add(p)
                known.setdefault(p, []).append(("patched", h, rev))
        retired = paths - set(expected_h)
        pristine_of = {p: pristine_h.get(p, record_h.get(p)) for p in paths}
        ins = agent.inspect(sorted(paths), backups=True)
        deployments = ins.get("deployments", [])
        for d in deployments:  # what a later revision wrote is the host's records' to say (not drift)
            if d.get("phase") in ACTIVE and d.get("patchset") == ps_name and isinstance(d.get("files"), dict):
                for p, f in d["files"].items():
                    if p in paths and isinstance(f, dict) and f.get("after"):
                        known.setdefault(p, []).append(("patched", f["after"], d.get("revision")))
    else:
        first = agent.inspect([], backups=True)
        deployments = first.get("deployments", [])
        paths = set()
        pristine_of = {}
        pending = first.get("journal")
        recs = list(deployments) + ([pending] if pending and pending.get("id") not in
                                    {d.get("id") for d in deployments} else [])
        for d in recs:
            for p, f in d.get("files", {}).items():
                paths.add(p)
                pristine_of.setdefault(p, f.get("before"))  # the oldest original
                known.setdefault(p, []).append(("patched", f.get("after"), d.get("revision")))
        for p in paths:
            if p in record_h:
                pristine_of[p] = record_h[p]
        ins = {**agent.inspect(sorted(paths)), "bad_backups": first.get("bad_backups", {})} if paths else first
        by_path_ps: dict[str, list[dict[str, Any]]] = {}
        for d in recs:
            for p in d.get("files", {}):
                by_path_ps.setdefault(p, []).append(d)
    # a file several revisions share is credited to the revision the host's records say is active
    host_rev = max((int(d.get("revision") or 0) for d in deployments
                    if d.get("phase") in ACTIVE and d.get("patchset") == ps_name), default=None)
    # a file that an earlier deployment created and the newest active one naming it deleted (a module a
    # later revision no longer installs): absent as in the release, and that deployment's state
    deleted_by: dict[str, dict[str, Any]] = {}
    for d in deployments:  # oldest first
        if d.get("phase") in ACTIVE and (ps_name is None or d.get("patchset") == ps_name):
            for p, f in (d.get("files") or {}).items():
                if isinstance(f, dict):
                    if f.get("after") is None and f.get("before") is not None:
                        deleted_by[p] = d
                    else:
                        deleted_by.pop(p, None)
    files = []
    for p in sorted(paths):
        li = ins.get("files", {}).get(p, {})
        live = li.get("sha256") if li.get("exists") else None
        fs = FileStatus(path=p, state="drifted", live=live, pristine=pristine_of.get(p), record=record_h.get(p))
        if live is None and live == pristine_of.get(p) and p in deleted_by:
            d = deleted_by[p]
            fs.state, fs.patchset, fs.revision = "patched", d.get("patchset"), d.get("revision")
            if p in retired and host_rev is not None:
                # retired by an earlier revision (r4 deleted r3's module) and still wanted absent by
                # the revision the host carries now: that revision's state, not the one that deleted it
                fs.revision = host_rev
        elif live == pristine_of.get(p):
            fs.state = "pristine" if live is not None else "absent"
        else:
            for state, h, rev in sorted(known.get(p, []), key=lambda e: e[2] != host_rev):
                if h == live:
                    fs.state, fs.revision = state, rev
                    fs.expected = h
                    if patchset is not None:
                        fs.patchset = ps_name
                    else:
                        ds = [d for d in by_path_ps.get(p, []) if d.get("files", {}).get(p, {}).get("after") == live]
                        fs.patchset = ds[-1].get("patchset") if ds else None
                        fs.revision = ds[-1].get("revision") if ds else rev
                    break
        files.append(fs)
    older = None
    if patchset is not None:  # one earlier revision, whole: its files at it, the rest at rest
        revs = {f.revision for f in files if f.state == "patched"}
        r = next(iter(revs)) if len(revs) == 1 else None
        if r is not None and r != ps_rev and r in hist and all(
                (f.state == "patched") if f.path in hist[r] else f.state in ("pristine", "absent") for f in files):
            older = r
    damaged = damaged_records(ins)
    journal = ins.get("journal")
    bad = ins.get("bad_backups", {})
    local_copies = {did: str(bdir) for did in bad  # where save_local_record kept the originals, if it did
                    if (bdir := local_paths(home or sglpatch_home(), name, did)[1]).is_dir()}
    done = StatusReport(host=name, sglang_version=version, files=files,
                        deployments=[d for d in deployments if not is_damaged(d)],
                        journal=None if journal is None or is_damaged(journal) else journal, lock=ins.get("lock"),
                        patchset=ps_name, revision=ps_rev, damaged=damaged, older_revision=older,
                        bad_backups=bad, local_backups=local_copies, retired=sorted(retired))
    on_host = {str(d.get("id")) for d in deployments} | ({str(journal.get("id"))} if journal else set())
    done.lost_records = [{k: v for k, v in r.items() if k != "record"} for r in
                         lost_records(agent, home or sglpatch_home(), name, on_host, ins.get("files", {}))]
    return done
