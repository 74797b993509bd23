"""The service layer's shared pieces: what each ``sglpatch`` command does lives in a module named
for its step, each a set of library calls a user could make from Python:

    service_hosts     hosts / hosts --check          service_status    status
    service_snapshot  snapshot                       service_rollback  rollback, prune
    service_diff      diff                           service_check     check (levels 0-3)
    service_apply     apply (and its gates)          service_bench     bench (service_sweep: --sweep)
    service_refresh   patchset refresh               service_port      patchset port

(``patchset list`` / ``show``: :mod:`sglang_patcher.catalog`.) Every call takes inventory
:class:`~sglang_patcher.inventory.Host` objects and names, opens and closes its own transport
(:class:`session`), and returns a result object with ``to_json()`` and ``__rich__``. Errors are the
:mod:`sglang_patcher.errors` classes. This module imports none of the step modules (they import it).
"""

from __future__ import annotations

from typing import Any, Callable

from rich.text import Text

from . import discovery
from .inventory import Host
from .transport import connect

__all__ = ["Log", "quiet", "human_bytes", "step_progress", "session"]

#: Where a service call says what it is doing: one line (text or a rich renderable) per call.
Log = Callable[[Any], None]


def quiet(_: Any) -> None:
    """A :data:`Log` that says nothing (every call's default)."""


def human_bytes(n: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"`` (bytes; B, KiB ... TiB); ``None`` -> ``"?"``."""
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def step_progress(log: Log) -> Callable[[str, str], None]:
    """A deploy step's progress callback ``(step, detail)`` that logs a bullet line to ``log``."""
    def progress(step: str, detail: str) -> None:
        log(Text.assemble(("  • ", "dim"), (f"{step}: ", "bold"), detail))
    return progress


class session:
    """``with session(host) as (transport, info)``: connect, discover, always close."""

    def __init__(self, host: Host, *, record: bool = True):
        self.host = host
        self.record = record
        self.transport = None

    def __enter__(self):
        self.transport = connect(self.host)
        try:
            info = discovery.discover(self.transport, self.host, record=self.record)
        except BaseException:
            self.transport.close()
            raise
        return self.transport, info

    def __exit__(self, *exc):
        self.transport.close()
