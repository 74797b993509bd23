"""Patchsets: ``patchsets/<name>/patchset.yaml``, its loader, rendering and hash-based file states.

Format (pydantic-validated; unknown keys are refused so typos surface)::

    name: ddtree
    revision: 2
    description: ...
    features:                                 # optional: what revisions can do (FEATURES), each
      budget_schedule: 2                      #   from the first revision that does it on
    targets:
      "0.5.23":                               # exact SGLang release (quote it)
        series: [sglang-0.5.23/0001-x.patch]  # unified diffs, applied in order, strictly (applier.py)
        new_files:                            # whole new files; the source is relative to the patchset
          sglang/srt/speculative/ddtree_x.py: modules/ddtree_x.py   # (shared by all targets: one copy)
        pristine:  {path: sha256 | null}      # every touched file in the release (null: absent)
        expected:  {path: sha256 | null}      # every touched file after this revision (null: deleted)
        left_out: [change, ...]               # only a `port --partial` target: the changes that did not
                                              #   carry; apply refuses the target until a person makes
                                              #   them by hand and deletes this key
    checks:
      l1: checks/l1_ddtree.py                 # optional L1 script, relative to the patchset
    withdrawn:                                # optional: earlier revisions hosts must not keep
      2: "why, and what to do"                #   (status warns on hosts that carry them)
    history:                                  # expected hashes of earlier revisions
      "1": {"0.5.23": {path: sha256 | null}}

Features: capabilities sglpatch asks of the revision deployed on a host instead of naming a
patchset and a revision (``bench --sweep`` writes a budget schedule where the revision has
``budget_schedule``, with ``BATCH:chain`` entries where it has ``budget_schedule_chain``); the
names are those of :data:`FEATURES` (another is refused, so a typo surfaces). Each is on from the
revision given onwards. Like ``withdrawn`` and ``history`` the map speaks for earlier
revisions too, so it is read from the newest revision (frozen copies in ``history/`` predate the key
and are never edited): ``load_patchset(name).features_at(deployed_revision)``.

Paths in ``targets`` are site-packages-relative posix; sha256 is lowercase hex. ``pristine`` may omit
files the patchset creates (absent is their pristine state); ``refresh_hashes`` writes them as null.

Earlier revisions: revision N-1 of a patchset is kept as a complete frozen copy of the patchset
directory (its own ``patchset.yaml`` with ``revision: N-1``, its series and modules) under
``patchsets/<name>/history/r<N-1>/``. ``load_patchset("ddtree@1")`` loads it; ``history`` in the
current ``patchset.yaml`` holds those revisions' expected hashes so that ``classify`` recognises a
host carrying an older revision without loading anything else.

Lookup of a name: ``./patchsets/<name>/`` (the working directory), then the installed ``patchsets``
package (shipped as package data). A path (anything with a ``/`` or an existing directory or
``patchset.yaml`` file) is loaded as is.

Maintainer step after changing a series: ``sglpatch patchset refresh DIR --sglang VERSION``
recomputes ``pristine``/``expected`` for VERSION from the PyPI wheel (``wheelcache``) and rewrites only
those two mappings in ``patchset.yaml`` (comments and the rest of the file are kept);
``add_target`` adds a whole target (series, new_files) after the last one and pins it the same way
(``sglpatch patchset port`` writes a ported target with it). Both live in :mod:`.patchset_write`.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .applier import ApplyResult, FileChange, HunkReport, apply_series
from .errors import ConfigError, PatchsetError, SglpatchError, UnsupportedVersionError
from .manifest import sha256_bytes

__all__ = ["Target", "Checks", "PatchsetSpec", "Patchset", "load_patchset", "withdrawn_warning", "available_patchsets",
           "default_search_path", "FILE_STATES", "FEATURES",
           "BUDGET_SCHEDULE", "BUDGET_SCHEDULE_CHAIN", "BUDGET_AUTO", "BUDGET_SCHEDULE_GRAPHS",
           "BUDGET_AUTO_DEFAULT"]

Reader = Callable[[str], "bytes | None"]

FILE_STATES = ("pristine", "patched", "patched@r<N>", "drifted", "absent")

BUDGET_SCHEDULE = "budget_schedule"
BUDGET_SCHEDULE_CHAIN = "budget_schedule_chain"
BUDGET_AUTO = "budget_auto"
BUDGET_SCHEDULE_GRAPHS = "budget_schedule_graphs"
BUDGET_AUTO_DEFAULT = "budget_auto_default"
#: The capabilities sglpatch asks a deployed revision about (``features:`` in patchset.yaml).
FEATURES = {
    BUDGET_SCHEDULE: "DDTREE takes a budget by running batch size (--speculative-ddtree-budget-schedule)",
    BUDGET_SCHEDULE_CHAIN: "that schedule's BATCH:chain entries run DFlash's own decode step",
    BUDGET_AUTO: "the schedule 'auto': the worker chooses each step's budget from its own measurements",
    BUDGET_SCHEDULE_GRAPHS: "several verify widths beside the target's CUDA graphs (the captured width "
                            "replays, the others verify eagerly)",
    BUDGET_AUTO_DEFAULT: "an unset schedule means auto; the schedule 'fixed' keeps every step at the "
                         "server's budget",
}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_YAML = "patchset.yaml"


def _check_rel(path: str, what: str) -> str:
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or "\\" in path or str(p) != path.rstrip("/"):
        raise ValueError(f"{what} {path!r} must be a relative posix path without '..' or './'")
    return path


def _check_site_path(path: str, what: str) -> str:
    """A site-packages path a patchset may touch: inside the ``sglang`` package (not another
    package, a top-level module or a ``.pth`` file, which would run at every interpreter start)."""
    _check_rel(path, what)
    if PurePosixPath(path).parts[0] != "sglang" or path.rstrip("/") == "sglang":
        raise ValueError(f"{what} {path!r} is outside the sglang package: a patchset may only change "
                         "or add files under sglang/ (site-packages-relative)")
    return path


def _check_hashes(value: dict[str, str | None]) -> dict[str, str | None]:
    for path, sha in value.items():
        _check_site_path(path, "path")
        if sha is not None and not _SHA.match(sha):
            raise ValueError(f"{path}: {sha!r} is not a lowercase hex sha256 (64 characters) or null")
    return value


def _sha(value: str) -> str:
    if not _SHA.match(value):
        raise ValueError(f"{value!r} is not a lowercase hex sha256 (64 characters) or null")
    return value


Sha = Annotated[str, AfterValidator(_sha)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Target(_Model):
    """One SGLang release: the ordered ``series``, ``new_files`` {site-packages path: patchset path},
    and the ``pristine``/``expected`` sha256 of every touched file (None: absent)."""

    series: list[str] = Field(default_factory=list)
    new_files: dict[str, str] = Field(default_factory=dict)
    pristine: dict[str, Sha | None] = Field(default_factory=dict)
    expected: dict[str, Sha | None] = Field(default_factory=dict)
    # a `sglpatch patchset port --partial` target: the changes that did not carry (hunk labels);
    # apply refuses the target while any are listed (patchset_identity.check_port_finished)
    left_out: list[str] = Field(default_factory=list)

    @field_validator("series")
    @classmethod
    def _series(cls, v: list[str]) -> list[str]:
        for s in v:
            _check_rel(s, "series file")
        if len(set(v)) != len(v):
            raise ValueError("a series file is listed twice")
        return v

    @field_validator("new_files")
    @classmethod
    def _new_files(cls, v: dict[str, str]) -> dict[str, str]:
        for dst, src in v.items():
            _check_site_path(dst, "new file")
            _check_rel(src, "new file source")
        return v

    @field_validator("pristine", "expected")
    @classmethod
    def _hashes(cls, v: dict[str, str | None]) -> dict[str, str | None]:
        return _check_hashes(v)


class Checks(_Model):
    """Smoke-check scripts shipped with the patchset (paths relative to it)."""

    l1: str | None = None

    @field_validator("l1")
    @classmethod
    def _l1(cls, v: str | None) -> str | None:
        return None if v is None else _check_rel(v, "check script")


def _same_release(a: str, b: str) -> bool:
    """Whether two version strings name one release under PEP 440 (0.5.23 = 0.5.23.0 = v0.5.23)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return False


