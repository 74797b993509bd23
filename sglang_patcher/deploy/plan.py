"""The apply plan: what applying a patchset to a host would do, decided by hashes. Writes nothing.

The patchset's view of a release (:func:`patchset_view`: the paths it or an earlier revision
touches, their pristine, expected and earlier revisions' sha256) meets the host's live hashes (one
agent ``inspect``). The patchset is rendered against pristine bytes (:mod:`.pristine`), and each
file's state is decided by hashes only: live == expected → patched; == pristine → pristine;
== ``history[r]`` → older (patched at revision r); else drifted. The plan's :class:`DeployPlan`
says what the push would write or delete (``to_push``) and which kind of apply it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from ..discovery import HostInfo
from ..errors import DeployError, PatchsetError, SglpatchError
from ..inventory import Host
from ..mirror import Mirror
from ..patchset import Patchset, load_patchset
from ..remote.agent_client import AgentClient
from ..state import sglpatch_home
from ..transport.base import Transport
from .agent import agent_for, host_name
from .pristine import HostBackups, LocalBackups, PristineSource, Reader, reader_of, sha256_or_none, wheel_reader
from .records import ACTIVE
from .results import DeployPlan, FilePlan


class PatchsetView(NamedTuple):
    """What a patchset says about one release: ``paths`` = every file this revision or an earlier
    one touches; ``pristine[path]`` the release's sha256 (None: absent in the release) — for a path
    only an earlier revision touched, the installed distribution's RECORD hash (the trust anchor),
    else None (a file that revision created); ``expected[path]`` this revision's sha256;
    ``history[r][path]`` revision r's (earlier revisions only)."""

    paths: set[str]
    pristine: dict[str, str | None]
    expected: dict[str, str | None]
    history: dict[int, dict[str, str | None]]


def record_hashes(info: HostInfo) -> dict[str, str | None]:
    """The installed distribution's RECORD: ``{path: sha256 | None}``."""
    return dict(info.record or {})


def history_for(patchset: Patchset, version: str) -> dict[int, dict[str, str | None]]:
    """``{revision: {path: sha256 | None}}`` of the revisions in ``patchset``'s history for ``version``."""
    return {int(rev): dict(per_version[version] or {})
            for rev, per_version in patchset.spec.history.items() if version in per_version}


def patchset_view(patchset: Patchset, version: str, info: HostInfo) -> PatchsetView:
    """The :class:`PatchsetView` of ``patchset`` for ``version`` on the host ``info`` describes.
    Raises UnsupportedVersionError (listing the supported releases)."""
    target = patchset.target(version)
    pristine_h: dict[str, str | None] = dict(target.pristine)
    expected_h: dict[str, str | None] = dict(target.expected)
    for dst in target.new_files:
        pristine_h.setdefault(dst, None)
    history = {r: h for r, h in history_for(patchset, version).items() if r != int(patchset.revision)}
    record_h = record_hashes(info)
    paths = set(pristine_h) | set(expected_h)
    for h in history.values():
        paths |= set(h)
    for p in paths - set(pristine_h):
        pristine_h[p] = record_h.get(p)
    return PatchsetView(paths, pristine_h, expected_h, history)


def patchset_arg(patchset: Patchset) -> str:
    """How to name ``patchset`` on the command line so that it loads again: its name (the current
    revision), ``NAME@REV`` (an earlier one), or its directory (a patchset given as a path)."""
    def same(other: Patchset) -> bool:
        return other.root.resolve() == patchset.root.resolve()
    try:
        current = load_patchset(patchset.name)
        if same(current):
            return patchset.name
        if same(current.at_revision(int(patchset.revision))):
            return f"{patchset.name}@{patchset.revision}"
    except SglpatchError:
        pass
    return str(patchset.root)


def refuse_downgrade(name: str, answer: dict[str, Any], patchset: Patchset) -> None:
    """A host carrying a newer revision of the same patchset is not drift: say how to go back."""
    newer = [d for d in answer.get("deployments", [])
             if d.get("phase") in ACTIVE and d.get("patchset") == patchset.name
             and int(d.get("revision") or 0) > int(patchset.revision)]
    if newer:
        top = max(newer, key=lambda d: int(d.get("revision") or 0))
        raise DeployError(
            f"{name}: carries {patchset.name} r{top.get('revision')} (deployment {top['id']}), newer "
            f"than the r{patchset.revision} asked for; a downgrade is a rollback",
            hint=f"`sglpatch rollback --host {name}` returns to the state before r{top.get('revision')} "
                 f"(the earlier revision if it was deployed before, else pristine)")


