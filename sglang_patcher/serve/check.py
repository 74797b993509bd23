"""``sglpatch check``: levels 2 and 3, against a real SGLang server started on the host.

* **L2** — the server starts with the host's profile (DDTREE when the profile has a draft model,
  else no speculation), ``/health`` answers within ``serve.start_timeout``, one greedy
  ``/generate`` returns tokens; the server is stopped.
* **L3** — the same prompts, greedy (temperature 0), through DDTREE, the target alone and DFLASH,
  one server start each: DFLASH's and DDTREE's token ids must equal the target's, prompt for prompt
  (one request at a time, then all at once). SGLang's own accept lengths are reported, not judged.
  DDTREE's start comes first and is L2's proof at level 3 (no separate L2 start).

Levels 0 and 1 are the patchset's own smoke checks (:mod:`sglang_patcher.checks`). Each level
becomes :class:`~sglang_patcher.checks.CheckResult` rows of the one report; a failed level carries
the server's log tail in its detail.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checks import CheckReport, CheckResult
from ..discovery import HostInfo
from ..errors import ConfigError
from ..inventory import Host
from ..transport.base import Transport
from .profile import ServeProfile
from .server import Progress, RemoteServer, ServerError, launch_argv

# Prompts for check level 2/3 when the user gives none: short, ordinary text of a few kinds.
BUILTIN_PROMPTS = (
    "The capital of France is",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List the planets of the solar system in order from the sun:",
    "Explain in one paragraph why the sky is blue.",
)


def load_prompts(path: str | Path | None) -> list[str]:
    """Prompts from ``path`` (a JSON list of strings, or one prompt per non-empty line), or the
    built-in ones. Raises ConfigError naming the file when it cannot be read or holds none."""
    if path is None:
        return list(BUILTIN_PROMPTS)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the prompts file {p}: {exc.strerror or exc}",
                          hint="give a file with one prompt per line, or a JSON list of strings") from exc
    prompts: list[str]
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{p}: not valid JSON ({exc})",
                              hint="a JSON prompts file is a list of strings") from exc
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise ConfigError(f"{p}: a JSON prompts file must be a list of strings")
        prompts = [x for x in data if x.strip()]
    else:
        prompts = [ln for ln in text.splitlines() if ln.strip()]
    if not prompts:
        raise ConfigError(f"{p} holds no prompt", hint="one prompt per line, or a JSON list of strings")
    return prompts


def greedy_request(prompt: str, max_new_tokens: int) -> dict[str, Any]:
    return {"text": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens,
                                                "ignore_eos": True}}


@dataclass
class ArmOutput:
    """What one server start (one algorithm) returned for the prompts."""

    algorithm: str
    one_at_a_time: list[list[int]] = field(default_factory=list)
    all_at_once: list[list[int]] = field(default_factory=list)
    accept_lengths: list[float | None] = field(default_factory=list)
    ready_s: float | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "accept_lengths": self.accept_lengths,
                "ready_s": self.ready_s, "seconds": round(self.seconds, 2),
                "output_ids": self.one_at_a_time, "output_ids_concurrent": self.all_at_once}


ServerFactory = Callable[[str, str], RemoteServer]   # (name, algorithm) -> a server not yet started


def server_factory(transport: Transport, host: Host, info: HostInfo, profile: ServeProfile,
                   progress: Progress | None = None) -> ServerFactory:
    def make(name: str, algorithm: str) -> RemoteServer:
        return RemoteServer(transport, host, info, profile, name,
                            lambda port: launch_argv(host, profile, algorithm, port), progress)
    return make


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%S")


def run_l2(make: ServerFactory, profile: ServeProfile, prompt: str) -> list[CheckResult]:
    """Start (DDTREE when the profile can), wait for /health, one /generate, stop."""
    algorithm = "DDTREE" if profile.draft_model else "none"
    name = f"check-l2-{_stamp()}"
    t0 = time.monotonic()
    try:
        with make(name, algorithm) as server:
            ready = server.wait_ready()
            out = server.generate([greedy_request(prompt, profile.max_new_tokens)])[0]
    except ServerError as exc:
        return [CheckResult("L2", f"server start ({algorithm})", "failed", str(exc))]
    ids = out.get("output_ids") or []
    meta = out.get("meta_info", {})
    if not ids:
        return [CheckResult("L2", f"server start ({algorithm})", "failed",
                            f"/generate returned no tokens: {json.dumps(out)[:500]}")]
    detail = (f"ready after {ready:.0f} s; {len(ids)} tokens in {out.get('latency_s', 0):.1f} s"
              + (f"; accept length {meta['spec_accept_length']:.2f}" if meta.get("spec_accept_length") else "")
              + f"; stopped ({time.monotonic() - t0:.0f} s in all)")
    return [CheckResult("L2", f"server start ({algorithm})", "passed", detail)]


def run_arm(make: ServerFactory, algorithm: str, prompts: Sequence[str], max_new_tokens: int) -> ArmOutput:
    """One server start: the prompts one at a time, then all at once. Raises ServerError."""
    arm = ArmOutput(algorithm)
    t0 = time.monotonic()
    requests = [greedy_request(p, max_new_tokens) for p in prompts]
    with make(f"check-l3-{algorithm.lower()}-{_stamp()}", algorithm) as server:
        arm.ready_s = server.wait_ready()
        single = [server.generate([r])[0] for r in requests]
        batch = server.generate(requests, concurrency=len(requests))
    arm.one_at_a_time = [list(r.get("output_ids") or []) for r in single]
    arm.all_at_once = [list(r.get("output_ids") or []) for r in batch]
    arm.accept_lengths = [r.get("meta_info", {}).get("spec_accept_length") for r in single]
    arm.seconds = time.monotonic() - t0
    return arm


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (the shorter length when one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_arms(base: ArmOutput, arm: ArmOutput, prompts: Sequence[str]) -> list[str]:
    """One line per prompt where ``arm``'s greedy tokens differ from the target alone's."""
    out = []
    for how, want_all, got_all in (("one at a time", base.one_at_a_time, arm.one_at_a_time),
                                   ("concurrent", base.all_at_once, arm.all_at_once)):
        for prompt, want, got in zip(prompts, want_all, got_all):
            i = first_difference(want, got)
            if i is not None:
                out.append(f"{arm.algorithm} ({how}) {prompt[:40]!r}: token {i} is "
                           f"{got[i:i + 4]} where the target alone gives {want[i:i + 4]}")
    return out


def l2_from_arm(arm: ArmOutput) -> CheckResult:
    """L2 as proven by an arm of L3 (its server started, answered and was stopped)."""
    n = len(arm.one_at_a_time[0]) if arm.one_at_a_time else 0
    ok = n > 0
    return CheckResult("L2", f"server start ({arm.algorithm})", "passed" if ok else "failed",
                       f"ready after {arm.ready_s or 0:.0f} s; {n} tokens for the first prompt; stopped"
                       if ok else "/generate returned no tokens")


def run_l3(make: ServerFactory, profile: ServeProfile, prompts: Sequence[str]) -> tuple[list[CheckResult], list[ArmOutput]]:
    """DDTREE, the target alone and DFLASH on ``prompts`` (one server start each); L2's result
    (DDTREE's start, first) and L3's, and the arms' outputs. DDTREE runs first: when it cannot
    start, L2 fails and the other two are not started."""
    if not profile.draft_model:
        return [CheckResult("L3", "greedy tokens equal the target's", "skipped",
                            "the host's serve profile has no draft_model")], []
    arms: dict[str, ArmOutput] = {}
    results: list[CheckResult] = []
    for algorithm in ("DDTREE", "none", "DFLASH"):
        try:
            arms[algorithm] = run_arm(make, algorithm, prompts, profile.max_new_tokens)
        except ServerError as exc:
            level = "L2" if algorithm == "DDTREE" else "L3"
            results.append(CheckResult(level, f"{'server start' if level == 'L2' else 'server'} ({algorithm})",
                                       "failed", str(exc)))
            if level == "L2":
                results.append(CheckResult("L3", "greedy tokens equal the target's", "skipped",
                                           "L2 failed: the DDTREE server does not start"))
            return results, list(arms.values())
        if algorithm == "DDTREE":
            results.append(l2_from_arm(arms[algorithm]))
    base = arms["none"]
    for arm in (arms["DFLASH"], arms["DDTREE"]):
        diffs = compare_arms(base, arm, prompts)
        acc = [a for a in arm.accept_lengths if a]
        mean = f"; accept length {sum(acc) / len(acc):.2f} (mean of {len(acc)})" if acc else ""
        if diffs:
            results.append(CheckResult("L3", f"{arm.algorithm} tokens equal the target's", "failed",
                                       "\n".join(diffs[:8]) + (f"\n… {len(diffs) - 8} more" if len(diffs) > 8 else "")))
        else:
            n = sum(len(x) for x in base.one_at_a_time)
            results.append(CheckResult("L3", f"{arm.algorithm} tokens equal the target's", "passed",
                                       f"{len(prompts)} prompts x 2 ways, {n} tokens each way{mean}"))
    return results, [arms["none"], arms["DFLASH"], arms["DDTREE"]]


@dataclass
class CheckRun:
    """The outcome of ``sglpatch check`` on one host: the report (all levels) and L3's arms."""

    report: CheckReport
    level: int
    arms: list[ArmOutput] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.report.gate_passed

    def to_json(self) -> dict[str, Any]:
        doc = self.report.to_json()
        doc.update({"level": self.level, "passed": self.passed,
                    "arms": [a.to_json() for a in self.arms]})
        return doc

    def __rich__(self):
        return self.report


def run_serving_levels(transport: Transport, host: Host, info: HostInfo, report: CheckReport,
                       level: int, prompts: Sequence[str], progress: Progress | None = None,
                       profile: ServeProfile | None = None) -> CheckRun:
    """Add L2 (level >= 2) and L3 (level 3) to ``report``, with ``profile`` (default: the host's
    serve profile; ``schedule_support.served_profile`` gives it as the deployed revision reads
    it). Raises ConfigError when the host has no serve profile."""
    profile = profile or host.serve
    if profile is None:
        raise ConfigError(f"host {host.name} has no serve profile: check level {level} starts a server",
                          hint=f"add `serve:` (model, draft_model, args...) to {host.name} in the "
                               "inventory, or use --level 1")
    make = server_factory(transport, host, info, profile, progress)
    out = CheckRun(report, level)
    t0 = time.monotonic()
    if level == 2 or not profile.draft_model:
        report.checks += run_l2(make, profile, prompts[0])
        report.seconds["L2"] = round(time.monotonic() - t0, 3)
        if level >= 3:
            report.checks += run_l3(make, profile, prompts)[0]
        return out
    # level 3: DDTREE's start in L3 is L2's proof (one server start fewer)
    results, out.arms = run_l3(make, profile, prompts)
    report.checks += results
    report.seconds["L2+L3"] = round(time.monotonic() - t0, 3)
    return out
