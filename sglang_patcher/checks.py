"""Smoke checks on the host after a push: L0 (compile) and L1 (the patchset's import/argument script).

* **L0** — ``py_compile`` of every touched ``.py`` file with the host's interpreter, all files in one
  round trip (the deploy agent's ``compile`` op; bytecode goes to a temp dir, never ``__pycache__``).
* **L1** — the patchset's ``checks.l1`` script (a file in the patchset directory; standard library +
  sglang) run by the host's interpreter in one round trip. It prints one JSON object on its last
  stdout line: ``{"checks": [{"name": str, "status": "passed"|"failed"|"skipped", "detail": str}]}``.
  A script that crashes or prints no such JSON is one failed L1 check carrying its output tail.

``skipped`` is never counted as passed: :attr:`CheckReport.gate_passed` is True when no check
failed, and :attr:`CheckReport.all_passed` only when every check passed. An L1 that is skipped (no
script in the patchset, or the script skipped every check because the host's SGLang dependencies
are not importable) does not fail apply's smoke gate but is shown as skipped; ``sglpatch check`` at
level 1 (and a ``check:1`` gate), which asks for L1's proof, fails when every L1 check skipped
(``service_check``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .remote import launcher
from .remote.agent_client import AgentClient
from .transport.base import Transport

__all__ = ["run_checks", "run_l0", "run_l1", "CheckReport", "CheckResult", "parse_l1_output", "l1_script_path"]

STATUSES = ("passed", "failed", "skipped")
L1_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class CheckResult:
    """One check: ``level`` L0|L1, ``name``, ``status`` passed|failed|skipped, ``detail`` text."""

    level: str
    name: str
    status: str
    detail: str = ""


@dataclass
class CheckReport:
    """All checks of one host, with timing (``seconds`` per level) and ``round_trips`` used."""

    host: str
    checks: list[CheckResult] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    round_trips: int = 0

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == "failed"]

    @property
    def skipped(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == "skipped"]

    @property
    def gate_passed(self) -> bool:
        """True when no check failed (skipped ones do not fail the gate, nor count as passed)."""
        return not self.failed

    @property
    def all_passed(self) -> bool:
        return bool(self.checks) and all(c.status == "passed" for c in self.checks)

    def level_status(self, level: str) -> str:
        """passed (all passed), failed (any failed), skipped (none ran or all skipped) or partial."""
        cs = [c for c in self.checks if c.level == level]
        if any(c.status == "failed" for c in cs):
            return "failed"
        if not cs or all(c.status == "skipped" for c in cs):
            return "skipped"
        if all(c.status == "passed" for c in cs):
            return "passed"
        return "partial"

    def summary(self) -> dict[str, Any]:
        """Compact form stored in the deployment record."""
        return {"L0": self.level_status("L0"), "L1": self.level_status("L1"),
                "failed": [f"{c.level}:{c.name}" for c in self.failed],
                "skipped": [f"{c.level}:{c.name}" for c in self.skipped]}

    def skip_reasons(self, level: str, most: int) -> str:
        """The distinct reasons ``level``'s skipped checks give (whitespace folded, sorted), the
        first ``most`` joined by "; " and how many more; "" when none gives one."""
        why = sorted({" ".join(c.detail.split()) for c in self.checks
                      if c.level == level and c.status == "skipped" and c.detail})
        return "; ".join(why[:most]) + (f"; … ({len(why) - most} more)" if len(why) > most else "")

    @property
    def levels_run(self) -> list[str]:
        return sorted({c.level for c in self.checks if c.status != "skipped"})

    def not_proven(self) -> list[str]:
        """What these checks did not prove about the host, by the highest level that ran."""
        top = max((int(lv[1:]) for lv in self.levels_run), default=-1)
        out = []
        if top < 1:
            # L1 never ran here, or every L1 check was skipped (a missing dependency): not imported
            why = "; every L1 check was skipped here" if any(c.level == "L1" for c in self.checks) else ""
            out.append("that the patched modules import and pass the patchset's L1 checks (`sglpatch check "
                       f"--level 1` on a host with SGLang's dependencies{why})")
        if top < 2:
            out.append("that the patched server starts (`sglpatch check --level 2`, with the host's "
                       "serve profile; no worker was constructed and no server started here)")
        if top < 3:
            out.append("that speculative decoding gives the target's tokens (`sglpatch check --level 3`)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "gate_passed": self.gate_passed, "summary": self.summary(),
                "seconds": self.seconds, "round_trips": self.round_trips,
                "checks": [asdict(c) for c in self.checks], "not_proven": self.not_proven()}

    def text(self) -> str:
        """Plain text, one line per check (used in error messages); with a failure, the passed
        checks of each level fold into one line, as in the table, so that the failure stands out."""
        fold = bool(self.failed)
        lines = []
        for c in self.checks:
            if fold and c.status == "passed":
                continue
            detail = c.detail.strip().replace("\n", "\n      ")
            lines.append(f"  [{c.level}] {c.status:7} {c.name}" + (f": {detail}" if detail else ""))
        if fold:
            for level in sorted({c.level for c in self.checks}):
                n = sum(1 for c in self.checks if c.level == level and c.status == "passed")
                if n:
                    lines.append(f"  [{level}] passed  {n} other check(s)")
        return "\n".join(lines)

    def __rich__(self):
        from rich.table import Table

        styles = {"passed": "green", "failed": "bold red", "skipped": "yellow"}
        t = Table(title=f"smoke checks on {self.host}", show_lines=False)
        t.add_column("level")
        t.add_column("check")
        t.add_column("status")
        t.add_column("detail", overflow="fold")
        # with a failure, the passed checks of a level shrink to one line each: the failure stands out
        fold = bool(self.failed)
        for c in self.checks:
            if fold and c.status == "passed":
                continue
            t.add_row(c.level, c.name, f"[{styles.get(c.status, '')}]{c.status}[/]", c.detail)
        if fold:
            for level in sorted({c.level for c in self.checks}):
                n = sum(1 for c in self.checks if c.level == level and c.status == "passed")
                if n:
                    t.add_row(level, f"{n} other check(s)", f"[green]passed[/]", "")
        missing = self.not_proven()
        if missing and self.checks:
            t.caption = "not proven here: " + "; ".join(missing)
        return t


def run_l0(transport: Transport, interpreter: str, site_packages: str, files: Iterable[str], *,
           sudo: bool = False) -> list[CheckResult]:
    """``py_compile`` every ``.py`` among ``files`` (site-packages-relative) in one round trip."""
    py = sorted(p for p in files if p.endswith(".py"))
    if not py:
        return [CheckResult("L0", "py_compile", "skipped", "no .py file touched")]
    out = AgentClient(transport, interpreter, site_packages, sudo=sudo).compile(py)
    return [CheckResult("L0", f"py_compile {p}", r["status"], r.get("detail", ""))
            for p, r in sorted(out["results"].items())]


def parse_l1_output(stdout: bytes, stderr: bytes, exit_code: int) -> list[CheckResult]:
    """Turn the L1 script's output into results; no valid JSON → one failed check with the tail."""
    text = stdout.decode("utf-8", "replace")
    data = None
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                data = None
            break
    if not isinstance(data, dict) or not isinstance(data.get("checks"), list):
        tail = "\n".join((stderr.decode("utf-8", "replace") or text).strip().splitlines()[-15:])
        return [CheckResult("L1", "l1 script", "failed",
                            f"exit code {exit_code}, no JSON result; output tail:\n{tail}")]
    out = []
    for i, c in enumerate(data["checks"]):
        if not isinstance(c, dict):
            out.append(CheckResult("L1", f"entry {i}", "failed", f"not an object: {c!r}"))
            continue
        status = c.get("status")
        if status not in STATUSES:
            out.append(CheckResult("L1", str(c.get("name", f"entry {i}")), "failed",
                                   f"unknown status {status!r} (want passed|failed|skipped)"))
            continue
        out.append(CheckResult("L1", str(c.get("name", f"entry {i}")), status, str(c.get("detail", ""))))
    if exit_code != 0 and not any(c.status == "failed" for c in out):
        tail = "\n".join(stderr.decode("utf-8", "replace").strip().splitlines()[-10:])
        out.append(CheckResult("L1", "l1 script exit", "failed", f"exit code {exit_code}\n{tail}"))
    if not out:
        out.append(CheckResult("L1", "l1 script", "skipped", "the script reported no checks"))
    return out


