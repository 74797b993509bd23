"""Drive a real SGLang (CPU, live venv) from the tests: engine runs, their results, comparisons.

The engines run in the live venv's interpreter (``tests/live/engine_driver.py``), several per
interpreter start; this module builds their jobs and reads their results back. Nothing here
imports SGLang.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import live_env

DRIVER = live_env.LIVE_DIR / "engine_driver.py"


@dataclass(frozen=True)
class Phase:
    """Prompts sent one at a time (``batch=False``) or as one batched generate call; ``sampling``
    is one dict for all, or a list of one per prompt."""

    name: str
    prompts: tuple[str, ...]
    sampling: dict | list[dict]
    batch: bool = False

    def to_job(self) -> dict:
        return {"name": self.name, "prompts": list(self.prompts), "sampling": self.sampling,
                "batch": self.batch}


@dataclass(frozen=True)
class EngineSpec:
    """One ``sglang.Engine(**kwargs)`` and the phases to run on it."""

    name: str
    kwargs: dict
    phases: tuple[Phase, ...]

    def to_job(self) -> dict:
        return {"name": self.name, "kwargs": self.kwargs, "phases": [p.to_job() for p in self.phases]}


@dataclass
class Generation:
    prompt: str
    output_ids: list[int]
    text: str
    meta: dict


@dataclass
class EngineRun:
    """What one engine produced: phases by name -> generations in prompt order, or an error."""

    name: str
    ok: bool
    error: str = ""
    traceback: str = ""
    init_s: float = 0.0
    phases: dict[str, list[Generation]] = field(default_factory=dict)
    phase_wall_s: dict[str, float] = field(default_factory=dict)
    server_info: dict = field(default_factory=dict)
    log: str = ""          # this engine's part of the driver's output (SGLang's own errors)

    @classmethod
    def from_json(cls, d: dict) -> "EngineRun":
        run = cls(d["name"], bool(d["ok"]), d.get("error", ""), d.get("traceback", ""),
                  float(d.get("init_s", 0.0)), server_info=d.get("server_info") or {})
        for ph in d.get("phases", []):
            run.phases[ph["name"]] = [Generation(r["prompt"], list(r["output_ids"] or []),
                                                 r.get("text") or "", r.get("meta") or {})
                                      for r in ph["results"]]
            run.phase_wall_s[ph["name"]] = float(ph["wall_s"])
        return run

    def accept_lengths(self, phase: str) -> list[float | None]:
        return [g.meta.get("spec_accept_length") for g in self.phases.get(phase, [])]


def cpu_engine_kwargs(target: Path, **extra: object) -> dict:
    """``sglang.Engine`` kwargs for the CPU platform: :data:`live_env.CPU_ENGINE_ARGS` + extra."""
    kw = dict(live_env.CPU_ENGINE_ARGS, model_path=str(target))
    kw.update(extra)
    return kw


def speculative_kwargs(target: Path, draft: Path, algorithm: str, **extra: object) -> dict:
    """Engine kwargs for DFLASH / DDTREE with ``draft`` (triton draft attention)."""
    return cpu_engine_kwargs(target, speculative_algorithm=algorithm,
                             speculative_draft_model_path=str(draft),
                             **live_env.SPECULATIVE_DRAFT_ARGS, **extra)


class DriverError(AssertionError):
    """The driver process itself failed (not an engine inside it)."""


def run_engines(python: str, engines: list[EngineSpec], workdir: Path, *,
                timeout: float | None = None, env: dict[str, str] | None = None) -> dict[str, EngineRun]:
    """Run ``engines`` one after another in one driver process of the venv ``python``.

    ``timeout`` (seconds, for the whole driver) is a guard against a hung engine, not a speed
    goal: by default 300 s an engine (at least 900 s), since a 2-core CI box with cold Triton
    caches and a second test worker takes minutes for one engine's start and phases.

    Returns {engine name: EngineRun} (a failed start is an EngineRun with ``ok=False``).
    Raises DriverError (with the driver's log tail) when the driver dies or times out before
    writing a result for every engine.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    stamp = f"{int(time.time() * 1000)}"
    job, out, log = (workdir / f"job-{stamp}.json", workdir / f"out-{stamp}.json",
                     workdir / f"driver-{stamp}.log")
    job.write_text(json.dumps({"engines": [e.to_job() for e in engines]}, indent=1))
    if timeout is None:
        timeout = max(900.0, 300.0 * len(engines))
    with open(log, "wb") as logf:
        try:
            proc = subprocess.run([python, str(DRIVER), str(job), str(out)], stdout=logf,
                                  stderr=subprocess.STDOUT, env=live_env.sglang_env(env),
                                  timeout=timeout, cwd=workdir)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
    results = json.loads(out.read_text())["engines"] if out.exists() else []
    runs = {r["name"]: EngineRun.from_json(r) for r in results}
    parts = split_log(log.read_bytes().decode(errors="replace"))
    for name, part in parts.items():
        if name in runs:
            runs[name].log = part
        elif rc is not None:
            # SGLang's engine kills its own process (SIGQUIT from a failed scheduler child):
            # the engine that was starting failed, the driver with it
            runs[name] = EngineRun(name, False, error=f"the driver process died (exit {rc}) while "
                                   "this engine ran", log=part)
    missing = [e.name for e in engines if e.name not in runs]
    if missing:
        tail = log.read_bytes()[-4000:].decode(errors="replace")
        what = "timed out" if rc is None else f"exited {rc}"
        raise DriverError(f"engine driver {what} before running {missing} (log {log}):\n{tail}")
    return runs


def split_log(text: str) -> dict[str, str]:
    """The driver's output cut at its per-engine MARK lines: {engine name: its part}."""
    mark = "=== engine_driver: engine "
    parts: dict[str, str] = {}
    for chunk in text.split(mark)[1:]:
        name, _, rest = chunk.partition("\n")
        parts[name.strip()] = rest
    return parts


def token_mismatches(expected: EngineRun, actual: EngineRun, phase: str) -> list[str]:
    """One line per prompt whose ``actual`` output ids differ from ``expected`` (phase ``phase``),
    naming the first differing position; [] when all are identical."""
    lines = []
    exp, act = expected.phases[phase], actual.phases[phase]
    if len(exp) != len(act):
        return [f"{phase}: {len(exp)} results expected, {len(act)} came"]
    for e, a in zip(exp, act):
        if e.output_ids == a.output_ids:
            continue
        first = next((i for i, (x, y) in enumerate(zip(e.output_ids, a.output_ids)) if x != y),
                     min(len(e.output_ids), len(a.output_ids)))
        lines.append(f"{actual.name} {phase} {e.prompt!r}: differs from {expected.name} at token "
                     f"{first}: {e.output_ids[first:first + 6]} vs {a.output_ids[first:first + 6]}")
    return lines


@dataclass(frozen=True)
class ModelFixture:
    """One tiny model fixture: a target, its DFlash drafts by block size, its prompts."""

    name: str
    root: Path
    target: Path
    drafts: dict[int, Path]
    prompts: tuple[str, ...]
    info: dict

    @classmethod
    def load(cls, root: Path) -> "ModelFixture":
        info = json.loads((root / "fixture.json").read_text())
        drafts = {int(p.name.removeprefix("draft-b")): p for p in sorted(root.glob("draft-b*"))}
        return cls(root.name, root, root / "target", drafts, tuple(info["prompts"]), info)


class LiveRecord:
    """Accept lengths and timings of the session's engine runs, for the terminal summary and
    (with ``$SGLPATCH_LIVE_RECORD=FILE``) a JSON file."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add_runs(self, fixture: str, runs: dict) -> None:
        for name, run in runs.items():
            row = {"fixture": fixture, "engine": name, "ok": run.ok, "init_s": run.init_s}
            for phase, gens in run.phases.items():
                acc = [g.meta.get("spec_accept_length") for g in gens]
                row[f"{phase}_accept"] = [round(a, 2) if a else None for a in acc]
                row[f"{phase}_wall_s"] = run.phase_wall_s.get(phase)
            self.rows.append(row)

    def table(self) -> list[str]:
        lines = [f"{'fixture':8} {'engine':26} {'init s':>6} {'single accept':>18} "
                 f"{'batch accept (mean)':>20} {'batch s':>7}"]
        for r in self.rows:
            b = [a for a in r.get("batch_accept", []) if a]
            mean = f"{sum(b) / len(b):.2f}" if b else "-"
            single = ",".join(f"{a:.2f}" if a else "-" for a in r.get("single_accept", []))
            lines.append(f"{r['fixture']:8} {r['engine']:26} {r['init_s']:6.1f} {single:>18} "
                         f"{mean:>20} {r.get('batch_wall_s') or 0:7.1f}")
        return lines


def server_argv(python: str, target: Path, *, port: int, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``python -m sglang.launch_server`` on the CPU platform (flags from CPU_ENGINE_ARGS)."""
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(target),
            "--host", "127.0.0.1", "--port", str(port)]
    for key, value in live_env.CPU_ENGINE_ARGS.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, str(value)]
    return argv + list(extra)


