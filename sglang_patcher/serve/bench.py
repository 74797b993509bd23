"""``sglpatch bench``: throughput of the target alone, DFLASH and DDTREE on a host, side by side.

For each arm (no speculation, DFLASH, DDTREE at each budget) one server starts with the host's
serve profile; after a warm-up (DDTREE's first steps compile its Triton kernels) the same prompts
are sent at each concurrency level from the host itself — by SGLang's own benchmark client
(``python -m sglang.benchmark.serving``, its ``custom`` dataset) where the host's release has it,
else streamed by ``remote/server_agent.py`` (``bench``). Per arm and concurrency: output tokens/s (all output tokens / wall time), median time
per output token and time to first token over the requests, and SGLang's accept length (mean of the
per-request ``spec_accept_length``). With ``rounds`` > 1 the arms run again in rotated order and each
figure is the median over rounds, so a drift of the machine spreads over every arm alike.

Every run is appended to the local history (``$SGLPATCH_HOME/bench/history.jsonl``: host, SGLang
version, patchset and revision, model, arguments, figures); :func:`last_comparable` finds the
previous run of the same setup for ``--compare``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..discovery import HostInfo
from ..inventory import Host
from ..state import sglpatch_home
from ..transport.base import Transport
from .profile import DDTreeSettings, ServeProfile
from .schedule import AUTO, CHAIN, FIXED, Entry
from .server import Progress, RemoteServer, launch_argv

HISTORY = "bench/history.jsonl"


@dataclass(frozen=True)
class Arm:
    """One server configuration: ``algorithm`` none | DFLASH | DDTREE (with ``budget``/``topk``;
    ``schedule`` "fixed": every step at ``budget``; "auto": the worker's own planner chooses each
    step's budget up to ``budget``; a table "1:32,16:chain": the budget by running batch size,
    clamped at ``budget``; None: the server's default — ``default_auto`` says which it is, once
    :meth:`for_revision` has seen the deployed revision: auto from ddtree revision 13 on, the
    fixed budget before)."""

    algorithm: str
    budget: int | None = None
    topk: int | None = None
    schedule: str | None = None
    default_auto: bool = False

    @property
    def label(self) -> str:
        if self.algorithm != "DDTREE":
            return "target" if self.algorithm == "none" else self.algorithm
        size = (f"auto<={self.budget}" if self.schedule == AUTO or self.default_auto else
                f"schedule {self.schedule} (<=n{self.budget})" if self.schedule and self.schedule != FIXED
                else f"n{self.budget}")
        return f"DDTREE {size}" + (f" k{self.topk}" if self.topk else "")

    @property
    def row_schedule(self) -> str | None:
        """The schedule its rows record: "auto" (asked for or the default), a table, or None for
        a fixed budget (what ``choose_schedule`` picks among)."""
        return AUTO if self.default_auto else None if self.schedule == FIXED else self.schedule

    def for_revision(self, auto_default: bool) -> "Arm":
        """This arm as a ddtree revision reads it: ``auto_default`` (feature ``budget_auto_default``,
        revision 13 on: an unset schedule is auto) keeps ``fixed`` and marks an unset schedule as
        auto; before it ``fixed`` is left out (unset is the fixed budget there)."""
        if self.algorithm != "DDTREE":
            return self
        if self.schedule == FIXED and not auto_default:
            return replace(self, schedule=None)
        if self.schedule is None:
            return replace(self, default_auto=auto_default)
        return self

    def ddtree(self) -> DDTreeSettings | None:
        if self.algorithm != "DDTREE":
            return None
        return DDTreeSettings(budget=self.budget, topk=self.topk, budget_schedule=self.schedule)


@dataclass
class Row:
    """One arm at one concurrency (medians over rounds)."""

    arm: str
    algorithm: str
    budget: int | None
    concurrency: int
    requests: int
    output_tokens: int
    tok_s: float
    tpot_ms: float | None
    ttft_ms: float | None
    accept_length: float | None
    failed: int = 0
    schedule: str | None = None            # DDTREE's budget schedule ("auto"), None: a fixed budget


@dataclass
class BenchRun:
    """A whole ``bench`` run: its setup, rows, and where it was stored / drawn."""

    host: str
    sglang_version: str
    patchset: str | None
    revision: int | None
    model: str
    draft_model: str | None
    args: list[str]
    prompts: int
    max_new_tokens: int
    rounds: int
    started: str
    client: str = "sglpatch"                    # whose requests measured: sglang | sglpatch
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0
    history: str | None = None
    plot: str | None = None
    previous: dict[str, Any] | None = None      # the last comparable run (for --compare)
    schedule: str | None = None                 # --sweep: the budget schedule chosen
    schedule_written: str | None = None         # where it was written, or why not

    def setup_key(self) -> dict[str, Any]:
        """What must match for two runs to be compared."""
        return {"host": self.host, "sglang_version": self.sglang_version, "model": self.model,
                "draft_model": self.draft_model, "args": self.args, "max_new_tokens": self.max_new_tokens,
                "prompts": self.prompts, "client": self.client}

    def ratio(self, arm: str, base: str, concurrency: int) -> float | None:
        a = next((r for r in self.rows if r.arm == arm and r.concurrency == concurrency), None)
        b = next((r for r in self.rows if r.arm == base and r.concurrency == concurrency), None)
        return a.tok_s / b.tok_s if a and b and b.tok_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        return d

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        t = Table(title=f"bench on {self.host} (sglang {self.sglang_version}"
                        + (f", {self.patchset} r{self.revision}" if self.patchset else "")
                        + f"): {self.prompts} prompts, {self.max_new_tokens} new tokens each, "
                          f"{self.rounds} round(s), {self.client} client")
        for col in ("arm", "concurrency", "tokens/s", "vs DFLASH", "TPOT ms", "TTFT ms", "accept len"):
            t.add_column(col, justify="right" if col != "arm" else "left")
        prev = {(r["arm"], r["concurrency"]): r for r in (self.previous or {}).get("rows", [])}
        for r in sorted(self.rows, key=lambda r: (r.concurrency, r.arm)):
            ratio = self.ratio(r.arm, "DFLASH", r.concurrency) if r.algorithm == "DDTREE" else None
            tok = f"{r.tok_s:,.1f}"
            p = prev.get((r.arm, r.concurrency))
            if p and p.get("tok_s"):
                tok += f" ({(r.tok_s / p['tok_s'] - 1) * 100:+.0f}%)"
            t.add_row(r.arm, str(r.concurrency), tok, f"{ratio:.2f}x" if ratio else "",
                      f"{r.tpot_ms:.1f}" if r.tpot_ms is not None else "-",
                      f"{r.ttft_ms:.0f}" if r.ttft_ms is not None else "-",
                      f"{r.accept_length:.2f}" if r.accept_length else "-")
        parts: list[Any] = [t]
        if self.client == "sglang":
            parts.append(Text("measured by SGLang's own benchmark client; its accept length is the server's "
                              "running average, often absent for short runs (--client sglpatch gives each "
                              "request's own)", style="dim"))
        if self.previous is not None:
            parts.append(Text(f"(in brackets: against the last comparable run, {self.previous.get('started')})"))
        elif self.previous is None and self.history:
            parts.append(Text("no earlier run of this setup to compare with", style="dim"))
        if self.history:
            parts.append(Text(f"stored in {self.history}"))
        if self.plot:
            parts.append(Text(f"plot: {self.plot}"))
        if self.schedule is not None:
            parts.append(Text(f"budget schedule (the fastest DDTREE budget per concurrency; chain where "
                              f"DFLASH beat every budget): "
                              f"{self.schedule or 'none: no DDTREE row'}", style="bold"))
        if self.schedule_written:
            parts.append(Text(self.schedule_written))
        return Group(*parts)


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(arm: Arm, concurrency: int, results: list[dict[str, Any]], wall_s: float) -> Row:
    """One measurement of ``arm`` at ``concurrency`` from the agent's per-request results."""
    ok = [r for r in results if "error" not in r]
    tokens = sum(int(r.get("output_tokens") or 0) for r in ok)
    tpot = [(r["latency_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) * 1000 for r in ok
            if r.get("ttft_s") is not None and (r.get("output_tokens") or 0) > 1]
    ttft = [r["ttft_s"] * 1000 for r in ok if r.get("ttft_s") is not None]
    acc = [float(r["meta_info"]["spec_accept_length"]) for r in ok
           if r.get("meta_info", {}).get("spec_accept_length")]
    return Row(arm.label, arm.algorithm, arm.budget, concurrency, len(results), tokens,
               tokens / wall_s if wall_s > 0 else 0.0, _median(tpot), _median(ttft), _median(acc) if acc else None,
               failed=len(results) - len(ok), schedule=arm.row_schedule)


def requests_for(prompts: Sequence[str], n: int, max_new_tokens: int) -> list[dict[str, Any]]:
    """``n`` greedy requests cycling through ``prompts`` (ignore_eos: every one yields the same
    number of tokens, so arms are compared on equal work)."""
    return [{"text": prompts[i % len(prompts)],
             "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}
            for i in range(n)]


CLIENTS = ("auto", "sglang", "sglpatch")


def measure_arm(transport: Transport, host: Host, info: HostInfo, profile: ServeProfile, arm: Arm,
                concurrency: Sequence[int], prompts: Sequence[str], requests: int, max_new_tokens: int,
                client: str = "sglpatch", progress: Progress | None = None) -> list[Row]:
    """Start ``arm``'s server, warm it up, measure each concurrency level, stop it.

    ``client``: ``sglang`` — SGLang's own benchmark client run on the host (its figures; accept
    length is the server's running average); ``sglpatch`` — sglang_patcher's streamed requests
    (per-request medians; accept length is the mean of the requests' own). Raises ServerError
    (start failure, a request or the client failing: e.g. the server crashed mid-run)."""
    name = f"bench-{arm.label.lower().replace(' ', '-')}-{time.strftime('%Y%m%dT%H%M%S')}"
    rows = []
    with RemoteServer(transport, host, info, profile, name,
                      lambda port: launch_argv(host, profile, arm.algorithm, port, ddtree=arm.ddtree()),
                      progress) as server:
        server.wait_ready()
        warm = requests_for(prompts, max(concurrency), min(max_new_tokens, 16))
        server.generate(warm, concurrency=max(concurrency))
        for c in concurrency:
            if progress:
                progress(f"{arm.label}: concurrency {c}, {requests} requests ({client} client)")
            if client == "sglang":
                rec = server.sglang_client(prompts, requests, max_new_tokens, c)
                done = int(rec.get("completed") or 0)
                rows.append(Row(arm.label, arm.algorithm, arm.budget, c, requests,
                                int(rec.get("total_output_tokens") or 0), float(rec.get("output_throughput") or 0.0),
                                rec.get("median_tpot_ms"), rec.get("median_ttft_ms"),
                                (rec.get("accept_length") or None) if arm.algorithm != "none" else None,
                                failed=requests - done, schedule=arm.row_schedule))
                continue
            results, wall = server.stream(requests_for(prompts, requests, max_new_tokens), c)
            failed = [r for r in results if "error" in r]
            if failed:
                raise server.request_failure(f"{arm.label} requests at concurrency {c}", failed, len(results))
            rows.append(summarize(arm, c, results, wall))
    return rows


def pick_client(client: str, transport: Transport, host: Host, max_new_tokens: int) -> str:
    """``auto`` becomes ``sglang`` when the host's SGLang has its benchmark client
    (``sglang.benchmark.serving``) and the requests are long enough for it (>= 4 new tokens),
    else ``sglpatch``. Raises ConfigError for an unknown name or ``sglang`` where it cannot run."""
    from ..errors import ConfigError
    from ..remote.launcher import call_json

    if client not in CLIENTS:
        raise ConfigError(f"unknown bench client {client!r}", hint=f"use one of {', '.join(CLIENTS)}")
    if client == "sglpatch":
        return client
    def has(name: str) -> bool:
        return bool(call_json(transport, host.python, "server_agent", "has_module", {"name": name}).get("found"))

    release_has = has("sglang.benchmark.serving")
    found = release_has and has("datasets")          # the client imports it at start
    if client == "sglang" and not found:
        raise ConfigError(f"{host.name}: " + ("the host's SGLang has no sglang.benchmark.serving" if not release_has
                                              else "SGLang's benchmark client needs the `datasets` package there"),
                          hint="use --client sglpatch (or auto)" if not release_has
                          else f"pip install datasets into {host.python}'s environment, or use --client sglpatch")
    if client == "sglang" and max_new_tokens < 4:
        raise ConfigError("SGLang's benchmark client needs at least 4 new tokens per request",
                          hint="raise --max-new-tokens, or use --client sglpatch")
    return "sglang" if found and max_new_tokens >= 4 else "sglpatch"


def run_bench(transport: Transport, host: Host, info: HostInfo, arms: Sequence[Arm],
              concurrency: Sequence[int], prompts: Sequence[str], *, requests: int,
              max_new_tokens: int, rounds: int = 1, patchset: tuple[str, int] | None = None,
              client: str = "auto", progress: Progress | None = None) -> BenchRun:
    """Measure every arm at every concurrency (see the module docstring) with ``client`` (see
    :func:`pick_client`). Raises ServerError, ConfigError."""
    chosen = pick_client(client, transport, host, max_new_tokens)
    profile = host.serve
    assert profile is not None
    run = BenchRun(host.name, str(info.sglang_version), patchset[0] if patchset else None,
                   patchset[1] if patchset else None, profile.model, profile.draft_model, list(profile.args),
                   len(prompts), max_new_tokens, rounds, time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   client=chosen)
    t0 = time.monotonic()
    per: dict[tuple[Arm, int], list[Row]] = {}
    for r in range(rounds):
        order = list(arms[r % len(arms):]) + list(arms[:r % len(arms)])     # rotated each round
        for arm in order:
            for row in measure_arm(transport, host, info, profile, arm, concurrency, prompts,
                                   requests, max_new_tokens, chosen, progress):
                per.setdefault((arm, row.concurrency), []).append(row)
    for (arm, c), rows in per.items():
        med = rows[0] if len(rows) == 1 else Row(
            arm.label, arm.algorithm, arm.budget, c, rows[0].requests, rows[0].output_tokens,
            statistics.median(x.tok_s for x in rows),
            _median([x.tpot_ms for x in rows if x.tpot_ms is not None]),
            _median([x.ttft_ms for x in rows if x.ttft_ms is not None]),
            _median([x.accept_length for x in rows if x.accept_length is not None]), schedule=arm.row_schedule)
        run.rows.append(med)
    run.seconds = time.monotonic() - t0
    return run


# ------------------------------------------------------------------------------------ history

def history_path(home: Path | None = None) -> Path:
    return (home or sglpatch_home()) / HISTORY


def load_history(home: Path | None = None) -> list[dict[str, Any]]:
    """Every stored run, oldest first (lines that are not JSON objects are passed over)."""
    path = history_path(home)
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            out.append(d)
    return out


def last_comparable(run: BenchRun, home: Path | None = None) -> dict[str, Any] | None:
    """The newest stored run with the same setup (:meth:`BenchRun.setup_key`), or None."""
    key = run.setup_key()
    for d in reversed(load_history(home)):
        if all(d.get(k) == v for k, v in key.items()):
            return d
    return None


def store(run: BenchRun, home: Path | None = None) -> Path:
    """Append ``run`` to the history file (one JSON line); its path."""
    path = history_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = run.to_json()
    doc.pop("previous", None)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(doc, sort_keys=True) + "\n")
    run.history = str(path)
    return path


def plot(run: BenchRun, path: Path) -> Path:
    """tokens/s against concurrency, one line per arm (PNG). Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in sorted({r.arm for r in run.rows}):
        rows = sorted((r for r in run.rows if r.arm == arm), key=lambda r: r.concurrency)
        ax.plot([r.concurrency for r in rows], [r.tok_s for r in rows], marker="o", label=arm)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{run.host}: sglang {run.sglang_version}, {Path(run.model).name}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    run.plot = str(path)
    return path


# ------------------------------------------------------------------------------------ sweep

def choose_schedule(run: BenchRun, *, chain: bool = True) -> list[Entry]:
    """For each measured concurrency, the DDTREE budget with the highest output tokens/s (ties:
    the smaller budget) — or ``CHAIN`` where DFLASH, measured in the same run, was faster than
    every DDTREE budget (``chain``: the patchset revision runs DFlash's own step there) — as
    (batch size, budget) entries of a budget schedule (:func:`.schedule.schedule_text` writes
    them). Rows with failed requests never win. Consecutive concurrencies with the same winner
    share one entry, and the first entry starts at 1 (the running batch size is taken to be the
    concurrency). [] without DDTREE rows."""
    entries: list[Entry] = []
    for c in sorted({r.concurrency for r in run.rows}):
        rows = [r for r in run.rows if r.algorithm == "DDTREE" and r.concurrency == c and r.budget
                and not r.failed and r.schedule is None]     # a fixed budget, not the auto planner
        if not rows:
            continue
        best = max(rows, key=lambda r: (r.tok_s, -int(r.budget or 0)))
        pick = int(best.budget or 0)
        dflash = [r.tok_s for r in run.rows if r.algorithm == "DFLASH" and r.concurrency == c and not r.failed]
        if chain and dflash and max(dflash) > best.tok_s:
            pick = CHAIN
        if not entries or entries[-1][1] != pick:
            entries.append((c, pick))
    if entries:
        entries[0] = (1, entries[0][1])
    return entries