def plan_apply(transport: Transport, host: Host, info: HostInfo, patchset: Patchset, *,
               pristine: Mirror | Reader | None = None,
               agent: AgentClient | None = None, inspect: dict[str, Any] | None = None,
               home: Path | None = None) -> DeployPlan:
    """Decide, by hashes, what applying ``patchset`` to ``host`` would do. Writes nothing.

    ``pristine``: a reader of pristine bytes (a Mirror, or ``read(path) -> bytes | None``); the
    wheel cache, local backups and the host's backups are the fallbacks. ``inspect``: a fresh
    agent ``inspect`` answer to reuse (else one round trip). Raises UnsupportedVersionError,
    DeployError (the host carries a newer revision: a downgrade is a rollback), StateError (no
    pristine copy), ApplyError/PatchsetError (the series does not apply), PatchsetError (the
    rendered bytes do not match the patchset's expected sha256).
    """
    home = home or sglpatch_home()
    name = host_name(host, transport)
    version = str(info.sglang_version)
    paths, pristine_h, expected_h, history = patchset_view(patchset, version, info)
    agent = agent or agent_for(transport, host, info)
    if inspect is None:
        inspect = agent.inspect(sorted(paths))
    refuse_downgrade(name, inspect, patchset)  # a newer revision there is no drift (diff says so too)
    readers: list[tuple[str, Reader]] = []
    r = reader_of(pristine)
    if r is not None:
        readers.append(("mirror", r))
    readers.append(("local backups", LocalBackups(home, name, pristine_h)))
    readers.append(("host backups", HostBackups(agent, list(reversed(inspect.get("deployments", []))),
                                                pristine_h)))
    readers.append((f"wheel sglang=={version}", wheel_reader(version, home)))
    # paths only an earlier revision touched go back to pristine; None = absent in the release
    src = PristineSource({p: pristine_h.get(p) for p in paths}, readers)
    result = patchset.render(version, src.read)
    desired: dict[str, tuple[bytes | None, int | None]] = {}
    for p in paths:
        if p in result.files:
            ch = result.files[p]
            desired[p] = (ch.new, ch.new_mode)
        else:
            desired[p] = (src.read(p), None)  # back to pristine (an earlier revision touched it)
    for p, ch in result.files.items():
        if p not in desired:
            raise PatchsetError(f"the series touches {p}, which patchset.yaml does not list",
                                hint="add its pristine and expected sha256 to patchset.yaml")
    rendered = {p: sha256_or_none(desired[p][0]) for p in expected_h}
    stale = {p: (rendered[p], expected_h[p]) for p in expected_h if rendered[p] != expected_h[p]}
    if stale:
        raise PatchsetError(
            f"patchset {patchset.name} r{patchset.revision}: the rendered result does not match the expected "
            f"sha256 in patchset.yaml for " + ", ".join(f"{p} (rendered {a and a[:12]}, listed {b and b[:12]})"
                                                       for p, (a, b) in sorted(stale.items())),
            hint="regenerate the expected hashes of the patchset")
    files: dict[str, FilePlan] = {}
    contents: dict[str, bytes] = {}
    live_files = inspect.get("files", {})
    for p in sorted(paths):
        li = live_files.get(p, {"sha256": None})
        live = li.get("sha256") if li.get("exists", li.get("sha256") is not None) else None
        want, mode = desired[p]
        exp = sha256_or_none(want)
        fp = FilePlan(path=p, state="drifted", live=live, pristine=pristine_h.get(p), expected=exp,
                      live_mode=li.get("mode"), owner=None if li.get("uid") is None else f"{li.get('uid')}:{li.get('gid')}")
        # a path only an earlier revision touched, already as the release has it: nothing to do
        at_rest = live == exp and p not in expected_h and live == pristine_h.get(p)
        if at_rest:
            fp.state = "pristine"
        elif live == exp and (mode is None or li.get("mode") == mode):
            fp.state, fp.found_revision = "patched", int(patchset.revision)
        elif live == exp:
            fp.state, fp.found_revision = "patched", int(patchset.revision)  # mode differs: rewrite it
            fp.action, fp.mode = "write", mode
        elif live == pristine_h.get(p):
            fp.state = "pristine"
        else:
            for rev in sorted(history, reverse=True):
                if p in history[rev] and history[rev][p] == live:
                    fp.state, fp.found_revision = "older", rev
                    break
        if fp.state in ("pristine", "older", "drifted") and not at_rest:
            fp.action = "write" if want is not None else "delete"
            fp.mode = mode
        if fp.action == "write":
            contents[p] = want  # type: ignore[assignment]
        files[p] = fp
    return DeployPlan(host=name, patchset=str(patchset.name), revision=int(patchset.revision),
                      sglang_version=version, files=files, contents=contents, diff=result.diff_text(),
                      inspect=inspect, pristine_sources=dict(src.used),
                      pristine_bytes=src.read_so_far, result=result, patchset_arg=patchset_arg(patchset))


def allowed_hashes(fp: FilePlan, history: dict[int, dict[str, str | None]]) -> list[str | None]:
    """Live hashes the agent accepts for ``fp`` (None = absent): pristine, this revision's, earlier ones'."""
    allowed = {fp.pristine, fp.expected}
    for h in history.values():
        if fp.path in h:
            allowed.add(h[fp.path])
    return sorted(allowed, key=lambda x: "" if x is None else x)
