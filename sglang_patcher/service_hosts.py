"""``sglpatch hosts`` and ``hosts --check``: the inventory as given, and each host's SGLang install
found over its transport (one failed host never hides the others)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .errors import DeployError, SglpatchError
from .inventory import Host
from .remote.agent_client import not_writable_hint
from .service import human_bytes, session

__all__ = ["InventoryListing", "HostCheck", "HostsCheckReport", "check_hosts"]


@dataclass
class InventoryListing:
    """The hosts of an inventory, as given (no connection made)."""

    hosts: list[Host]

    def to_json(self) -> dict[str, Any]:
        return {"hosts": [h.model_dump() for h in self.hosts]}

    def __rich__(self) -> Table:
        t = Table(title="hosts", title_justify="left")
        for col in ("host", "transport", "address", "python", "sudo", "tags"):
            t.add_column(col)
        for h in self.hosts:
            t.add_row(h.name, h.transport, h.address, h.python, "yes" if h.sudo else "no",
                      ", ".join(h.tags))
        return t


@dataclass
class HostCheck:
    """One host's ``hosts --check`` outcome: its discovery info, or the error met (never both)."""

    host: Host
    info: Any = None
    error: SglpatchError | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Reached, and apply could write it (its install and its state dir)."""
        return self.error is None and bool(self.info.writable)

    @property
    def exit_code(self) -> int:
        """0 when ok; the error's exit code; 8 (DeployError, what ``apply`` gives there) for a
        host reached but not writable."""
        if self.error is not None:
            return self.error.exit_code
        return 0 if self.ok else DeployError.exit_code


@dataclass
class HostsCheckReport:
    """Per host: discovery info or the error — one failed host never hides the others."""

    checks: list[HostCheck]

    @property
    def ok(self) -> bool:
        """Every host was reached and apply could write it (:attr:`HostCheck.ok`)."""
        return all(c.ok for c in self.checks)

    @property
    def exit_code(self) -> int:
        """The largest host's :attr:`HostCheck.exit_code`; 0 when every host is ok."""
        return max((c.exit_code for c in self.checks), default=0)

    def to_json(self) -> dict[str, Any]:
        out = {}
        for c in self.checks:
            if c.error is not None:
                out[c.host.name] = {"ok": False, "error": c.error.message, "hint": c.error.hint,
                                    "exit_code": c.error.exit_code}
            else:
                out[c.host.name] = {"ok": c.ok, **c.info.to_dict(), "seconds": round(c.seconds, 3)}
        return {"hosts": out, "ok": self.ok}

    def __rich__(self) -> Group:
        t = Table(title="hosts --check", title_justify="left")
        for col in ("host", "python", "sglang", "install", "writable", "free disk", "status"):
            t.add_column(col)
        errors: list[Text] = []   # below the table, full width: a narrow cell wrapped them word by word
        for c in self.checks:
            if c.error is not None:
                t.add_row(c.host.name, c.host.python, "-", "-", "-", "-", Text("failed (see below)", style="red"))
                named = c.error.message.startswith(f"{c.host.name}:") or c.error.message.startswith(f"{c.host.name} (")
                said = Text.assemble(("" if named else f"{c.host.name}: ", "bold red"), (c.error.message, "red"))
                if c.error.hint:  # what to do (e.g. the ssh-keyscan line), as with --json
                    said.append(f"\n  hint: {c.error.hint}", style="yellow")
                errors.append(said)
                continue
            i = c.info
            t.add_row(c.host.name, f"{i.interpreter} ({i.python_version})", str(i.sglang_version),
                      str(i.package_dir), "yes" if i.writable else Text("no (see below)", style="yellow"),
                      human_bytes(i.free_bytes),
                      Text("ok", style="green") if i.writable else Text("not ok (see below)", style="yellow"))
            if not i.writable:
                errors.append(Text(unwritable_text(c.host, i), style="yellow"))
        return Group(t, *errors)


def unwritable_text(host: Host, info: Any) -> str:
    """Why ``host``'s install is not writable by its login user: the first entries and each one's
    reason (the probe's, the same test apply refuses by), and what to do."""
    state_why = getattr(info, "state_dir_why", None)
    said = [f"{info.unwritable_count} entr{'y' if info.unwritable_count == 1 else 'ies'} of the install"
            ] if info.unwritable_count or info.site_packages_why or not state_why else []
    if state_why:
        said.append("its state dir")
    lines = [f"{host.name}: not writable by {info.user or 'the login user'}: {' and '.join(said)}"]
    if info.site_packages_why:
        lines.append(f"  site-packages {info.site_packages} {info.site_packages_why}")
    if state_why:
        lines.append(f"  state dir {info.state_dir} {state_why}")
    for rel in info.unwritable[:8]:
        lines.append(f"  {rel} {info.unwritable_why.get(rel, 'is not writable')}")
    if info.unwritable_count > min(len(info.unwritable), 8):
        lines.append(f"  … and {info.unwritable_count - min(len(info.unwritable), 8)} more")
    whys = [*info.unwritable_why.values(), info.site_packages_why or ""]
    kinds = {"immutable" if "chattr +i" in w else "append_only" if "chattr +a" in w else
             "read_only" if "read-only" in w else "permission" for w in [*whys, state_why or ""] if w}
    if state_why:
        kinds.add("state_dir")
    lines.append("  hint: `apply` and `rollback` refuse a file they cannot replace"
                 + (", and a state dir they cannot write," if state_why else "")
                 + " before writing anything; " + not_writable_hint(kinds, info.user))
    return "\n".join(lines)


def check_hosts(hosts: Iterable[Host]) -> HostsCheckReport:
    """Connect to each host and discover its SGLang install (errors are collected per host)."""
    checks = []
    for h in hosts:
        t0 = time.monotonic()
        try:
            with session(h) as (transport, info):
                checks.append(HostCheck(h, info=info, seconds=time.monotonic() - t0))
        except SglpatchError as exc:
            checks.append(HostCheck(h, error=exc, seconds=time.monotonic() - t0))
    return HostsCheckReport(checks)