class PatchsetSpec(_Model):
    """The content of ``patchset.yaml`` (see the module docstring)."""

    name: str
    revision: int = Field(ge=1)
    description: str = ""
    targets: dict[str, Target] = Field(min_length=1)
    checks: Checks = Field(default_factory=Checks)
    history: dict[int, dict[str, dict[str, Sha | None]]] = Field(default_factory=dict)
    # earlier revisions a host must not keep, and why (shown by ``status`` on hosts carrying them)
    withdrawn: dict[int, str] = Field(default_factory=dict)
    # what revisions can do: {feature: the first revision that does it} (see the module docstring)
    features: dict[str, int] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r}: use letters, digits, '.', '_' and '-'")
        return v

    @field_validator("history")
    @classmethod
    def _history(cls, v: dict[int, dict[str, dict[str, str | None]]]) -> dict:
        for rev, per_version in v.items():
            if rev < 1:
                raise ValueError(f"history revision {rev} must be >= 1")
            for hashes in per_version.values():
                _check_hashes(hashes)
        return v

    @field_validator("features")
    @classmethod
    def _features(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown feature(s) {', '.join(unknown)}: sglpatch knows {', '.join(sorted(FEATURES))}")
        return v

    @model_validator(mode="after")
    def _withdrawn_are_earlier(self) -> "PatchsetSpec":
        bad = sorted(r for r in self.withdrawn if not 1 <= r < self.revision)
        if bad:
            raise ValueError(f"withdrawn revisions {bad} must be earlier revisions (1..{self.revision - 1})")
        return self

    @model_validator(mode="after")
    def _features_are_of_known_revisions(self) -> "PatchsetSpec":
        bad = sorted(f"{f}: {r}" for f, r in self.features.items() if not 1 <= r <= self.revision)
        if bad:
            raise ValueError(f"features {', '.join(bad)}: a feature's revision (the first that has it) must be "
                             f"one of 1..{self.revision}")
        return self


_MISSING = object()


@dataclass
class Patchset:
    """A loaded patchset: its ``spec`` and the directory ``root`` that holds ``patchset.yaml``."""

    spec: PatchsetSpec
    root: Path
    _history_cache: dict[int, "Patchset"] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def revision(self) -> int:
        return self.spec.revision

    @property
    def description(self) -> str:
        return self.spec.description

    @property
    def versions(self) -> list[str]:
        """The SGLang versions this revision supports, sorted."""
        return sorted(self.spec.targets, key=_version_key)

    def features_at(self, revision: int | None = None) -> frozenset[str]:
        """The features ``revision`` (default: this one) has by this patchset's ``features`` map:
        those whose first revision is ``revision`` or earlier. Ask the newest revision of a
        patchset (``load_patchset(name)``): a frozen earlier copy may predate the map and say
        nothing (an empty set) about what it can do."""
        at = self.revision if revision is None else revision
        return frozenset(f for f, first in self.spec.features.items() if first <= at)

    @property
    def yaml_path(self) -> Path:
        return self.root / _YAML

    @property
    def l1_check(self) -> Path | None:
        """Absolute path of the L1 check script, or None."""
        return self.root / self.spec.checks.l1 if self.spec.checks.l1 else None

    def target(self, version: str) -> Target:
        """The target for SGLang ``version``; raises :class:`UnsupportedVersionError` listing the supported."""
        try:
            return self.spec.targets[version]
        except KeyError:
            same = [v for v in self.versions if _same_release(v, version)]
            raise UnsupportedVersionError(
                f"patchset {self.name} r{self.revision} does not support sglang {version}; "
                f"supported: {', '.join(self.versions)}",
                hint=(f"{version!r} names release {same[0]}: write it as {same[0]}" if same else
                      "install a supported SGLang release, or port the patchset (a reviewed step)")) from None

    def series(self, version: str) -> list[tuple[str, str]]:
        """``(source label, patch text)`` of the target's series, in order. Label: ``<name> r<N> <file>``."""
        out = []
        for rel in self.target(version).series:
            path = self.root / rel
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise PatchsetError(f"patchset {self.name}: series file {path} cannot be read ({exc.strerror})",
                                    hint=f"restore it or remove it from targets.{version}.series") from exc
            out.append((f"{self.name} r{self.revision} {rel}", data.decode("utf-8", "surrogateescape")))
        return out

    def touched_paths(self, version: str) -> list[str]:
        """Every path this revision touches for ``version`` (hash maps and new files), sorted."""
        t = self.target(version)
        return sorted(set(t.pristine) | set(t.expected) | set(t.new_files))

    # --------------------------------------------------------------------------------- rendering

    def render(self, version: str, read: Reader, *, check_hashes: bool = True) -> ApplyResult:
        """Apply this revision to the release tree that ``read`` serves (site-packages paths → bytes).

        Steps: every file in ``pristine`` must hash as listed (else :class:`PatchsetError`: "file X is
        not the <version> release file this patchset was made for"); the series is applied strictly
        (:class:`ApplyError` on any hunk); ``new_files`` are added (one copy each, mode 0o644); every
        touched file must have a pristine entry and hash as ``expected`` afterwards (else
        :class:`PatchsetError`: the manifest is stale, run refresh). ``check_hashes=False`` skips the
        hash checks (used by :func:`refresh_hashes`). Raises :class:`UnsupportedVersionError` for an
        unknown version. Returns the :class:`ApplyResult` (files with old/new bytes, hunk reports).
        """
        t = self.target(version)
        cache: dict[str, bytes | None] = {}

        def cached(path: str) -> bytes | None:
            if path not in cache:
                cache[path] = read(path)
            return cache[path]

        if check_hashes:
            self._check_pristine(version, t, cached)
        result = apply_series(self.series(version), cached)
        for dst, src in sorted(t.new_files.items()):
            if dst in result.files:
                raise PatchsetError(f"patchset {self.name}: {dst} is both a new file (from {src}) and "
                                    f"touched by the series for sglang {version}",
                                    hint="keep one of them")
            content = self._module_bytes(src)
            live = cached(dst)
            if live is not None and live != content:
                raise PatchsetError(f"patchset {self.name}: new file {dst} already exists in the sglang "
                                    f"{version} tree with other content",
                                    hint="the release has its own file there; rename the module or port the patchset")
            result.files[dst] = FileChange(dst, live, content, None, 0o644)
            result.hunks.append(HunkReport(f"{self.name} r{self.revision} {src}", dst, 0, f"new file from {src}",
                                           "already_applied" if live == content else "applied"))
        if check_hashes:
            self._check_expected(version, t, result)
        return result

    def _module_bytes(self, src: str) -> bytes:
        path = self.root / src
        try:
            return path.read_bytes()
        except OSError as exc:
            raise PatchsetError(f"patchset {self.name}: new file source {path} cannot be read ({exc.strerror})") from exc

    def _check_pristine(self, version: str, t: Target, read: Reader) -> None:
        bad = []
        for path, want in sorted(t.pristine.items()):
            data = read(path)
            have = None if data is None else sha256_bytes(data)
            if have != want:
                bad.append((path, f"sha256 {_short(have)}, made for {_short(want)}"))
        if bad:
            if len(bad) == 1:
                what = (f"file {bad[0][0]} is not the sglang {version} release file this patchset was made for "
                        f"({bad[0][1]})")
            else:
                what = (f"{len(bad)} files are not the sglang {version} release files this patchset was made "
                        f"for:\n    " + "\n    ".join(f"{p}: {d}" for p, d in bad))
            raise PatchsetError(
                f"patchset {self.name} r{self.revision}: {what}",
                hint="apply to an unmodified release tree (roll back local edits, or use the PyPI wheel: "
                     f"sglpatch diff {self.name} --sglang {version}); if that one is refused too, the "
                     f"patchset's pins are wrong: `sglpatch patchset refresh {self.root} --sglang {version}` "
                     f"re-pins them from the wheel")

    def _check_expected(self, version: str, t: Target, result: ApplyResult) -> None:
        problems = []
        for path, change in sorted(result.files.items()):
            if path not in t.pristine and change.old is not None:
                problems.append(f"{path}: touched but has no pristine hash")
            got = None if change.new is None else sha256_bytes(change.new)
            want = t.expected.get(path, _MISSING)
            if want is _MISSING:
                problems.append(f"{path}: touched but has no expected hash")
            elif want != got:
                problems.append(f"{path}: renders to {_short(got)}, expected {_short(want)}")
        for path in sorted(set(t.expected) - set(result.files)):
            problems.append(f"{path}: has an expected hash but the series does not touch it")
        if problems:
            hint = (f"if the series changed on purpose, refresh the hashes: "
                    f"sglpatch patchset refresh {self.root} --sglang {version}")
            home = available_patchsets().get(self.name)
            if home is not None and home.resolve() != self.root.resolve() \
                    and not self.root.resolve().is_relative_to(home.resolve() / "history"):
                # an edited copy of a catalog patchset: refreshing alone would meet the next refusal
                hint += (f"; this is a copy of the catalog's {self.name} ({home}): give the changed copy its "
                         f"own revision (above the catalog's) or name too, or apply refuses it as "
                         f"{self.name} r{self.revision} (docs/patchsets.md)")
            raise PatchsetError(
                f"patchset {self.name} r{self.revision}: patchset.yaml is stale for sglang {version} "
                f"(its hashes do not describe what the series renders):\n    " + "\n    ".join(problems),
                hint=hint)

    # --------------------------------------------------------------------------------- states

    def history_revisions(self) -> list[int]:
        """Revisions kept as frozen directories under ``history/r<N>/``, sorted."""
        base = self.root / "history"
        revs = []
        if base.is_dir():
            for d in base.iterdir():
                if d.name.startswith("r") and d.name[1:].isdigit() and (d / _YAML).is_file():
                    revs.append(int(d.name[1:]))
        return sorted(revs)

    def at_revision(self, revision: int) -> "Patchset":
        """This patchset at an earlier ``revision`` (from ``history/r<N>/``); this one if it is current."""
        if revision == self.revision:
            return self
        if revision not in self._history_cache:
            d = self.root / "history" / f"r{revision}"
            if not (d / _YAML).is_file():
                known = sorted(set(self.history_revisions()) | {self.revision})
                raise PatchsetError(f"patchset {self.name} has no revision {revision} "
                                    f"(available: {', '.join(f'{self.name}@{r}' for r in known)})",
                                    hint=f"earlier revisions live in {self.root / 'history'}/r<N>/")
            ps = _load_dir(d, origin=f"{self.name}@{revision}")
            if ps.name != self.name or ps.revision != revision:
                raise ConfigError(f"{d / _YAML}: says {ps.name} r{ps.revision}, expected {self.name} r{revision}",
                                  hint="a frozen history directory must keep its own name and revision")
            self._history_cache[revision] = ps
        return self._history_cache[revision]

    def _pristine_of(self, version: str, path: str) -> Any:
        t = self.spec.targets.get(version)
        if t is not None:
            if path in t.pristine:
                return t.pristine[path]
            if path in t.new_files or path in t.expected:
                return None         # created by this revision: absent in the release
        for rev in reversed(self.history_revisions()):
            old = self.at_revision(rev).spec.targets.get(version)
            if old is not None:
                if path in old.pristine:
                    return old.pristine[path]
                if path in old.new_files or path in old.expected:
                    return None
        return _MISSING

    def classify(self, path: str, live_sha256: str | None, *, version: str) -> str:
        """State of one file on a host, by hashes only.

        ``live_sha256`` is the host file's hex sha256, or None when it is absent. Returns
        ``pristine`` (live == the release's; for a file this patchset creates, absent), ``patched``
        (== this revision's expected), ``patched@r<N>`` (== an earlier revision's expected, from
        ``history``), ``absent`` (missing but it should exist) or ``drifted`` (anything else).
        Raises :class:`UnsupportedVersionError` for an unsupported ``version`` and
        :class:`PatchsetError` for a path no revision of this patchset touches.
        """
        t = self.target(version)
        pristine = self._pristine_of(version, path)
        expected = t.expected.get(path, _MISSING)
        if expected is _MISSING and path in t.new_files:
            expected = sha256_bytes(self._module_bytes(t.new_files[path]))
        history = {rev: per[version][path] for rev, per in self.spec.history.items()
                   if version in per and path in per[version]}
        if pristine is _MISSING and expected is _MISSING and not history:
            raise PatchsetError(f"{path} is not touched by patchset {self.name} (any revision) for sglang {version}")
        if pristine is not _MISSING and live_sha256 == pristine:
            return "pristine"
        if expected is not _MISSING and live_sha256 == expected:
            return "patched"
        for rev in sorted(history, reverse=True):
            if history[rev] == live_sha256:
                return f"patched@r{rev}"
        return "absent" if live_sha256 is None else "drifted"


def _short(sha: Any) -> str:
    if sha is None:
        return "(absent)"
    if sha is _MISSING:
        return "(none)"
    return str(sha)[:12]


def _version_key(v: str) -> tuple:
    try:
        from packaging.version import Version
        return (0, Version(v))
    except Exception:
        return (1, v)


# ------------------------------------------------------------------------------------- loading


def default_search_path() -> list[Path]:
    """Where names are looked up: ``./patchsets``, then the installed ``patchsets`` package dirs."""
    dirs = [Path.cwd() / "patchsets"]
    try:
        spec = importlib.util.find_spec("patchsets")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        dirs += [Path(p) for p in spec.submodule_search_locations]
    seen, out = set(), []
    for d in dirs:
        if not d.is_dir():   # e.g. an editable install's path-hook placeholder
            continue
        key = d.resolve()
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def available_patchsets(search: list[Path] | None = None) -> dict[str, Path]:
    """``{name: directory}`` of every patchset found on the search path (first one wins)."""
    found: dict[str, Path] = {}
    for base in search if search is not None else default_search_path():
        if not base.is_dir():
            continue
        for d in sorted(base.iterdir()):
            if (d / _YAML).is_file() and d.name not in found:
                found[d.name] = d
    return found


def load_patchset(name_or_path: str | os.PathLike, *, search: list[Path] | None = None) -> Patchset:
    """Load a patchset by name (``ddtree``, ``ddtree@1`` for revision 1) or by path.

    A name is looked up in ``search`` (default :func:`default_search_path`). Raises
    :class:`PatchsetError` for an unknown patchset (listing the available ones), a missing revision or
    a missing series/new-file/check file, and :class:`ConfigError` for malformed ``patchset.yaml``
    (file, line, what to fix).
    """
    text = os.fspath(name_or_path)
    revision = None
    m = re.match(r"^(.*)@(\d+)$", text)
    if m:
        text, revision = m.group(1), int(m.group(2))
    as_path = Path(text)
    if "/" in text or os.sep in text or text.endswith(".yaml") or text.startswith("."):
        root = as_path.parent if as_path.name == _YAML or as_path.suffix == ".yaml" else as_path
        if not (root / _YAML).is_file():
            raise PatchsetError(f"{root}: no {_YAML} there", hint="give a patchset directory or a patchset name")
        ps = _load_dir(root, origin=str(root))
    else:
        if not _NAME.match(text):
            raise PatchsetError(f"{text!r} is not a patchset name",
                                hint="give NAME, NAME@REVISION (a number, e.g. ddtree@2) or a patchset "
                                     "directory")
        dirs = search if search is not None else default_search_path()
        found = available_patchsets(dirs)
        if text not in found:
            names = ", ".join(sorted(found)) or "(none)"
            close = difflib.get_close_matches(text, sorted(found), n=1)
            here = (as_path / _YAML).is_file()     # a directory of that name here: a path, not a name
            raise PatchsetError(f"unknown patchset {text!r}; available: {names}",
                                hint=(f"./{text} holds a {_YAML}: give it as a path, ./{text} (a bare "
                                      "word is a patchset name); " if here else "")
                                + (f"did you mean {close[0]!r}? " if close else "")
                                + "searched " + ", ".join(str(d) for d in dirs))
        ps = _load_dir(found[text], origin=text)
        if ps.name != text:
            raise ConfigError(f"{ps.yaml_path}: name is {ps.name!r} but the directory is {text!r}",
                              hint="make `name:` equal to the directory name")
    return ps if revision is None else ps.at_revision(revision)


def withdrawn_warning(ps: Patchset) -> str | None:
    """The warning "NAME rN is withdrawn: why" when revision ``ps.revision`` is withdrawn (the
    ``withdrawn`` map of ``ps``, or of the newest revision of that patchset here, which speaks for
    earlier ones), else None. Said by ``apply`` and ``diff`` of an exact pin."""
    why = ps.spec.withdrawn.get(ps.revision)
    if not why:
        try:
            why = load_patchset(ps.name).spec.withdrawn.get(ps.revision)
        except SglpatchError:     # given as a directory of a patchset this checkout does not have
            why = None
    return f"{ps.name} r{ps.revision} is withdrawn: {' '.join(why.split())}" if why else None


def _load_dir(root: Path, *, origin: str) -> Patchset:
    root = Path(root).absolute()
    path = root / _YAML
    try:
        raw_text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PatchsetError(f"{path}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc})") from exc
    try:
        data = yaml.safe_load(raw_text)
        node = yaml.compose(raw_text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: malformed YAML: {exc.problem or exc}",
                          hint="fix the YAML at that line (indentation, a missing ':' or an unclosed quote)") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with name, revision, targets",
                          hint="see docs/architecture.md, 'Patchset'")
    try:
        spec = PatchsetSpec.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("[key]"))]
            line = _line_of(node, loc)
            dotted = ".".join(str(p) for p in loc) or "(top)"
            if err["type"] == "string_type" and len(loc) == 2 and loc[0] == "targets":
                err = {**err, "msg": f"version key {loc[1]} is not a string: quote it (\"{loc[1]}\")"}
            lines.append(f"{path}:{line}: {dotted}: {err['msg']}" if line else f"{path}: {dotted}: {err['msg']}")
        raise ConfigError("invalid patchset manifest:\n    " + "\n    ".join(lines),
                          hint="fix the fields named above (quote version keys like \"0.5.23\"; "
                               "hashes are 64 lowercase hex characters or null)") from exc
    ps = Patchset(spec=spec, root=root)
    _check_files(ps, node)
    return ps


