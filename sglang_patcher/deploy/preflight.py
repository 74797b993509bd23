"""Apply's refusal of a host it could not write, before anything is written — a dry run's too.

The plan's ``inspect`` answer carries, per touched path, what would stop the host's user from
replacing it (``blocked``: the deploy agent's ``preflight`` test, the same its ``push`` makes again
before its first write, built on :mod:`sglang_patcher.remote.access`, the test ``hosts --check``
reports by): the file immutable or append-only (``chattr +i`` / ``+a``: not even root may replace
it), its directory not writable by the user, immutable or on a read-only filesystem, an owner or
group the user could not keep; and ``state_blocked``, a state dir it cannot write. Only the files
the plan would write or delete count (a file already as wanted is not touched).
"""

from __future__ import annotations

from typing import Any

from ..errors import first_few
from ..remote.agent_client import AgentError, not_writable_hint
from .results import DeployPlan

# listed one per line up to this many problems; beyond, one line per reason naming its first files
_EACH = 8
_SHOWN = 5


def refuse_unwritable(name: str, plan: DeployPlan, inspect: dict[str, Any]) -> None:
    """Raise :class:`AgentError` (a DeployError, exit 8; ``kind`` ``not_writable``, ``details``:
    ``problems`` — one line per file and problem —, ``files`` {path: [problem]}, ``kinds``) naming
    the host, each file the plan would write or delete that the host's user cannot replace and why,
    and what to do; return when there is none."""
    if not plan.to_push:
        return   # nothing to write: a no-op apply needs no write permission
    refuse_blocked(name, f"cannot apply {plan.patchset} r{plan.revision}", "write",
                   {path: fp.action for path, fp in plan.to_push.items()}, inspect)


def refuse_blocked(name: str, what: str, verb: str, actions: dict[str, str], inspect: dict[str, Any]) -> None:
    """The refusal of a step that would write (``write``) or delete (``delete``) the files of
    ``actions`` ({path: action}) on host ``name``, judged by ``inspect``'s ``blocked`` and
    ``state_blocked``: :class:`AgentError` (exit 8, ``not_writable``) whose message opens with
    "NAME: WHAT: " and says "nothing was written"; return when nothing stops the step."""
    blocked = inspect.get("blocked") or {}
    found: dict[str, list[dict[str, Any]]] = {}
    for path, action in sorted(actions.items()):
        problems = [p for p in blocked.get(path, ())
                    if not (action == "delete" and p.get("kind") == "owner")]   # a deleted file keeps no owner
        if problems:
            found[path] = problems
    state = inspect.get("state_blocked")
    if not found and not state:
        return
    user = inspect.get("user") or "the login user"
    lines = [p["line"] for ps in found.values() for p in ps]
    said = list(lines) if len(lines) <= _EACH else _grouped(found, inspect.get("site_packages"))
    kinds = sorted({p["kind"] for ps in found.values() for p in ps} | ({"state_dir"} if state else set()))
    if state:
        lines.append(state["line"])
        said.append(state["line"])
    head = (f"{name}: {what}: "
            + (f"{len(found)} of the {len(actions)} file(s) it would {verb} cannot be replaced by {user}"
               if found else f"{user} cannot write the host's state dir")
            + "; nothing was written")
    raise AgentError(head + ":\n    " + "\n    ".join(said), kind="not_writable",
                     details={"problems": lines, "files": found, "kinds": kinds, "user": user},
                     hint=not_writable_hint(kinds, user))


def _grouped(found: dict[str, list[dict[str, Any]]], site: str | None) -> list[str]:
    """One line per reason: how many files, the directories behind a directory's problem (with why,
    when one), the first files — the same reason for 25 files is one line, not 25."""
    by_reason: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path, ps in found.items():
        for p in ps:
            by_reason.setdefault(p["reason"], []).append((path, p))
    out = []
    for reason, hits in by_reason.items():
        paths = sorted({path for path, _p in hits})
        dirs = sorted({(p["dir"], p.get("why", "")) for _path, p in hits if p.get("dir")})
        where = ""
        if len(dirs) == 1:
            where = f" ({dirs[0][0]} {dirs[0][1]})"
        elif dirs:
            rel = [d if not site or not d.startswith(site.rstrip("/") + "/") else d[len(site.rstrip("/")) + 1:]
                   for d, _why in dirs]
            where = f" ({first_few(rel, 2, noun='directories')})"
        out.append(f"{len(paths)} file(s) {reason}{where}: {first_few(paths, _SHOWN)}")
    return out
