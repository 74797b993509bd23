"""What the client reads before it acts: the live facts of the touched files (``inspect``: with
``blocked``, what would stop this user from replacing each, and ``state_blocked``, from writing the
state dir — :mod:`preflight`'s test, which ``push`` makes again) and the host's deployment history
(``history``). Reads only."""

from __future__ import annotations

import os
import socket

from ..access import user_name
from .backup import bad_backups
from .base import ACTIVE_PHASES, check_id
from .files import dir_facts, file_info
from .host import HostState
from .preflight import blocked


def op_inspect(a):
    h = HostState(a)
    files = {p: file_info(h.target(p)) for p in a.get("paths", [])}
    blocked_files, state_blocked = blocked(h, list(files), files)
    temps = []
    for p in a.get("paths", []):
        d = os.path.dirname(h.target(p))
        base = "." + os.path.basename(h.target(p)) + ".sglpatch-"
        try:
            temps += [os.path.join(d, e) for e in os.listdir(d) if e.startswith(base)]
        except OSError:
            pass
    dirs = sorted({os.path.dirname(h.target(p)) for p in a.get("paths", [])})
    records = h.records()
    out = {}
    if a.get("backups"):  # status: the backups a rollback of each active deployment would need
        out["bad_backups"] = {}
        for r in records:
            if r.get("phase") not in ACTIVE_PHASES:
                continue
            try:
                bad = bad_backups(h, check_id(r.get("id")), r["files"])
            except Exception:  # a damaged record: the host side reports it as damaged
                continue
            if bad:
                out["bad_backups"][r["id"]] = bad
    return {"files": files, "blocked": blocked_files, "state_blocked": state_blocked,
            "lock": h.read_lock(), "journal": h.journal(), "deployments": records, **out,
            "space": {"site_packages": dir_facts(h.root), "state_dir": dir_facts(h.state)},
            "dirs": {d: dir_facts(d) for d in dirs},
            "site_packages": h.root, "state_dir": h.state, "euid": os.geteuid(),
            "user": user_name(os.geteuid()), "hostname": socket.gethostname(), "temps": temps}


def op_history(a):
    h = HostState(a)
    return {"deployments": h.records(), "journal": h.journal(), "lock": h.read_lock()}
