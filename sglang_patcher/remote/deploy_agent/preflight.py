"""What would stop this user's push, found before anything is written: per touched file, what makes
its replacement fail — its directory (for a new file, the nearest one that exists) not writable by
this user, immutable or append-only (``chattr``) or on a read-only filesystem; the file itself
immutable or append-only (not even root may rename over it or unlink it); an owner or group this
user could not give the new file — and a state dir this user cannot write; then free disk.
``inspect`` reports the problems of every path it is asked about (``blocked``), so that the
client's plan — a dry run too — refuses on them; ``push`` checks the same again, with the same
code, before its first write. The test of a path is :mod:`access`'s, which ``hosts --check`` uses."""

from __future__ import annotations

import os

from ..access import attr_problem, dir_problem, nearest_existing, replace_problem, state_dir_problem, user_name
from .base import Fail
from .files import dir_facts, file_info

# what each kind of problem of a file's directory / of the file itself says, after "N file(s) "
_DIR_REASON = {"permission": "in a directory not writable by %(me)s",
               "immutable": "in an immutable directory (chattr +i)",
               "append_only": "in an append-only directory (chattr +a)",
               "read_only": "on a read-only filesystem"}
_FILE_REASON = {"immutable": "immutable (chattr +i)", "append_only": "append-only (chattr +a)"}


class Who:
    """The user the agent runs as: ``euid``, ``me`` (the name), ``groups``."""

    def __init__(self):
        self.euid = os.geteuid()
        self.me = user_name(self.euid)
        self.groups = set(os.getgroups()) | {os.getegid()}


def target_problems(h, rel, info, who, action="write"):
    """What stops this user from replacing (``write``) or deleting (``delete``) the file at ``rel``
    (``info``: its :func:`file_info`): ``[{"reason", "kind", "line"}]`` — ``reason`` the words that
    group files alike, ``kind`` immutable|append_only|read_only|permission|owner, ``line`` this file's
    own sentence; a problem of the directory also has ``dir`` (the one checked) and ``why``. A link
    or other non-regular file is left to the push (``not_regular``)."""
    t = h.target(rel)
    out = []
    parent = nearest_existing(os.path.dirname(t))
    problem = dir_problem(parent)
    if problem is not None:
        kind, why = problem
        out.append({"reason": _DIR_REASON[kind] % {"me": who.me}, "kind": kind, "dir": parent, "why": why,
                    "line": "%s: directory %s %s" % (rel, parent, why)})
    if not info.get("exists") or info.get("type") != "file":
        return out
    # replacing keeps the owner and group (root gives any); a deleted file keeps nothing
    problem = replace_problem(t) if action == "write" else attr_problem(t)
    if problem is None:
        return out
    kind, why = problem
    if kind != "owner":
        reason = _FILE_REASON[kind]
    elif info["uid"] != who.euid:
        reason = "owned by %s: as %s their owner cannot be kept" % (user_name(info["uid"]), who.me)
    else:
        reason = "of group %d, which %s is not in: their group cannot be kept" % (info["gid"], who.me)
    out.append({"reason": reason, "kind": kind, "line": "%s %s" % (rel, why)})
    return out


def state_problem(h, who):
    """``{"reason", "kind", "line"}`` when this user cannot write the state dir (or, while it does
    not exist, the nearest directory above it that does), else None."""
    found = state_dir_problem(h.state)
    if found is None:
        return None
    checked, kind, why = found
    return {"reason": "state dir not writable", "kind": kind,
            "line": "state dir %s (checked %s) %s" % (h.state, checked, why)}


def blocked(h, paths, infos):
    """``inspect``'s report: ``({rel: [problem]}, state dir problem or None)`` for ``paths``, each
    judged as a write (the client leaves out the owner problems of files it deletes)."""
    who = Who()
    files = {}
    for rel in paths:
        found = target_problems(h, rel, infos[rel], who)
        if found:
            files[rel] = found
    return files, state_problem(h, who)


def say(problems, shown=3):
    """One sentence per reason, naming its first files: the same reason for 20 files is one line."""
    by_reason = {}
    for rel, p in problems:
        by_reason.setdefault(p["reason"], []).append(rel)
    said = []
    for reason, rels in by_reason.items():
        rels = sorted(set(rels))
        said.append("%d file(s) %s: %s%s" % (len(rels), reason, ", ".join(rels[:shown]),
                                             " and %d more" % (len(rels) - shown) if len(rels) > shown else ""))
    return said