def l1_script_path(patchset: Any) -> Path | None:
    """The patchset's L1 script file, or None when it has none.

    Uses ``patchset.l1_check`` (an absolute path or None) when the patchset has it; else reads
    ``patchset.checks`` (a mapping with ``l1``, or an object with an ``l1`` attribute) relative to
    ``patchset.root`` (its directory).
    """
    if hasattr(patchset, "l1_check"):
        p = patchset.l1_check
        return None if p is None else Path(p)
    checks = getattr(patchset, "checks", None)
    rel = None
    if isinstance(checks, dict):
        rel = checks.get("l1")
    elif checks is not None:
        rel = getattr(checks, "l1", None)
    if not rel:
        return None
    rel = Path(rel)
    if rel.is_absolute():
        return rel
    root = getattr(patchset, "root", None) or getattr(patchset, "path", None) or getattr(patchset, "dir", None)
    return Path(root) / rel if root is not None else rel


def run_l1(transport: Transport, interpreter: str, script: bytes | None, *, sudo: bool = False,
           timeout: float = L1_TIMEOUT_S, args: Iterable[str] = ()) -> list[CheckResult]:
    """Run the L1 script (source bytes) with the host's interpreter; None → one skipped check."""
    if script is None:
        return [CheckResult("L1", "l1", "skipped", "the patchset has no L1 script")]
    res = launcher.run_source(transport, interpreter, script, *args, sudo=sudo, timeout=timeout)
    return parse_l1_output(res.stdout, res.stderr, res.exit_code)


def run_checks(transport: Transport, host: Any, info: Any, files: Iterable[str], patchset: Any = None,
               *, levels: tuple[str, ...] = ("L0", "L1")) -> CheckReport:
    """Run L0 and L1 on ``host`` for the touched ``files``; returns a :class:`CheckReport`.

    ``host`` is an inventory Host (``python``, ``sudo``); ``info`` the discovery HostInfo
    (``interpreter``, ``site_packages``). Raises the transport's errors when the host cannot be
    reached; a failing check is a result, not an exception.
    """
    interpreter = getattr(info, "interpreter", None) or getattr(host, "python")
    sudo = bool(getattr(host, "sudo", False))
    report = CheckReport(host=getattr(host, "name", transport.name))
    start_rt = transport.round_trips
    files = [f for f in files]
    if "L0" in levels:
        t0 = time.monotonic()
        report.checks += run_l0(transport, interpreter, info.site_packages, files, sudo=sudo)
        report.seconds["L0"] = round(time.monotonic() - t0, 3)
    if "L1" in levels:
        t0 = time.monotonic()
        path = l1_script_path(patchset) if patchset is not None else None
        script = path.read_bytes() if path is not None else None
        report.checks += run_l1(transport, interpreter, script, sudo=sudo)
        report.seconds["L1"] = round(time.monotonic() - t0, 3)
    report.round_trips = transport.round_trips - start_rt
    return report