def _line_of(node: Any, loc: list) -> int | None:
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        nxt = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if str(k.value) == str(part):
                    nxt = v
                    line = k.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            nxt = node.value[part]
            line = nxt.start_mark.line + 1
        if nxt is None:
            break
        node = nxt
    return line


def _check_files(ps: Patchset, node: Any) -> None:
    root = ps.root.resolve()
    missing = []

    def check(rel: str, loc: list, what: str) -> None:
        p = (ps.root / rel)
        try:
            inside = p.resolve().is_relative_to(root)
        except OSError:
            inside = False
        if not inside:
            missing.append(f"{ps.yaml_path}:{_line_of(node, loc)}: {what} {rel} points outside the patchset")
        elif not p.is_file():
            missing.append(f"{ps.yaml_path}:{_line_of(node, loc)}: {what} {rel} does not exist")

    for version, t in ps.spec.targets.items():
        for i, rel in enumerate(t.series):
            check(rel, ["targets", version, "series", i], f"series file (sglang {version})")
        for dst, src in t.new_files.items():
            check(src, ["targets", version, "new_files", dst], f"new file source for {dst}")
    if ps.spec.checks.l1:
        check(ps.spec.checks.l1, ["checks", "l1"], "check script")
    if missing:
        raise PatchsetError(f"patchset {ps.name}: missing files:\n    " + "\n    ".join(missing),
                            hint="add the files or fix the paths (relative to the patchset directory)")
