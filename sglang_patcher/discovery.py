"""Discovery: what SGLang is installed where on a host, asked of the host's own interpreter.

One round trip: :mod:`sglang_patcher.remote.probe` op ``probe`` runs under ``host.python`` (an
absolute path from hosts.yaml) and reports through ``importlib.metadata`` and
``importlib.util.find_spec`` — it never imports ``sglang``. The installed distribution's RECORD
(``{path: hex sha256 | None}``) comes back with it: it is the trust anchor for "pristine".

Refused with :class:`~sglang_patcher.errors.DiscoveryError` (one message naming the host and what to
do): the interpreter is missing or not executable; no ``sglang`` distribution is visible; more than one
is visible (user site + venv, a ``.pth``/editable checkout + a wheel, ...), each named with location
and version (also on the error as ``.distributions``, a list of :class:`Distribution`); an editable
install; ``import sglang`` resolving to a directory other than the distribution's (PYTHONPATH, .pth).
A ``sudo -n`` that cannot run (sudo missing, password required) is a TransportError instead.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import DiscoveryError, RemoteCommandError, TransportError
from .remote.launcher import call_json
from .transport.base import Transport


@dataclass(frozen=True)
class Distribution:
    """One visible ``sglang`` distribution: ``location`` is the directory holding ``dist_info``."""

    name: str
    version: str
    location: str | None
    dist_info: str | None
    editable: bool = False
    has_record: bool = True
    direct_url: dict | None = None

    def describe(self) -> str:
        kind = " (editable)" if self.editable else ""
        return f"sglang {self.version} at {self.location}{kind}"


@dataclass
class HostInfo:
    """What :func:`discover` found on a host.

    ``interpreter``: the configured absolute path that was run; ``executable``: what that
    interpreter reports as ``sys.executable``. ``site_packages``: absolute remote directory holding
    ``sglang/`` and ``dist_info`` (all mirror/deploy paths are relative to it). ``writable``: the
    package dir, its files and site-packages are writable by the login user (``unwritable_count``
    entries are not; the first ones in ``unwritable``, each with why in ``unwritable_why`` — "is
    immutable (chattr +i)", "is not writable by USER (owner root, mode 0755)": the host-side test
    :mod:`sglang_patcher.remote.access` that apply's refusal uses too; ``site_packages_why`` for
    site-packages itself; ``state_dir_why`` for the host's state dir ``state_dir`` — the inventory's
    ``state_dir`` or ``<site-packages>/.sglpatch`` — which apply and rollback must write:
    ``access.state_dir_problem``, the deploy agent's rule). ``free_bytes``: free bytes on that filesystem
    for the login user. ``record``: the distribution's RECORD as ``{path: hex sha256 | None}``
    (empty when the distribution has no RECORD; see ``has_record``).
    """

    host: str
    interpreter: str
    executable: str
    python_version: str
    sglang_version: str
    site_packages: str
    package_dir: str
    dist_info: str
    distributions: list[Distribution]
    writable: bool
    free_bytes: int
    user: str | None = None
    unwritable_count: int = 0
    unwritable: list[str] = field(default_factory=list)
    unwritable_why: dict[str, str] = field(default_factory=dict)
    site_packages_why: str | None = None
    state_dir: str | None = None
    state_dir_why: str | None = None
    has_record: bool = True
    record: dict[str, str | None] = field(default_factory=dict, repr=False)

    def to_dict(self, *, with_record: bool = False) -> dict[str, Any]:
        """JSON-ready dict (``record`` left out unless ``with_record``)."""
        d = asdict(self)
        if not with_record:
            d.pop("record")
        return d


def _interpreter_hint(host) -> str:
    from .sandbox import SANDBOX_HOST, sandbox_python

    if host.name == SANDBOX_HOST and host.transport == "local" and host.python == str(sandbox_python()):
        return ("the embedded sandbox target is not built yet: run `sglpatch demo` (or "
                "`bash scripts/demo.sh`) once, which creates it")
    return (f"set `python:` of host {host.name!r} in {_inv(host)} to the absolute path of the "
            f"interpreter that has sglang (on the host, inside its env: `command -v python`)")


def _inv(host) -> str:
    """The inventory file ``host`` was read from (hints say where to fix it)."""
    return str(getattr(host, "inventory_file", "the inventory file"))


def discover(transport: Transport, host, *, record: bool = True,
             timeout: float | None = 120) -> HostInfo:
    """Probe ``host`` (an inventory Host) over ``transport`` in one round trip.

    Returns :class:`HostInfo`. Raises DiscoveryError (see the module doc), TransportError when the
    host cannot be reached (or ``sudo -n`` needs a password).
    """
    py = host.python
    try:
        out = call_json(transport, py, "probe", "probe", {"record": record, "state_dir": host.state_dir},
                        sudo=host.sudo, timeout=timeout)
    except RemoteCommandError as exc:
        text = (exc.stderr or "") + (exc.stdout or "")
        if "a password is required" in text or "a terminal is required" in text:
            raise TransportError(f"{host.name}: `sudo -n` needs a password for {host.address}",
                                 hint="allow passwordless sudo for that user on the host, or set "
                                      f"`sudo: false` in {_inv(host)}") from exc
        if host.sudo and re.search(r"\bsudo: (command )?not found", text):
            raise TransportError(f"{host.name}: `sudo` is not installed on {host.address}",
                                 hint=f"install sudo there, or set `sudo: false` in {_inv(host)}") from exc
        missing = exc.returncode in (126, 127) or (
            host.sudo and "command not found" in text)
        if missing:
            what = "is not executable" if exc.returncode == 126 else "does not exist"
            raise DiscoveryError(f"{host.name}: interpreter {py} {what} on the host",
                                 hint=_interpreter_hint(host)) from exc
        if exc.returncode == 0:   # it ran, but printed no JSON: not a Python that ran our probe
            raise DiscoveryError(f"{host.name}: {py} ran but did not answer the probe: it is not a "
                                 f"CPython >= 3.8 interpreter", hint=_interpreter_hint(host)) from exc
        raise DiscoveryError(f"{host.name}: probing {py} failed (exit {exc.returncode}): "
                             f"{exc.message}", hint="rerun with --debug; is it a CPython >= 3.8?") from exc
    if not out.get("ok", False):
        raise DiscoveryError(f"{host.name}: probe failed: {out.get('error')}")
    return _interpret(host, py, out)


def _interpret(host, py: str, out: dict[str, Any]) -> HostInfo:
    dists = [Distribution(name=d["name"], version=d["version"], location=d.get("location"),
                          dist_info=d.get("dist_info"), editable=bool(d.get("editable")),
                          has_record=bool(d.get("has_record")), direct_url=d.get("direct_url"))
             for d in out.get("distributions", [])]
    if not dists:
        extra = ""
        if out.get("package_dir"):
            extra = f" (an `sglang` package at {out['package_dir']} has no distribution metadata)"
        raise DiscoveryError(
            f"{host.name}: no SGLang distribution is visible to {py} (Python "
            f"{out.get('python_version')}, prefix {out.get('prefix')}){extra}",
            hint=f"install sglang into that environment, or fix `python:` in {_inv(host)} "
                 f"({_interpreter_hint(host)})")
    if len(dists) > 1:
        listing = "; ".join(d.describe() for d in dists)
        err = DiscoveryError(
            f"{host.name}: {len(dists)} SGLang installs are visible to {py}: {listing}",
            hint="refusing to guess which one runs; uninstall the extra ones (user site: "
                 "`python -m pip uninstall --user sglang`; stray .pth/PYTHONPATH entries) so "
                 "exactly one remains")
        err.distributions = dists   # for `hosts --check` style reports
        raise err
    dist = dists[0]
    if dist.editable:
        raise DiscoveryError(
            f"{host.name}: SGLang {dist.version} is an editable install ({dist.location})",
            hint="sglpatch patches installed wheels; patch the checkout with git, or install a "
                 "wheel into that environment")
    pkg = out.get("package_dir")
    if not pkg:
        why = f" ({out['find_spec_error']})" if out.get("find_spec_error") else ""
        raise DiscoveryError(
            f"{host.name}: the sglang {dist.version} distribution at {dist.location} has no "
            f"importable `sglang` package{why}",
            hint="the install is broken; reinstall it (pip install --force-reinstall --no-deps "
                 f"sglang=={dist.version})")
    site = out.get("site_packages") or os.path.dirname(pkg)
    if dist.location and os.path.normpath(dist.location) != os.path.normpath(site):
        raise DiscoveryError(
            f"{host.name}: `import sglang` resolves to {pkg}, but the installed distribution "
            f"({dist.describe()}) is elsewhere",
            hint="something on sys.path (PYTHONPATH, a .pth file, the working directory) shadows "
                 "the install; remove it so the package and its metadata agree")
    return HostInfo(
        host=host.name, interpreter=py, executable=out.get("executable") or py,
        python_version=out.get("python_version", "?"), sglang_version=dist.version,
        site_packages=site, package_dir=pkg, dist_info=dist.dist_info or "",
        distributions=dists, writable=bool(out.get("writable")),
        free_bytes=int(out.get("free_bytes") or 0), user=out.get("user"),
        unwritable_count=int(out.get("unwritable_count") or 0),
        unwritable=list(out.get("unwritable") or []), unwritable_why=dict(out.get("unwritable_why") or {}),
        site_packages_why=out.get("site_packages_why"), state_dir=out.get("state_dir"),
        state_dir_why=out.get("state_dir_why"), has_record=dist.has_record,
        record=dict(out.get("record") or {}))


__all__ = ["Distribution", "HostInfo", "discover"]
