"""Apply's checks that a patchset is what it says it is, before anything reaches a host.

- Identity: a deployment is recorded as NAME rN and judged later by the catalog's hashes for that
  revision, so a copy (a directory given by path) that says NAME rN must make exactly those files.
- A finished port: a target written by ``sglpatch patchset port --partial`` lacks the changes that
  did not carry (its ``left_out`` list); it renders, but it is not the patchset's change on that
  release until a person makes them and deletes the list.
"""

from __future__ import annotations

from pathlib import Path

from .errors import ConfigError, PatchsetError, first_few
from .patchset import Patchset, available_patchsets, load_patchset

__all__ = ["check_not_an_impostor", "check_port_finished"]


def check_not_an_impostor(ps: Patchset, version: str, search: list[Path] | None = None) -> None:
    """Refuse a patchset loaded from elsewhere (a copy) that says it is ``NAME`` revision ``N`` of
    the catalog's patchset but gives other files for SGLang ``version`` than that revision does.

    A deployment is recorded as NAME rN and judged by the catalog's hashes later: an edited copy
    under the same name and revision would read as that revision while its bytes differ, and the
    real one would then call them drift. Raises :class:`PatchsetError` (exit 3) naming the
    differing files. A copy that only adds releases, or the catalog's own directories, passes.
    """
    found = available_patchsets(search).get(ps.name)
    if found is None:
        return
    home = found.resolve()
    root = ps.root.resolve()
    if root == home or root.is_relative_to(home / "history"):
        return
    catalog = load_patchset(home)
    try:
        known = catalog.at_revision(ps.revision)
    except (PatchsetError, ConfigError):
        return                                  # a revision the catalog does not have: the copy's own
    theirs = known.spec.targets.get(version)
    if theirs is None:
        return
    mine = ps.target(version).expected
    differ = sorted(p for p in set(mine) | set(theirs.expected) if mine.get(p) != theirs.expected.get(p))
    if differ:
        shown = first_few(differ, 4)
        raise PatchsetError(
            f"{ps.root}: says {ps.name} r{ps.revision}, but {ps.name} r{ps.revision} here ({home}) "
            f"makes other files for sglang {version}: {shown}",
            hint=f"a changed patchset needs its own revision (raise `revision:` above "
                 f"{catalog.revision} and freeze the old one: docs/patchsets.md) or its own name; "
                 f"deployed as {ps.name} r{ps.revision} it would read as drift to the real one")


def check_port_finished(ps: Patchset, version: str) -> None:
    """Refuse the target for SGLang ``version`` while it lists changes a partial port left out.

    Raises :class:`PatchsetError` (exit 3) naming ``patchset.yaml``, the target and each change;
    the hint says how to finish the port (docs/patchsets.md, "Finishing a port by hand").
    """
    left = ps.target(version).left_out
    if not left:
        return
    shown = first_few(left, 4, sep="; ")
    raise PatchsetError(
        f"{ps.yaml_path}: the target {version} of {ps.name} r{ps.revision} is a partial port — "
        f"{len(left)} change(s) left out: {shown}",
        hint=f"make those changes in the series by hand (docs/patchsets.md, \"Finishing a port by "
             f"hand\"), re-pin with `sglpatch patchset refresh {ps.root} --sglang {version}`, then "
             f"delete targets.{version}.left_out")