def problems_of(h, actions, who, infos=None):
    """``(problems, lines, kinds)`` of ``actions`` ({rel: "write"|"delete"}) and the state dir:
    ``problems`` [(rel, problem)] as :func:`target_problems` finds them, ``lines`` one sentence
    each (the state dir's last), ``kinds`` the kinds of problem (``state_dir`` for the state
    dir's) — what :func:`preflight` and :func:`refuse_blocked` refuse on. ``infos``: the files'
    :func:`file_info` where the caller has it."""
    problems = []
    for rel, action in sorted(actions.items()):
        info = infos[rel] if infos and rel in infos else file_info(h.target(rel))
        problems += [(rel, p) for p in target_problems(h, rel, info, who, action)]
    lines = [p["line"] for _rel, p in problems]
    kinds = {p["kind"] for _rel, p in problems}
    sp_problem = state_problem(h, who)
    if sp_problem is not None:
        lines.append(sp_problem["line"])
        kinds.add("state_dir")
    return problems, lines, kinds


def refuse_blocked(h, actions, what, verb="change"):
    """Before a step's first write (``rollback``'s restore): raise Fail(not_writable) when this user
    could not replace (``write``) or delete (``delete``) a file of ``actions`` ({rel: action}), or
    write the state dir — the test :func:`preflight` makes for a push. ``what`` opens the message
    ("cannot roll back deployment X"); it names each file and why (``problems``: one line per
    file and problem; ``kinds`` for the client's hint, ``files`` {rel: [problem]})."""
    who = Who()
    problems, lines, kinds = problems_of(h, actions, who)
    if not lines:
        return
    files = {}
    for rel, p in problems:
        files.setdefault(rel, []).append(p)
    said = lines if len(lines) <= 8 else say(problems) + lines[len(problems):]
    head = ("%s: %d of the %d file(s) it would %s cannot be changed by %s"
            % (what, len(files), len(actions), verb, who.me) if files
            else "%s: %s cannot write the host's state dir" % (what, who.me))
    raise Fail("not_writable", head + "; nothing was written:\n    " + "\n    ".join(said),
               problems=lines, kinds=sorted(kinds), user=who.me, files=files)


def explain_os_error(exc):
    """What the OS refused mid-way (an ``OSError`` a preflight did not foresee: a flag set since,
    a race), in words a user can act on: ``(text, kinds)`` — the operation and the OS's reason, then
    why by :mod:`access`'s test (the file immutable or append-only, its directory not writable, a
    read-only filesystem), with the kinds of problem for the client's hint."""
    what = exc.strerror or str(exc)
    src, dst = exc.filename, exc.filename2
    if src and dst:
        action = "renaming %s over %s" % (src, dst)
    elif src:
        action = "changing %s" % src
    else:
        action = "a file operation"
    paths = [p for p in (dst, src) if p]
    found = None
    for p in paths:          # the file itself first (the rename's destination), then its directory
        problem = attr_problem(p) if os.path.lexists(p) else None
        if problem is not None:
            found = (p, problem)
            break
    if found is None:
        for p in paths:
            d = nearest_existing(os.path.dirname(p))
            problem = dir_problem(d)
            if problem is not None:
                found = ("directory " + d, problem)
                break
    text = "%s was refused by the OS (%s)" % (action, what)
    if found is None:
        return text, []
    return "%s: %s %s" % (text, found[0], found[1][1]), [found[1][0]]


def preflight(h, files, payload, reserve):
    """Before the first write: every touched file replaceable (:func:`target_problems`), the state
    dir writable, free disk for the new files and the backups. Raises Fail(not_regular) for a link
    or other non-regular file, Fail(not_writable) naming each problem (``problems``: one line per
    file and problem; ``kinds``: which kinds of problem, for the client's hint), Fail(no_space)."""
    who = Who()
    need_target = 0
    need_state = 0
    infos = {}
    for rel, spec in files.items():
        t = h.target(rel)
        info = infos[rel] = file_info(t)
        if info["exists"]:
            if info["type"] != "file":
                raise Fail("not_regular", "%s is a %s, not a regular file; sglpatch replaces regular files "
                           "only" % (t, info["type"]))
            need_state += info["size"]
        if spec["action"] == "write":
            need_target += len(payload[rel])
    problems, lines, kinds = problems_of(h, {rel: spec["action"] for rel, spec in files.items()}, who, infos)
    if lines:
        said = say(problems) + lines[len(problems):]
        raise Fail("not_writable", "; ".join(said), problems=lines, kinds=sorted(kinds), user=who.me)
    st = dir_facts(h.state)
    sp = dir_facts(h.root)
    if sp["dev"] == st["dev"]:
        checks = [(sp, need_target + need_state)]
    else:
        checks = [(sp, need_target), (st, need_state)]
    for facts, need in checks:
        if facts["free_bytes"] is not None and facts["free_bytes"] - need < reserve:
            raise Fail("no_space", "%s has %d bytes free; this deployment needs %d plus a reserve of %d"
                       % (facts["checked"], facts["free_bytes"], need, reserve),
                       free_bytes=facts["free_bytes"], need_bytes=need, reserve_bytes=reserve)
