"""The frame of the ``sglpatch`` command line: the click group ``cli`` and the :class:`AppContext`
every subcommand gets (the inventory, the host resolver, how results are printed).

The subcommands register themselves on ``cli`` from :mod:`.cli_commands`; :mod:`.cli` runs it all
(``main``). Kept apart from both so that neither the commands nor :mod:`.demo` import the module
that imports them.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem
from rich.console import Console

from . import __version__
from .errors import InventoryError
from .inventory import HOSTS_ENV, Host, Inventory, default_inventory_path, load_inventory
from .progress import Meter, meter_for


PIPED_WIDTH = 200  # columns of output that goes to a file or a pipe (rich's default of 80 wrapped tables)


def output_console() -> Console:
    """The console for results on stdout: the terminal's width on a terminal (or $COLUMNS when
    set); ``PIPED_WIDTH`` when stdout is a file or a pipe, so that tables in logs and ``| less``
    keep one line per row, and messages printed whole (soft wrap: a path or a command in a
    warning is never broken across lines)."""
    piped = not os.environ.get("COLUMNS") and not sys.stdout.isatty()
    return Console(highlight=False, width=PIPED_WIDTH if piped else None, soft_wrap=piped)


@dataclass
class AppContext:
    """What every subcommand can take from ``click.Context.obj``."""

    hosts_file: str | None
    as_json: bool
    debug: bool
    console: Console = field(default_factory=output_console)
    err: Console = field(default_factory=lambda: Console(stderr=True, highlight=False, soft_wrap=True))
    _inventories: dict[bool, Inventory] = field(default_factory=dict)  # by skip_bad_hosts

    def inventory(self, *, required: bool = True, skip_bad_hosts: bool = False) -> Inventory | None:
        """The inventory; with ``skip_bad_hosts``, invalid host entries are left out (``host``
        warns about them) instead of refusing the whole file — for commands that act on one host."""
        if skip_bad_hosts not in self._inventories:
            try:
                self._inventories[skip_bad_hosts] = load_inventory(self.hosts_file, skip_bad_hosts=skip_bad_hosts)
            except InventoryError:
                if required or self.hosts_file:
                    raise
                return None
        return self._inventories[skip_bad_hosts]

    def inventory_path(self) -> Path | None:
        """The inventory file in use (None when there is none: the embedded default)."""
        inv = self.inventory(required=False, skip_bad_hosts=True)
        return Path(inv.path) if inv is not None and inv.path else None

    def _warn_skipped(self, inv: Inventory, name: str) -> None:
        others = sorted(n for n in inv.invalid if n != name)
        if others:
            self.err.print(f"warning: {inv.path}: left out invalid host entr{'y' if len(others) == 1 else 'ies'} "
                           f"{', '.join(others)} (`sglpatch hosts` says what is wrong)", markup=False)

    def host(self, name: str) -> Host:
        """Resolve a host name; ``sandbox`` falls back to the embedded default target."""
        try:
            inv = self.inventory(required=name != "sandbox", skip_bad_hosts=True)
        except InventoryError as exc:
            if not self.hosts_file and not default_inventory_path().exists():  # no inventory at all
                raise InventoryError(f"unknown host {name!r}: there is no inventory ({exc.message})",
                                     hint=f"describe {name} in ./hosts.yaml, or in a file named by --hosts "
                                          f"FILE or ${HOSTS_ENV} (the repository's hosts.yaml shows the "
                                          f"format); `--host sandbox` needs no inventory") from exc
            raise
        if inv is not None and inv.invalid:
            self._warn_skipped(inv, name)
        if inv is not None and (name in inv.names() or name in inv.invalid):
            return inv.get(name)  # an invalid entry raises its own problem
        if name == "sandbox":
            from .sandbox import sandbox_host
            return sandbox_host()
        assert inv is not None
        try:
            return inv.get(name)  # raises InventoryError listing the known hosts
        except InventoryError as exc:   # ... and sandbox, which every command takes besides them
            if "sandbox" not in inv.names():
                exc.hint = (exc.hint or "") + "; `--host sandbox` (the embedded default target) works too"
            raise

    @property
    def meter(self) -> Meter:
        """Progress of long work (a first snapshot, a wheel download, the sandbox build) on stderr,
        away from results: rich bars on a terminal, plain lines otherwise."""
        return meter_for(self.err)

    def say(self, renderable: Any = "") -> None:
        """Print for people (suppressed with --json, where only the JSON document goes to stdout)."""
        if self.as_json:
            self.err.print(renderable)
        else:
            self.console.print(renderable)

    def result(self, obj: Any) -> None:
        """Print a result: its JSON with --json, else its rich rendering (never cropped at the
        terminal width when the result says ``uncropped``, as a full diff does)."""
        if self.as_json:
            data = obj.to_json() if hasattr(obj, "to_json") else obj
            if isinstance(data, dict) and "ok" not in data:  # as the error documents say "ok": false
                data = {"ok": True, **data}
            if isinstance(data, str):
                click.echo(data)
            else:
                click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
        else:  # soft wrap: lines longer than the terminal are printed whole (a diff's must be; piped, all)
            self.console.print(obj, soft_wrap=True if getattr(obj, "uncropped", False) else None)


pass_app = click.make_pass_decorator(AppContext)


# ------------------------------------------------------------------------------ shell completion
# `eval "$(_SGLPATCH_COMPLETE=bash_source sglpatch)"` (zsh_source, fish_source): click's completion,
# taught the names it cannot know — hosts of the inventory in use, patchsets and their revisions.

def complete_hosts(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Host names of the inventory the command line names (``--hosts``, $SGLPATCH_HOSTS, ./hosts.yaml)
    and ``sandbox``; nothing when that inventory cannot be read."""
    names = {"sandbox"}
    try:
        names |= set(load_inventory(ctx.find_root().params.get("hosts_file"), skip_bad_hosts=True).names())
    except Exception:   # completion never fails: no inventory, a broken one: only sandbox
        pass
    return [CompletionItem(n) for n in sorted(names) if n.startswith(incomplete)]


def complete_patchsets(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Patchset names (and NAME@REV for their earlier revisions); a path when one is being typed."""
    if "/" in incomplete or incomplete.startswith("."):
        return [CompletionItem(incomplete, type="dir")]
    from .patchset import available_patchsets, load_patchset

    out = []
    for name, where in sorted(available_patchsets().items()):
        out.append(name)
        try:
            out += [f"{name}@{r}" for r in load_patchset(where).history_revisions()]
        except Exception:
            pass
    return [CompletionItem(n) for n in out if n.startswith(incomplete)]


def wire_completion(group: click.Group) -> None:
    """Give every host and patchset parameter of ``group``'s commands (recursively) its completion."""
    for cmd in group.commands.values():
        for param in cmd.params:
            if param.name in ("host", "host_name"):
                param._custom_shell_complete = complete_hosts  # type: ignore[attr-defined]
            elif param.name == "patchset":
                param._custom_shell_complete = complete_patchsets  # type: ignore[attr-defined]
        if isinstance(cmd, click.Group):
            wire_completion(cmd)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sglpatch")
@click.option("--hosts", "hosts_file", metavar="FILE", envvar="SGLPATCH_HOSTS",
              help="Inventory file (default: $SGLPATCH_HOSTS, else ./hosts.yaml).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
@click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
@click.pass_context
def cli(ctx: click.Context, hosts_file: str | None, as_json: bool, debug: bool) -> None:
    """Put versioned patchsets onto SGLang installs over SSH, prove they work, take them off."""
    ctx.obj = AppContext(hosts_file=hosts_file, as_json=as_json, debug=debug)
