"""``sglpatch snapshot``: mirror a host's SGLang install locally (only changed files travel)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from . import mirror
from .inventory import Host
from .progress import SILENT, Meter
from .service import Log, human_bytes, quiet, session

__all__ = ["SnapshotReport", "snapshot_host"]


@dataclass
class SnapshotReport:
    """A snapshot's result plus the host's discovery info."""

    host: Host
    info: Any
    result: mirror.SnapshotResult

    def to_json(self) -> dict[str, Any]:
        return {**self.result.to_dict(), "install": str(self.info.package_dir),
                "interpreter": self.info.interpreter}

    def __rich__(self) -> Table:
        r = self.result
        t = Table(title=f"snapshot of {self.host.name}", title_justify="left", show_header=False)
        t.add_column("", style="bold")
        t.add_column("")
        t.add_row("sglang", f"{self.info.sglang_version} at {self.info.package_dir}")
        t.add_row("mirror", str(r.mirror.root))
        t.add_row("files", f"{r.files} ({r.counts()})")
        t.add_row("transferred", human_bytes(r.bytes_fetched))
        t.add_row("round trips", str(r.round_trips))
        t.add_row("seconds", f"{r.seconds:.2f}")
        return t


def snapshot_host(host: Host, *, home: Path | None = None, log: Log = quiet,
                  meter: Meter = SILENT) -> SnapshotReport:
    """Mirror ``host``'s SGLang install locally (only changed files travel; ``meter`` shows it)."""
    with session(host, record=False) as (transport, info):   # the mirror holds RECORD itself
        log(f"{host.name}: sglang {info.sglang_version} at {info.package_dir}")
        result = mirror.snapshot(transport, host, info, home=home, meter=meter)
    return SnapshotReport(host, info, result)