def speculative_flags(draft: Path, algorithm: str, **extra: object) -> list[str]:
    """launch_server flags for DFLASH / DDTREE with ``draft`` (triton draft attention)."""
    flags = ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(draft)]
    for key, value in dict(live_env.SPECULATIVE_DRAFT_ARGS, **extra).items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m sglang.launch_server`` in its own process group, logging to ``log``; stopped
    (the whole group) by :meth:`stop` or on leaving a ``with`` block."""

    def __init__(self, argv: list[str], log: Path, port: int) -> None:
        self.argv, self.log, self.port = argv, log, port
        self.url = f"http://127.0.0.1:{port}"
        self._logf = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._logf, stderr=subprocess.STDOUT,
                                     env=live_env.sglang_env(), cwd=log.parent, start_new_session=True)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, n: int = 4000) -> str:
        self._logf.flush()
        return self.log.read_bytes()[-n:].decode(errors="replace")

    def wait_healthy(self, timeout: float = 400) -> float:
        """Seconds until ``/health`` answered 200; AssertionError (with the log tail) when the
        server exits first or ``timeout`` passes."""
        import urllib.request

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode} before /health:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(1)
        raise AssertionError(f"no /health within {timeout} s:\n{self.log_tail()}")

    def post(self, path: str, body: dict, timeout: float = 600) -> dict:
        import urllib.request

        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def get(self, path: str, timeout: float = 30) -> dict:
        import urllib.request

        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return json.loads(r.read())

    def stop(self, grace: float = 20) -> None:
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        try:   # SGLang's scheduler/detokenizer children share the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._logf.close()
