"""The inventory: ``hosts.yaml`` validated with pydantic into :class:`Inventory` of :class:`Host`.

File format (see the repository's ``hosts.yaml`` for a commented example)::

    hosts:
      ct200:                         # the name used on the command line
        transport: ssh               # ssh (default) | local
        ssh_alias: ct200             # a Host of ~/.ssh/config (ProxyJump, IdentityFile, ... apply)
        # or: hostname/port/user/identity_file (any of these also override the alias' values)
        known_hosts: ~/.ssh/known_hosts   # optional; default: UserKnownHostsFile or ~/.ssh/known_hosts
        python: /opt/venvs/sglang/bin/python   # absolute path of the interpreter that has sglang
        sudo: false                  # prefix host commands with `sudo -n` (root-owned installs)
        tags: [gpu, h200]
        state_dir: null              # host-side state; default <site-packages>/.sglpatch
        serve:                       # optional: how `check` (levels 2-3) and `bench` start SGLang
          model: /models/Qwen3-8B    #   there (sglang_patcher/serve/profile.py has every field)
          draft_model: /models/Qwen3-8B-DFlash-b16

Environment expansion: ``${VAR}`` in ``python``, ``identity_file``, ``known_hosts`` and ``state_dir``
is replaced by the variable's value; ``~`` at the start of ``identity_file``/``known_hosts`` is the
local home. ``${SGLPATCH_HOME}`` defaults to :func:`~sglang_patcher.state.sglpatch_home` when unset.
Any other unset variable is an error naming the line.

Errors: everything wrong with the file becomes ONE :class:`~sglang_patcher.errors.InventoryError`
naming the file, the line of each problem (from the YAML node marks) and the fix.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal, get_args

import yaml
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator,
                      model_validator)

from .errors import InventoryError
from .serve.profile import ServeProfile
from .state import sglpatch_home

HOSTS_ENV = "SGLPATCH_HOSTS"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class _UnsetVariable(ValueError):
    pass


def expand_vars(value: str) -> str:
    """Replace ``${VAR}`` with the environment's value (``${SGLPATCH_HOME}`` is the state dir,
    :func:`~sglang_patcher.state.sglpatch_home`: its default when unset or empty, ConfigError when
    relative).

    Raises ValueError (turned into an InventoryError with the line) when a variable is unset.
    """

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == "SGLPATCH_HOME":   # the state dir itself: unset or empty -> its default; relative -> its error
            return str(sglpatch_home())
        val = os.environ.get(name)
        if val is None:
            raise _UnsetVariable(f"environment variable ${{{name}}} is not set")
        return val

    return _VAR.sub(sub, value)


class Host(BaseModel):
    """One host of the inventory.

    ``python`` is the absolute path of the host's interpreter (after ``${VAR}`` expansion); the
    tool never relies on a shell's PATH or an activated venv. For ``transport: ssh`` either
    ``ssh_alias`` or ``hostname`` is required; ``local`` takes neither.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    transport: Literal["ssh", "local"] = "ssh"
    ssh_alias: str | None = None
    hostname: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    python: str
    sudo: bool = False
    tags: list[str] = Field(default_factory=list)
    state_dir: str | None = None
    serve: ServeProfile | None = None
    _inventory_file: str | None = PrivateAttr(default=None)   # set by the Inventory it is read from

    def __eq__(self, other: object) -> bool:
        """Equal fields, equal hosts: the file a host was read from does not make it another."""
        if not isinstance(other, Host):
            return NotImplemented
        return self.__dict__ == other.__dict__

    @property
    def inventory_file(self) -> str:
        """The inventory file this host was read from, for hints that say where to fix it (for a
        host built in code: ``the inventory file (hosts.yaml)``)."""
        return self._inventory_file or "the inventory file (hosts.yaml)"

    def serve_hint(self, what: str = "`serve:` (model, draft_model)") -> str:
        """The way out for a command that starts servers on a host without the profile it needs:
        where to add ``what``; for the embedded sandbox (no inventory file, no model), which
        host to use instead."""
        if self._inventory_file is None and "sandbox" in self.tags:
            return ("the embedded sandbox is SGLang without a model to serve: servers run on a host of your "
                    f"hosts.yaml with {what} (the repository's hosts.yaml shows one for ct200)")
        return (f"add {what} to {self.name} in {self.inventory_file} (the repository's hosts.yaml shows "
                "one for ct200)")

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("host names may hold letters, digits, '.', '_' and '-' only")
        return v

    @field_validator("python", "state_dir")
    @classmethod
    def _remote_abs(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = expand_vars(v)
        if not PurePosixPath(v).is_absolute():
            raise ValueError(f"must be an absolute path, got {v!r}")
        return v

    @field_validator("identity_file", "known_hosts")
    @classmethod
    def _local_path(cls, v: str | None) -> str | None:
        if v is None:
            return v
        return os.path.expanduser(expand_vars(v))

    @model_validator(mode="after")
    def _transport_fields(self) -> "Host":
        if self.transport == "ssh" and not (self.ssh_alias or self.hostname):
            raise ValueError("an ssh host needs `ssh_alias` (a Host of ~/.ssh/config) or `hostname`")
        if self.transport == "local":
            given = [f for f in ("ssh_alias", "hostname", "port", "user", "identity_file",
                                 "known_hosts") if getattr(self, f) is not None]
            if given:
                raise ValueError(f"a local host takes no SSH settings (remove {', '.join(given)})")
        return self

    @property
    def address(self) -> str:
        """``user@host:port`` as far as the inventory knows it (the alias when one is used)."""
        target = self.ssh_alias or self.hostname or "localhost"
        if self.user:
            target = f"{self.user}@{target}"
        if self.port:
            target = f"{target}:{self.port}"
        return target if self.transport == "ssh" else "local"


class Inventory(BaseModel):
    """All hosts of one ``hosts.yaml`` (``path`` is where it was read from, None when built in code)."""

    model_config = ConfigDict(extra="forbid")

    hosts: dict[str, Host] = Field(default_factory=dict)
    path: str | None = None
    # host entries left out by ``load_inventory(..., skip_bad_hosts=True)``: name → (problem, fix)
    invalid: dict[str, tuple[str, str]] = Field(default_factory=dict, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _inject_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("hosts"), dict):
            hosts = {}
            for name, entry in data["hosts"].items():
                if isinstance(entry, dict):
                    entry = {"name": str(name), **entry}
                hosts[name] = entry
            data = {**data, "hosts": hosts}
        return data

    @model_validator(mode="after")
    def _tell_hosts_their_file(self) -> "Inventory":
        for h in self.hosts.values():
            h._inventory_file = self.path
        return self

    def get(self, name: str) -> Host:
        """The host called ``name``; raises InventoryError listing the known hosts."""
        if name in self.invalid:
            problem, fix = self.invalid[name]
            raise InventoryError(f"{self.path or 'the inventory'}: host {name!r} is invalid: {problem}", hint=fix)
        try:
            return self.hosts[name]
        except KeyError:
            known = ", ".join(sorted(self.hosts)) or "(none)"
            where = self.path or "the inventory"
            raise InventoryError(f"unknown host {name!r} in {where}; known hosts: {known}",
                                 hint=f"add it under `hosts:` in {where} or pick a known one") from None

    def names(self) -> list[str]:
        return sorted(self.hosts)

    def with_tag(self, tag: str) -> list[Host]:
        return [h for _, h in sorted(self.hosts.items()) if tag in h.tags]


def default_inventory_path() -> Path:
    """``$SGLPATCH_HOSTS`` when set, else ``./hosts.yaml``."""
    env = os.environ.get(HOSTS_ENV)
    return Path(env).expanduser() if env else Path("hosts.yaml")


def load_inventory(path: str | os.PathLike[str] | None = None, *, skip_bad_hosts: bool = False) -> Inventory:
    """Read and validate an inventory file (default: :func:`default_inventory_path`).

    Raises :class:`InventoryError` (one, listing every problem with its line and fix) when the file is
    missing, is not YAML, or does not validate. With ``skip_bad_hosts``, problems that lie inside
    host entries leave those hosts out instead (``Inventory.invalid`` names each with its problem,
    and ``get`` of one raises it), so that one broken entry does not stop work on the others;
    problems of the file itself still raise.
    """
    p = Path(path) if path is not None else default_inventory_path()
    try:
        raw = p.read_bytes()
    except IsADirectoryError as exc:
        raise InventoryError(f"{p.absolute()}: is a directory, not an inventory file",
                             hint="pass the YAML file itself, e.g. --hosts DIR/hosts.yaml") from exc
    except OSError as exc:
        raise InventoryError(
            f"{p.absolute()}: cannot read the inventory ({exc.strerror or exc})",
            hint=f"create it (see the repository's hosts.yaml), pass --hosts FILE or point "
                 f"${HOSTS_ENV} at one") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InventoryError(
            f"{p}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
            hint="save the inventory as UTF-8 YAML (a comment in another encoding is enough to "
                 "break it)") from exc
    return parse_inventory(text, origin=str(p), skip_bad_hosts=skip_bad_hosts)


def parse_inventory(text: str, *, origin: str = "hosts.yaml", skip_bad_hosts: bool = False) -> Inventory:
    """Validate inventory YAML ``text``; ``origin`` names it in errors. See :func:`load_inventory`."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InventoryError(f"{origin}{line}: not valid YAML ({problem})",
                             hint="fix the YAML syntax (indentation, colons, quotes)") from exc
    dup = _first_duplicate_key(node)
    if dup is not None:
        key, first, second = dup
        raise InventoryError(f"{origin}, line {second}: `{key}` is defined twice (first on line {first})",
                             hint="YAML would silently keep only the last one; rename or remove one")
    if data is None:
        data = {}
    if isinstance(data, dict) and "hosts" in data and data["hosts"] is None:
        data = {**data, "hosts": {}}  # `hosts:` with nothing under it: an empty inventory, as an empty file
    if not isinstance(data, dict) or not isinstance(data.get("hosts", {}), dict):
        raise InventoryError(f"{origin}, line 1: expected a mapping `hosts: {{NAME: {{...}}}}`",
                             hint="see the repository's hosts.yaml for the format")
    if "path" in data:  # Inventory.path is where the file was read from, not a key of it
        line, _ = _line_of(node, ("path",))
        raise InventoryError(f"{origin}: invalid inventory: line {line}: path: unknown field `path`",
                             hint="the file's top level takes only `hosts:`, a mapping of host name to its fields")
    try:
        inv = Inventory.model_validate({**data, "path": origin})
    except ValidationError as exc:
        bad = _bad_hosts(exc, node) if skip_bad_hosts else None
        if bad:
            hosts = {n: e for n, e in data.get("hosts", {}).items() if str(n) not in bad}
            inv = Inventory.model_validate({**data, "hosts": hosts, "path": origin})  # the errors were all theirs
            inv.invalid = bad
            return inv
        errors = _merge_flow_splits(exc.errors())
        problems = [_describe(err, node) for err in errors]
        head = problems[0] if len(problems) == 1 else f"{len(problems)} problems"
        msg = f"{origin}: invalid inventory: {head}"
        if len(problems) > 1:
            msg += "".join(f"\n  - {p}" for p in problems)
        hints = list(dict.fromkeys(_fix(e) for e in errors))
        raise InventoryError(msg, hint="; ".join(hints)) from exc
    return inv


# -- error mapping ---------------------------------------------------------------------------------

def _bad_hosts(exc: ValidationError, node: yaml.Node | None) -> dict[str, tuple[str, str]] | None:
    """{host name: (its problems, their fixes)} when every error of ``exc`` lies inside a host
    entry; None when any lies at the file's top level (then the whole file is refused)."""
    bad: dict[str, tuple[list[str], list[str]]] = {}
    for err in _merge_flow_splits(exc.errors()):
        loc = tuple(p for p in err["loc"] if p != "path")
        if len(loc) < 2 or loc[0] != "hosts":
            return None
        probs, fixes = bad.setdefault(str(loc[1]), ([], []))
        probs.append(_describe(err, node))
        if (fix := _fix(err)) not in fixes:
            fixes.append(fix)
    return {n: ("; ".join(p), "; ".join(f)) for n, (p, f) in bad.items()}


def _first_duplicate_key(node: yaml.Node | None) -> tuple[str, int, int] | None:
    """(key, first line, second line) of the first mapping key defined twice, else None."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                line = k.start_mark.line + 1
                if k.value in seen and k.value != "<<":
                    return k.value, seen[k.value], line
                seen[k.value] = line
            found = _first_duplicate_key(v)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found = _first_duplicate_key(item)
            if found:
                return found
    return None


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> tuple[int | None, bool]:
    """Line (1-based) of the YAML node at ``loc``; the second value says whether the exact key
    was found (False: the line is the nearest enclosing mapping's)."""
    line = node.start_mark.line + 1 if node is not None else None
    cur = node
    for part in loc:
        if isinstance(cur, yaml.MappingNode):
            for k, v in cur.value:
                if str(k.value) == str(part):
                    cur = v
                    # a key's own line is more useful than its (block) value's first line
                    line = k.start_mark.line + 1
                    break
            else:
                return line, False
        elif isinstance(cur, yaml.SequenceNode) and isinstance(part, int) and part < len(cur.value):
            cur = cur.value[part]
            line = cur.start_mark.line + 1
        else:
            return line, False
    return line, True


def _describe(err: dict[str, Any], root: yaml.Node | None) -> str:
    loc = tuple(p for p in err["loc"] if p != "path")
    line, _ = _line_of(root, loc)
    where = ".".join(str(p) for p in loc) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        msg = f"`{loc[-1]}` is required"
    elif err["type"] == "extra_forbidden":
        msg = f"unknown field `{loc[-1]}`"
        close = difflib.get_close_matches(str(loc[-1]), _known_fields(loc), n=1)
        if close:
            msg += f" (did you mean `{close[0]}`?)"
    prefix = f"line {line}: " if line else ""
    return f"{prefix}{where}: {msg}"


def _top_level(loc: tuple) -> bool:
    """Whether a validation error's ``loc`` is a key of the file's top level (not of a host)."""
    return len(tuple(p for p in loc if p != "path")) == 1


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model whose keys ``loc`` (a field of it, inside a host entry) is among: Host for
    ``hosts.NAME.FIELD``, ServeProfile for ``hosts.NAME.serve.FIELD``, and so on down."""
    model: type[BaseModel] = Host
    for part in loc[2:-1]:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        inner = [a for a in (field.annotation, *get_args(field.annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return None
        model = inner[0]
    return model


def _known_fields(loc: tuple) -> list[str]:
    """The keys allowed where ``loc`` points: the top level's, a host's, or those of the mapping
    inside a host (``serve:``, ``serve.ddtree:``, ``serve.bench:``) it is in."""
    if _top_level(loc):
        return ["hosts"]
    model = _model_at(loc)
    return [f for f in (model or Host).model_fields if f not in ("name", "path")]


def _merge_flow_splits(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``bench: {concurrency: 1,4,16}``: inside ``{ }`` YAML ends a value at a comma and makes each
    later piece a key of its own (an int here: "Keys should be strings"). Those pieces' errors are
    folded into one for the field they were cut from, which gives the value back as a list."""
    def stray(err: dict[str, Any]) -> bool:   # a piece of a cut value, read as a key of its own
        loc = err["loc"]
        return bool(loc) and isinstance(loc[-1], int) and "Keys should be strings" in err.get("msg", "")

    strays: dict[tuple, list[Any]] = {}
    for err in filter(stray, errors):
        strays.setdefault(tuple(err["loc"][:-1]), []).append(err["loc"][-1])
    if not strays:
        return errors
    out: list[dict[str, Any]] = []
    for err in errors:
        loc = tuple(err["loc"])
        if stray(err):
            continue
        if len(loc) > 1 and loc[:-1] in strays and err.get("type") == "list_type":   # the list that was cut
            items = [err.get("input"), *strays.pop(loc[:-1])]
            value = "[" + ", ".join(str(i) for i in items) + "]"
            out.append({"loc": loc, "type": "flow_split", "input": value,
                        "msg": f"{loc[-1]} was cut at its first comma: inside {{ }} YAML ends a value at a "
                               f"comma and made the rest keys of their own ({', '.join(str(i) for i in items[1:])}); "
                               f"write the list in brackets: {loc[-1]}: {value}"})
            continue
        out.append(err)
    for parent, keys in strays.items():   # no sibling error to fold them into: say what they are
        out.append({"loc": (*parent, keys[0]), "type": "flow_split", "input": keys,
                    "msg": f"keys {', '.join(map(str, keys))} look like the rest of a value cut at a comma "
                           "inside { }: put that value in brackets [ ] or quotes"})
    return out


def _fix(err: dict[str, Any]) -> str:
    loc = err["loc"]
    field = loc[-1] if loc else ""
    if "environment variable" in err.get("msg", ""):   # before the field's own hint: the value was fine
        var = _VAR.search(err.get("msg", ""))
        name = var.group(1) if var else "the variable"
        return f"export {name} before running sglpatch (e.g. export {name}=...), or write the path out"
    if field == "python":
        return ("set `python:` to the absolute path of the host's interpreter that has sglang, "
                "e.g. /opt/venvs/sglang/bin/python (run `command -v python` in that env on the host)")
    if err["type"] == "flow_split":
        return "inside { } a comma ends a value: write a list in brackets [ ], quote a text, or put the mapping in block style"
    if err["type"] == "extra_forbidden":
        if _top_level(loc):
            return "the file's top level takes only `hosts:`, a mapping of host name to its fields"
        model = _model_at(loc)
        where = "a host" if model in (None, Host) else f"`{loc[-2]}:`"
        return f"remove it or fix its spelling; {where} takes: {', '.join(_known_fields(loc))}"
    if field == "state_dir":
        return "give an absolute path on the host, or remove `state_dir`"
    if field == "transport":
        return "use `transport: ssh` or `transport: local`"
    return "see the repository's hosts.yaml for a commented example of every field"
