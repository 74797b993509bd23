"""An SGLang server on a host, started and always stopped by sglpatch (``check`` level 2/3, ``bench``).

The server runs as a detached process group on the host (``remote/server_agent.py``), under the
host's interpreter, reached over the same transport as everything else: requests go from the
agent on the host to ``127.0.0.1:<port>``, so no port is forwarded or opened to the network.
:class:`RemoteServer` is a context manager: the server is stopped (its whole process group) when
the block ends — by success, an error, a timeout or Ctrl-C. A server left running by an earlier
run that could not stop it (a crashed client, a killed SSH session) is a *leftover*: a new start
refuses while one runs and names it; ``stop_leftovers`` stops them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from ..discovery import HostInfo
from ..errors import CheckFailedError, ConfigError
from ..inventory import Host
from ..remote.launcher import call_json
from ..transport.base import Transport
from .profile import DDTreeSettings, ServeProfile

SCRIPT = "server_agent"
LOADING_EVERY_S = 30   # while a server loads: its newest line when it changes, else this often
# told each step of a server's life: a line of text, or a rich Text for the server's own output
# (never read as markup: SGLang's lines hold brackets such as "[rank0]:" or "[/...]")
Progress = Callable[[Any], None]

# terminal escape sequences in a server's output: CSI (colours, cursor moves), OSC (titles,
# links), and the two-byte ones
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def readable_lines(text: str) -> list[str]:
    """The lines of a server's log as a person reads them: escape sequences (colours, cursor
    moves) removed, a line a progress bar rewrote in place with ``\\r`` shown as its last state,
    other control characters dropped, blank lines left out; each line whole."""
    out = []
    for raw in _ANSI.sub("", text).split("\n"):
        states = [part for part in raw.split("\r") if part.strip()]
        if states:
            line = _CONTROL.sub("", states[-1]).rstrip()
            if line.strip():
                out.append(line)
    return out


class ServerError(CheckFailedError):
    """The server did not start, died, or did not answer; carries its log tail."""

    def __init__(self, message: str, *, log_tail: str = "", hint: str | None = None):
        tail = "\n".join(readable_lines(log_tail)[-25:])
        super().__init__(message + ("\n  server log (last lines):\n    " + tail.replace("\n", "\n    ")
                                    if tail else ""), hint=hint)
        self.log_tail = log_tail


def servers_dir(host: Host, info: HostInfo) -> str:
    """Where server records and logs live on the host: ``<state dir>/servers`` (for a ``sudo: true``
    host, whose state dir is root's, ``~/.sglpatch/servers`` of the login user)."""
    if host.sudo:
        return "~/.sglpatch/servers"
    base = host.state_dir or f"{info.site_packages.rstrip('/')}/.sglpatch"
    return f"{base}/servers"


def launch_argv(host: Host, profile: ServeProfile, algorithm: str, port: int,
                ddtree: DDTreeSettings | None = None) -> list[str]:
    """``python -m sglang.launch_server`` for ``algorithm`` ("none" | "DFLASH" | "DDTREE").

    Raises ConfigError when a speculative algorithm is asked of a profile without ``draft_model``.
    """
    argv = [host.python, "-m", "sglang.launch_server", "--model-path", profile.model,
            "--host", "127.0.0.1", "--port", str(port), *profile.args]
    if algorithm == "none":
        return argv
    if not profile.draft_model:
        raise ConfigError(f"host {host.name}: {algorithm} needs a draft model",
                          hint=f"set serve.draft_model for {host.name} in the inventory "
                               "(the DFlash draft model's path on the host)")
    argv += ["--speculative-algorithm", algorithm, "--speculative-draft-model-path",
             profile.draft_model, *profile.dflash_args]
    if algorithm == "DDTREE":
        argv += (ddtree or profile.ddtree).flags()
    return argv


def check_model_paths(transport: Transport, host: Host, profile: ServeProfile, *, draft: bool = True) -> None:
    """Before any server starts: ``serve.model`` (and ``serve.draft_model`` when ``draft``) that
    are paths on the host — absolute, or starting with ``~`` — exist there and the login user can
    read them (one round trip). Other values (a Hugging Face id such as ``Qwen/Qwen3-8B``) are
    SGLang's to resolve. Raises :class:`ConfigError` (exit 2) whose first line names the host, the
    profile key and the path, with the nearest directory that does exist and what it holds."""
    keys = [("model", profile.model)] + ([("draft_model", profile.draft_model)] if draft and profile.draft_model else [])
    keys = [(k, v) for k, v in keys if v.startswith(("/", "~"))]
    if not keys:
        return
    ans = call_json(transport, host.python, SCRIPT, "paths", {"paths": [v for _k, v in keys]}, timeout=60)
    found = ans.get("paths", {})
    where = getattr(host, "inventory_file", "hosts.yaml")
    for key, path in keys:
        f = found.get(path) or {}
        if f.get("exists") and f.get("readable"):
            continue
        if f.get("exists"):
            raise ConfigError(f"{host.name}: serve.{key} {path} cannot be read by the login user on {host.name}",
                              hint=f"give that user read access to it on {host.name}, or point serve.{key} of "
                                   f"{host.name} in {where} at a copy it can read")
        if f.get("expanded_exists"):
            raise ConfigError(f"{host.name}: serve.{key} {path} is not a path the server can open on {host.name}: "
                              "it is started without a shell, so ~ is not expanded",
                              hint=f"write the absolute path: serve.{key}: {f['expanded']} for {host.name} in {where}")
        near = _nearest(f)
        raise ConfigError(f"{host.name}: serve.{key} {path} does not exist on {host.name} (paths in the serve "
                          f"profile are on the host){near}",
                          hint=f"fix serve.{key} of host {host.name} in {where} (the {'DFlash draft ' if key == 'draft_model' else ''}"
                               f"model's directory on {host.name}), or copy the model there; nothing was started")


def _nearest(found: dict[str, Any]) -> str:
    """What the nearest existing directory above a missing path says about it (the agent's
    ``paths`` answer): entries named like the missing name first (a typo); the whole listing only
    when that directory is the path's own parent (the models' folder), never an unrelated one
    such as /tmp above a missing subtree; "" when nothing is known."""
    parent, entries = found.get("parent"), found.get("entries")
    if not parent or entries is None:
        return ""
    name, close = found.get("missing"), found.get("close") or []
    if close:
        return f"; {parent} holds {', '.join(close)} (named like {name})"
    if found.get("direct", True):
        return (f"; the nearest directory there, {parent}, holds: "
                + (", ".join(entries) + (f" and {found['more']} more" if found.get("more") else "")
                   if entries else "nothing"))
    return f"; the nearest directory there, {parent}, has no {name}" if name else ""


@dataclass
class RemoteServer:
    """One server start on a host (see the module docstring). Use as a context manager."""

    transport: Transport
    host: Host
    info: HostInfo
    profile: ServeProfile
    name: str
    argv_for_port: Callable[[int], list[str]]
    progress: Progress | None = None
    port: int | None = None
    pid: int | None = None
    log: str | None = None
    ready_s: float | None = None
    _dir: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        self._dir = servers_dir(self.host, self.info)

    # -- plumbing ---------------------------------------------------------------------------
    def _call(self, op: str, args: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        return call_json(self.transport, self.host.python, SCRIPT, op, args, timeout=timeout)

    def _say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    def log_tail(self, nbytes: int = 6000) -> str:
        try:
            return str(self._call("log_tail", {"name": self.name, "servers_dir": self._dir,
                                               "bytes": nbytes}).get("text", ""))
        except Exception:  # the log is a courtesy in an error path
            return ""

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> "RemoteServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start on the first free port of the profile. Raises ServerError naming a leftover
        server or, when every port is taken, the ports."""
        ports = list(self.profile.ports)
        for port in ports:
            argv = self.argv_for_port(port)
            ans = self._call("start", {"name": self.name, "argv": argv, "port": port,
                                       "env": self.profile.environment(), "servers_dir": self._dir})
            if ans.get("ok", True):
                self.port, self.pid, self.log = port, int(ans["pid"]), str(ans["log"])
                self._say(f"started {self.name} on port {port} (pid {self.pid}, log {self.log})")
                return
            if ans.get("kind") == "port_in_use":
                continue
            if ans.get("kind") == "leftover":
                srv = ans.get("server", {})
                raise ServerError(
                    f"{self.host.name}: {ans.get('error')}",
                    hint=f"stop it with `sglpatch check --host {self.host.name} --stop-leftovers` "
                         f"(or kill process group {srv.get('pgid', srv.get('pid'))} on the host); its log "
                         f"is {srv.get('log')}")
            raise ServerError(f"{self.host.name}: {ans.get('error')}")
        span = f"port {ports[0]}" if len(ports) == 1 else f"ports {ports[0]}-{ports[-1]}"
        raise ServerError(f"{self.host.name}: {span} in use by another process",
                          hint=f"free it, or give serve.port a free port or a range (e.g. "
                               f"{ports[0]}-{ports[0] + 10}) for {self.host.name} in the inventory")

    def wait_ready(self, timeout: float | None = None) -> float:
        """Poll ``/health`` until it answers; seconds taken. Raises ServerError (with the log tail)
        when the server exits first or ``timeout`` (default: the profile's) passes."""
        limit = self.profile.start_timeout if timeout is None else timeout
        t0 = time.monotonic()
        last_line = ""
        said_at = -LOADING_EVERY_S
        while True:
            ans = self._call("poll", {"name": self.name, "servers_dir": self._dir, "timeout_s": 2,
                                      "tail_bytes": 3000})
            tail = str(ans.get("log_tail", ""))
            if ans.get("healthy"):
                self.ready_s = time.monotonic() - t0
                self._say(f"{self.name}: ready after {self.ready_s:.0f} s")
                return self.ready_s
            if not ans.get("alive", False):
                raise ServerError(f"{self.host.name}: the server ({self.name}) exited before it was "
                                  "ready", log_tail=tail,
                                  hint=f"the whole log is {self.log} on {self.host.name}")
            waited = time.monotonic() - t0
            if waited > limit:
                raise ServerError(f"{self.host.name}: the server ({self.name}) did not answer "
                                  f"/health within {limit:.0f} s", log_tail=tail,
                                  hint="raise serve.start_timeout if it is still loading")
            lines = readable_lines(tail)
            if (lines and lines[-1] != last_line) or waited - said_at >= LOADING_EVERY_S:
                last_line = lines[-1] if lines else last_line   # the server's newest line, whole
                said_at = waited
                self._say(Text.assemble(f"{self.name}: loading ({waited:.0f} s) ", (last_line, "dim")))
            time.sleep(2)

    def stop(self) -> None:
        """Stop the server's process group (TERM, then KILL); safe to call twice."""
        if self.pid is None:
            return
        try:
            self._call("stop", {"name": self.name, "servers_dir": self._dir, "grace_s": 30},
                       timeout=90)
            self._say(f"stopped {self.name}")
        finally:
            self.pid = None

    def alive(self) -> bool:
        """Whether the server's process still runs."""
        ans = self._call("poll", {"name": self.name, "servers_dir": self._dir, "timeout_s": 2,
                                  "tail_bytes": 0})
        return bool(ans.get("alive", False))

    def request_failure(self, what: str, bad: Sequence[dict[str, Any]], total: int) -> ServerError:
        """The error for ``bad`` failed requests of ``total`` (``what``: which requests), saying
        whether the server died, with its log tail."""
        died = not self.alive()
        return ServerError(f"{self.host.name}: {len(bad)} of {total} {what} to {self.name} failed"
                           + (" — the server died during the run" if died else "")
                           + f": {str(bad[0].get('error', ''))[:300]}", log_tail=self.log_tail(),
                           hint=f"the whole log is {self.log} on {self.host.name}")

    # -- requests ---------------------------------------------------------------------------
    def generate(self, requests: Sequence[dict[str, Any]], concurrency: int = 1,
                 timeout: float = 1800) -> list[dict[str, Any]]:
        """POST /generate for each request (``concurrency`` at a time); results in order. Raises
        ServerError when the server fails a request or dies."""
        ans = self._call("generate", {"port": self.port, "requests": list(requests),
                                      "concurrency": concurrency, "timeout_s": timeout},
                         timeout=timeout + 60)
        results = list(ans.get("results", []))
        bad = [r for r in results if "error" in r]
        if bad:
            raise self.request_failure("requests", bad, len(results))
        return results

    def stream(self, requests: Sequence[dict[str, Any]], concurrency: int,
               timeout: float = 3600) -> tuple[list[dict[str, Any]], float]:
        """Streamed requests (``bench``): per request output tokens, latency, time to first token;
        and the wall time of the whole set."""
        ans = self._call("bench", {"port": self.port, "requests": list(requests),
                                   "concurrency": concurrency, "timeout_s": timeout},
                         timeout=timeout + 60)
        return list(ans.get("results", [])), float(ans.get("wall_s", 0.0))

    def has_module(self, name: str) -> bool:
        """Whether the host's interpreter can import ``name`` (found, not imported)."""
        return bool(self._call("has_module", {"name": name}).get("found"))

    def sglang_client(self, prompts: Sequence[str], requests: int, max_new_tokens: int,
                      concurrency: int, timeout: float = 3600) -> dict[str, Any]:
        """SGLang's own benchmark client (``python -m sglang.benchmark.serving``, its ``custom``
        dataset made of ``prompts``) against this server, run on the host: its result record
        (``output_throughput``, ``median_tpot_ms``, ``median_ttft_ms``, ``completed``,
        ``total_output_tokens``, ``accept_length``: the server's running average). Raises
        ServerError with the client's output when it fails."""
        base = f"{self._dir}/{self.name}-client-c{concurrency}"
        dataset = "".join(json.dumps({"conversations": [
            {"from": "human", "value": prompts[i % len(prompts)]}, {"from": "gpt", "value": "ok"}]}) + "\n"
            for i in range(requests))
        argv = [self.host.python, "-m", "sglang.benchmark.serving", "--backend", "sglang",
                "--host", "127.0.0.1", "--port", str(self.port), "--model", self.profile.model,
                "--dataset-name", "custom", "--dataset-path", f"{base}.jsonl",
                "--num-prompts", str(requests), "--sharegpt-output-len", str(max_new_tokens),
                "--max-concurrency", str(concurrency), "--output-file", f"{base}-result.jsonl",
                "--disable-tqdm", "--seed", "1"]
        ans = self._call("run_client", {"argv": argv, "env": self.profile.environment(),
                                        "files": {f"{base}.jsonl": dataset},
                                        "read": f"{base}-result.jsonl", "timeout_s": timeout},
                         timeout=timeout + 60)
        lines = [ln for ln in str(ans.get("read_text", "")).splitlines() if ln.strip()]
        if ans.get("exit_code") != 0 or not lines:
            died = "" if self.alive() else " — the server died during the run"
            raise ServerError(f"{self.host.name}: SGLang's benchmark client against {self.name} failed "
                              f"(exit {ans.get('exit_code')}){died}:\n    "
                              + "\n    ".join(str(ans.get("output_tail", "")).strip().splitlines()[-12:]),
                              log_tail=self.log_tail() if died else "")
        return dict(json.loads(lines[-1]))

    def server_info(self) -> dict[str, Any]:
        ans = self._call("server_info", {"port": self.port})
        return dict(ans.get("info", {})) if ans.get("ok", True) else {}


def list_servers(transport: Transport, host: Host, info: HostInfo) -> list[dict[str, Any]]:
    """The servers sglpatch recorded on the host, with ``alive``."""
    ans = call_json(transport, host.python, SCRIPT, "list", {"servers_dir": servers_dir(host, info)})
    return list(ans.get("servers", []))


def stop_server(transport: Transport, host: Host, info: HostInfo, name: str) -> dict[str, Any]:
    """Stop the recorded server ``name`` (a leftover)."""
    return call_json(transport, host.python, SCRIPT, "stop",
                     {"name": name, "servers_dir": servers_dir(host, info), "grace_s": 30}, timeout=90)
