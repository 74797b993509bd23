"""DDTree's budget by batch: how many draft-tree nodes a decode step verifies per request.

Installed as ``sglang/srt/speculative/ddtree_budget.py`` by the ddtree patchset. Pure Python (no
torch): the schedule, its file, the verify-cost model and the planner, used by the worker each
step and by ``sglpatch bench --sweep`` offline.

Why: a target verify pass costs more the more tokens it verifies, and in an optimized engine that
cost grows fast with the batch (measured on an H200 for a Qwen3-8B-shaped target, 257 tokens per
request cost 1.7x a 16-token verify at batch 1 but 11x at batch 16). DDTree's acceptance gain over
the chain is ~1.3-1.4x (Ringel & Romano, arXiv 2604.12989, Table 2), so a fixed large budget is
slower than DFlash under load. A budget that follows the batch keeps the gain where it pays.

The floor: with N = B - 1 nodes the tree verifies exactly as many tokens as DFlash's block (B), and
the best N-node tree's expected acceptance Σ_{u in T} q(u) is at least the chain's, since the chain
of per-depth argmaxes is one prefix-closed tree of B - 1 nodes and the best-first tree maximises
that sum over all of them (the paper's Prop. 1-3). So DDTREE never verifies more than DFLASH unless
the schedule says it pays, and never accepts less in expectation at DFLASH's width.

Chain steps: the floor tree verifies DFlash's width but still costs more than DFlash's step (on an
H200, 1.03x / 1.07x / 1.10x the whole step at batch 1 / 16 / 64: the custom-mask attention, the
tree build, the KV compaction; ``bench/results/2026-12-02-h200-decode-step*.md``). Where the tree's
extra acceptance does not pay for that, the schedule says ``chain`` and the step is DFlash's own
(the block's argmax chain, causal verify, no tree): DDTREE then costs exactly what DFLASH costs.

Schedule text: ``"BS:N,BS:N,..."``, e.g. ``"1:128,4:32,16:chain"``: a running batch of ``bs``
requests uses the entry with the largest ``BS <= bs``; batch sizes below the first entry use the
first. N is a budget or ``chain`` (``CHAIN``). Every budget is clamped to ``[floor, ceiling]``:
floor = B - 1, ceiling = the server's ``--speculative-ddtree-budget`` (the widest tree its buffers
are sized for). A schedule file is JSON: ``{"schedule": {"1": 128, "4": 32, "16": "chain"}, ...}``
(other keys — who measured it, when — are kept for people and ignored here).

``auto`` (``AutoBudgetPlanner``): no table given; each decode step's budget is chosen on the host
from what this server measures as it runs — the seconds per decode step by (batch bucket,
budget) and the tokens committed per request by budget — among DFlash's chain, the floor and
budgets of doubling verify width up to the ceiling, for the most committed tokens per second.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = [
    "AUTO",
    "CHAIN",
    "AutoBudgetPlanner",
    "BudgetSchedule",
    "auto_candidates",
    "batch_bucket",
    "is_auto",
    "VerifyCostModel",
    "parse_schedule",
    "load_schedule",
    "plan_budget",
    "best_budget_per_batch",
    "GraphWidthPlan",
    "plan_graph_widths",
]

_ENTRY = re.compile(r"^\s*(\d+)\s*:\s*(\d+|chain)\s*$", re.IGNORECASE)

#: The schedule's value for a chain step (DFlash's own decode step): not a tree budget.
CHAIN = 0

#: The schedule text that asks for the online planner (``AutoBudgetPlanner``) instead of a table.
AUTO = "auto"


def is_auto(source: object) -> bool:
    """Whether a ``--speculative-ddtree-budget-schedule`` value asks for the online planner."""
    return isinstance(source, str) and source.strip().lower() == AUTO


def _budget_text(n: int) -> str:
    return "chain" if n == CHAIN else str(n)


@dataclass(frozen=True)
class BudgetSchedule:
    """Budget (tree nodes per request, root not counted) by running batch size.

    Fields:
      entries: ((batch_size, budget), ...) sorted by batch size, batch sizes distinct and >= 1;
        a budget is >= 1, or ``CHAIN`` for DFlash's own step.
      floor: B - 1 (DFlash's verify width minus the root); ceiling: the server's maximum budget.
    Raises ValueError for an empty schedule, batch sizes < 1 or repeated, budgets < 1 (other than
    ``CHAIN``), or floor > ceiling.
    """

    entries: Tuple[Tuple[int, int], ...]
    floor: int
    ceiling: int

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("a DDTREE budget schedule needs at least one BS:N entry")
        sizes = [bs for bs, _ in self.entries]
        if sizes != sorted(set(sizes)) or sizes[0] < 1:
            raise ValueError(f"schedule batch sizes must be distinct, ascending and >= 1, got {sizes}")
        if any(n < 1 and n != CHAIN for _, n in self.entries):
            raise ValueError(f"schedule budgets must be >= 1 or chain, got {[n for _, n in self.entries]}")
        if not 1 <= self.floor <= self.ceiling:
            raise ValueError(f"budget floor {self.floor} must be within 1..{self.ceiling} (the maximum budget)")

    def _clamp(self, n: int) -> int:
        return CHAIN if n == CHAIN else min(self.ceiling, max(self.floor, n))

    def budget_for(self, batch_size: int) -> int:
        """Tree nodes per request for a running batch of ``batch_size`` requests (>= 1), clamped
        to [floor, ceiling]; ``CHAIN`` where the schedule runs DFlash's own step."""
        sizes = [bs for bs, _ in self.entries]
        i = max(0, bisect.bisect_right(sizes, max(1, int(batch_size))) - 1)
        return self._clamp(self.entries[i][1])

    def budgets(self) -> List[int]:
        """Every tree budget the schedule can give (clamped), ascending; ``CHAIN`` (0) first when
        it has chain steps. The verify widths to prepare are these + 1 (the chain's: B)."""
        return sorted({self._clamp(n) for _, n in self.entries})

    @property
    def has_chain(self) -> bool:
        return any(n == CHAIN for _, n in self.entries)

    def text(self) -> str:
        return ",".join(f"{bs}:{_budget_text(n)}" for bs, n in self.entries)


def _parse_budget(value: object) -> int:
    """A schedule value: a whole number, or ``chain`` -> ``CHAIN``. Raises ValueError."""
    if isinstance(value, str) and value.strip().lower() == "chain":
        return CHAIN
    if isinstance(value, bool) or not isinstance(value, (int, str)) or (
            isinstance(value, str) and not value.strip().isdigit()):
        raise ValueError(f"a budget is a whole number or 'chain', got {value!r}")
    n = int(value)
    if n == CHAIN:
        raise ValueError("a budget of 0 is not a tree: write 'chain' for DFlash's own step")
    return n


def parse_schedule(text: str, *, floor: int, ceiling: int) -> BudgetSchedule:
    """``"1:128,4:32,16:chain"`` -> BudgetSchedule. Raises ValueError naming the bad entry."""
    entries = []
    for part in str(text).split(","):
        if not part.strip():
            continue
        m = _ENTRY.match(part)
        if not m:
            raise ValueError(f"bad DDTREE budget schedule entry {part.strip()!r}: write BATCH:BUDGET "
                             "or BATCH:chain, e.g. 1:128,4:32,16:chain")
        entries.append((int(m.group(1)), _parse_budget(m.group(2))))
    entries.sort()
    return BudgetSchedule(tuple(entries), floor, ceiling)


def load_schedule(source: str, *, floor: int, ceiling: int) -> BudgetSchedule:
    """A schedule from its text or from a JSON file (``{"schedule": {"1": 128, "16": "chain"}}``; a path is
    anything that names an existing file or ends in ``.json``). Raises ValueError (bad content,
    naming the file) or OSError (unreadable file)."""
    if is_auto(source):
        raise ValueError("'auto' is not a budget table: build an AutoBudgetPlanner (is_auto tells)")
    if os.path.isfile(source) or source.endswith(".json"):
        with open(source, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except ValueError as exc:
                raise ValueError(f"{source}: not a JSON DDTREE budget schedule ({exc})") from None
        sched = data.get("schedule") if isinstance(data, dict) else None
        if not isinstance(sched, dict):
            raise ValueError(f'{source}: expected {{"schedule": {{"BATCH": BUDGET, ...}}}}')
        try:
            keys = [int(k) for k in sched]
        except (TypeError, ValueError):
            raise ValueError(f"{source}: schedule keys (batch sizes) must be whole numbers") from None
        try:
            entries = tuple(sorted(zip(keys, (_parse_budget(v) for v in sched.values()))))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from None
        try:
            return BudgetSchedule(entries, floor, ceiling)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
    return parse_schedule(source, floor=floor, ceiling=ceiling)


@dataclass(frozen=True)
class VerifyCostModel:
    """Seconds per decode step as a function of the batch size and the tokens verified per request.

    ``table``: {(batch_size, tokens_per_request): seconds} measured on the host (e.g. by timing
    the target's verify at start-up, or by ``sglpatch bench``); ``draft_s``: {batch_size: seconds}
    of the draft forward and tree build, which do not depend on the budget; ``chain_s``:
    {batch_size: seconds} of DFlash's whole decode step (draft included), the cost of a ``CHAIN``
    step (optional: without it the planner cannot choose chain steps). Between measured points
    the cost is interpolated linearly in the number of tokens and in log(batch size); beyond them
    it is extrapolated from the nearest two points (never below the nearest value).
    Raises ValueError without measured points or with a time <= 0.
    """

    table: Dict[Tuple[int, int], float]
    draft_s: Dict[int, float]
    chain_s: Dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.table:
            raise ValueError("a verify cost model needs measured points")
        if any(s <= 0 for s in list(self.table.values()) + list(self.chain_s.values())):
            raise ValueError("measured verify times must be positive")

    @staticmethod
    def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
        if len(xs) == 1:
            return ys[0]
        i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return max(y, min(y0, y1)) if x < x0 or x > x1 else y

    def verify_s(self, batch_size: int, tokens_per_request: int) -> float:
        batches = sorted({b for b, _ in self.table})
        per_batch = []
        for b in batches:
            pts = sorted((w, s) for (bb, w), s in self.table.items() if bb == b)
            per_batch.append(self._interp([w for w, _ in pts], [s for _, s in pts], tokens_per_request))
        return self._interp([math.log(b) for b in batches], per_batch, math.log(max(1, batch_size)))

    def step_s(self, batch_size: int, tokens_per_request: int) -> float:
        """Draft (nearest measured batch size, interpolated) + verify."""
        if self.draft_s:
            bs = sorted(self.draft_s)
            draft = self._interp([math.log(b) for b in bs], [self.draft_s[b] for b in bs], math.log(max(1, batch_size)))
        else:
            draft = 0.0
        return draft + self.verify_s(batch_size, tokens_per_request)

    def chain_step_s(self, batch_size: int) -> float:
        """DFlash's whole step at ``batch_size`` (interpolated in log batch size). Raises
        ValueError when the model has no chain measurements."""
        if not self.chain_s:
            raise ValueError("this cost model has no measured chain (DFlash) steps")
        bs = sorted(self.chain_s)
        return self._interp([math.log(b) for b in bs], [self.chain_s[b] for b in bs], math.log(max(1, batch_size)))


def plan_budget(batch_size: int, expected_accept: Callable[[int], float], cost: VerifyCostModel,
                candidates: Iterable[int]) -> Tuple[int, float]:
    """The budget among ``candidates`` that maximises expected committed tokens per second for a
    batch of ``batch_size``: ``batch_size * (1 + expected_accept(n)) / cost.step_s(batch_size, n + 1)``,
    and for the candidate ``CHAIN`` ``batch_size * (1 + expected_accept(CHAIN)) / cost.chain_step_s(batch_size)``.

    ``expected_accept(n)``: expected accepted draft tokens per request of the best n-node tree —
    Σ q(u) over its nodes (Ringel & Romano, Prop. 1), e.g. the cumulative sum of the tree's node
    probabilities in best-first order, or a measured acceptance curve; ``expected_accept(CHAIN)``
    is the chain's (DFlash's accept length - 1). Returns (budget or CHAIN, tokens/s). Raises
    ValueError without candidates, or for ``CHAIN`` without ``cost.chain_s``. Ties go to the
    smaller budget, and to ``CHAIN`` before any tree.
    """
    best: Optional[Tuple[int, float]] = None
    for n in sorted(set(int(c) for c in candidates)):
        if n < 1 and n != CHAIN:
            continue
        step = cost.chain_step_s(batch_size) if n == CHAIN else cost.step_s(batch_size, n + 1)
        rate = batch_size * (1.0 + float(expected_accept(n))) / step
        if best is None or rate > best[1] * (1 + 1e-9):
            best = (n, rate)
    if best is None:
        raise ValueError("plan_budget needs at least one candidate budget >= 1 or CHAIN")
    return best


def best_budget_per_batch(batch_sizes: Iterable[int], expected_accept: Callable[[int], float],
                          cost: VerifyCostModel, candidates: Iterable[int], *, floor: int,
                          ceiling: int) -> BudgetSchedule:
    """A schedule from the cost model: for each batch size the planned budget (candidates clamped
    to [floor, ceiling]; ``CHAIN`` among them lets the plan choose DFlash's own step);
    consecutive batch sizes with the same budget share one entry."""
    cands = sorted({CHAIN if int(c) == CHAIN else min(ceiling, max(floor, int(c))) for c in candidates})
    entries: List[Tuple[int, int]] = []
    for bs in sorted(set(int(b) for b in batch_sizes)):
        n, _ = plan_budget(bs, expected_accept, cost, cands)
        if not entries or entries[-1][1] != n:
            entries.append((bs, n))
    if entries and entries[0][0] != 1:
        entries[0] = (1, entries[0][1])
    return BudgetSchedule(tuple(entries), floor, ceiling)


def auto_candidates(floor: int, ceiling: int) -> Tuple[int, ...]:
    """The budgets the online planner chooses among: ``CHAIN``, the floor, the budgets whose verify
    width doubles from the floor's ((floor + 1) * 2**k - 1) while below the ceiling, and the
    ceiling. E.g. floor 15, ceiling 256: (CHAIN, 15, 31, 63, 127, 255, 256). Raises ValueError
    unless 1 <= floor <= ceiling."""
    if not 1 <= floor <= ceiling:
        raise ValueError(f"budget floor {floor} must be within 1..{ceiling} (the maximum budget)")
    out = [CHAIN, floor]
    width = floor + 1
    while 2 * width - 1 < ceiling:
        width *= 2
        out.append(width - 1)
    if ceiling > floor:
        out.append(ceiling)
    return tuple(out)


@dataclass(frozen=True)
class GraphWidthPlan:
    """Which tree budgets got their own target verify CUDA graphs at start-up, within the bound.

    Fields:
      captured: ((budget, GiB), ...) ascending by budget: each budget captured, with the device
        memory its graphs and attention backend took (measured, GiB).
      skipped: budgets (ascending) left to verify eagerly: the predicted memory would have gone
        past the bound.
      bound_gib: the bound (``--speculative-ddtree-graph-memory``, GiB).
    """

    captured: Tuple[Tuple[int, float], ...]
    skipped: Tuple[int, ...]
    bound_gib: float

    @property
    def used_gib(self) -> float:
        return sum(gib for _, gib in self.captured)

    def describe(self) -> str:
        """One log line: what was captured, what it cost, what runs eagerly."""
        got = ", ".join(f"{n} ({gib:.2f} GiB)" for n, gib in self.captured) or "none"
        left = ", ".join(str(n) for n in self.skipped) or "none"
        return (
            f"verify graphs of their own for budgets [{got}]: {self.used_gib:.2f} of "
            f"{self.bound_gib:g} GiB; over the bound, verified eagerly: [{left}]"
        )


def plan_graph_widths(
    budgets: Iterable[int],
    capture: Callable[[int], float],
    *,
    bound_gib: float,
) -> GraphWidthPlan:
    """Capture verify CUDA graphs for tree budgets, narrowest first, while they fit a memory bound.

    Before each budget N its cost is predicted from what was measured so far: the largest GiB per
    verify token of width (GiB / (budget + 1)) of any earlier capture, times N + 1 (the first
    capture has nothing to go on and is predicted free). N and every wider budget are skipped
    once the memory used plus N's prediction would pass ``bound_gib``; a capture that costs more
    than predicted is kept and counted, so the bound can be passed by at most one capture's
    misprediction (the first's whole cost when it alone exceeds the bound). ``CHAIN`` entries are
    ignored (a chain step is DFlash's own verify).

    Args:
      budgets: tree budgets (>= 1; duplicates and ``CHAIN`` ignored) to capture.
      capture: captures the graphs of one budget and returns the device memory they took (GiB,
        >= 0; a negative measurement — memory freed meanwhile — counts as 0).
      bound_gib: device memory the extra graphs may take (GiB, >= 0; 0 captures none).
    Returns:
      A ``GraphWidthPlan``.
    Raises:
      ValueError: a negative or non-finite bound.
    """
    if not (bound_gib >= 0 and math.isfinite(bound_gib)):
        raise ValueError(f"the verify graphs' memory bound must be a finite number of GiB >= 0, got {bound_gib}")
    todo = sorted({int(n) for n in budgets if int(n) != CHAIN})
    captured: List[Tuple[int, float]] = []
    used = 0.0
    per_token = 0.0
    for i, n in enumerate(todo):
        predicted = per_token * (n + 1)
        if bound_gib <= 0 or used + predicted > bound_gib:
            return GraphWidthPlan(tuple(captured), tuple(todo[i:]), bound_gib)
        gib = max(0.0, float(capture(n)))
        captured.append((n, gib))
        used += gib
        per_token = max(per_token, gib / (n + 1))
    return GraphWidthPlan(tuple(captured), (), bound_gib)


def batch_bucket(batch_size: int) -> int:
    """The power of two at or below ``batch_size`` (>= 1): batch sizes the planner measures as one."""
    return 1 << (max(1, int(batch_size)).bit_length() - 1)


@dataclass
class _Mean:
    """A mean that weighs the n-th sample 1/n until that falls to ``alpha`` (the plain mean of the
    first 1/alpha samples, then exponentially weighted), and how many samples made it."""

    value: float = 0.0
    count: int = 0

    def add(self, x: float, alpha: float) -> None:
        self.count += 1
        w = max(alpha, 1.0 / self.count)
        self.value = (1.0 - w) * self.value + w * x


class AutoBudgetPlanner:
    """The budget of each decode step, chosen online from this server's own measurements.

    Estimates — the plain mean of the first samples, then exponentially weighted: seconds per
    decode step by (batch bucket, budget) — ``record_time``, weight ``alpha`` — and tokens
    committed per request per step (accepted drafts + the bonus token) by budget —
    ``record_accept``, weight ``accept_alpha`` (None: ``alpha``; lower, since a step's accept
    length is far noisier than its time); acceptance does not depend on the batch, the step's
    cost does. The value of a budget n for a batch bucket is accept(n) / seconds(bucket, n), i.e.
    committed tokens per second up to the constant batch size.

    ``choose(batch_size)``, per bucket: measure ``CHAIN`` and the tree budgets in ascending order
    (``auto_candidates``), ``min_samples`` each, and stop at the first tree budget whose value falls
    ``margin`` below the best tree's (verify cost grows faster than acceptance past the peak, so
    wider trees are not tried: at batch 64 on an H200 a 257-token verify costs 8.8x DFlash's);
    then run the best (chain or tree), keeping the running plan unless another budget's value
    beats it by more than ``hysteresis`` (noise in the estimates would otherwise flip it). Every ``reexplore_every`` decisions of a bucket one step
    re-measures a neighbour of the best, alternating the wider and the narrower one, so the plan
    follows a workload whose acceptance or cost drifts. The first sample of each (bucket, budget)
    is dropped (kernel compilation and warm-up), and later ones are clipped to ``outlier`` x the
    estimate. A chosen budget is always ``CHAIN`` or within [floor, ceiling].

    The defaults were chosen by simulating the planner on the H200 step times of
    ``bench/results/2026-12-02-h200-decode-step*.md`` with noisy step times and accept lengths
    (``bench/decode_step.py --project``): over 2,000 steps it keeps 97.6-99.9 % of the tokens/s
    of the best fixed choice per batch size, exploration included. The search is the planner's own; the trade-off it measures (verify
    cost against acceptance) is the DDTree paper's (Ringel & Romano, arXiv 2604.12989), measured
    on the host instead of modelled. Not thread-safe (one per worker).
    Raises ValueError for floor/ceiling out of order or non-positive settings.
    """

    def __init__(self, floor: int, ceiling: int, *, min_samples: int = 4, margin: float = 0.05,
                 reexplore_every: int = 128, alpha: float = 0.1, accept_alpha: Optional[float] = 0.03,
                 hysteresis: float = 0.02, outlier: float = 4.0) -> None:
        accept_alpha = alpha if accept_alpha is None else accept_alpha
        if (min_samples < 1 or reexplore_every < 2 or not 0 < alpha <= 1 or not 0 < accept_alpha <= 1
                or margin < 0 or hysteresis < 0 or outlier <= 1):
            raise ValueError("AutoBudgetPlanner: min_samples >= 1, reexplore_every >= 2, 0 < alpha, "
                             "accept_alpha <= 1, margin >= 0, hysteresis >= 0 and outlier > 1")
        self.floor, self.ceiling = int(floor), int(ceiling)
        self.candidates = auto_candidates(self.floor, self.ceiling)
        self.min_samples, self.margin, self.hysteresis = min_samples, margin, hysteresis
        self.reexplore_every, self.alpha, self.outlier = reexplore_every, alpha, outlier
        self.accept_alpha = accept_alpha
        self._time: Dict[Tuple[int, int], _Mean] = {}
        self._seen: Dict[Tuple[int, int], int] = {}
        self._accept: Dict[int, _Mean] = {}
        self._decisions: Dict[int, int] = {}
        self._best: Dict[int, int] = {}
        self.plan_changes = 0     # how often ``plan()`` changed: the worker logs the plan on a change

    # -- measurements ------------------------------------------------------------------------
    def record_time(self, batch_size: int, budget: int, seconds: float) -> None:
        """One decode step of ``batch_size`` requests at ``budget`` took ``seconds`` (> 0; others
        are ignored)."""
        if not seconds > 0 or budget not in self.candidates:
            return
        key = (batch_bucket(batch_size), int(budget))
        self._seen[key] = self._seen.get(key, 0) + 1
        if self._seen[key] == 1:
            return                                      # warm-up: compilation, first allocation
        est = self._time.setdefault(key, _Mean())
        if est.count:
            seconds = min(seconds, self.outlier * est.value)
        est.add(seconds, self.alpha)

    def record_accept(self, budget: int, tokens_per_request: float) -> None:
        """A decode step at ``budget`` committed ``tokens_per_request`` tokens per request on
        average (accepted drafts + the bonus token: >= 1)."""
        if budget in self.candidates and tokens_per_request >= 1:
            self._accept.setdefault(int(budget), _Mean()).add(float(tokens_per_request), self.accept_alpha)

    # -- the plan ----------------------------------------------------------------------------
    def value(self, batch_size: int, budget: int) -> Optional[float]:
        """Estimated committed tokens per second per request of ``budget`` at ``batch_size``, or
        None while it has fewer than ``min_samples`` measurements of either kind."""
        t = self._time.get((batch_bucket(batch_size), int(budget)))
        a = self._accept.get(int(budget))
        if t is None or a is None or t.count < self.min_samples or a.count < self.min_samples:
            return None
        return a.value / t.value

    def choose(self, batch_size: int) -> int:
        """The budget of the next decode step of ``batch_size`` requests: ``CHAIN`` or a tree
        budget in [floor, ceiling] (see the class docstring)."""
        bucket = batch_bucket(batch_size)
        n_dec = self._decisions[bucket] = self._decisions.get(bucket, 0) + 1
        chain_v = self.value(bucket, CHAIN)
        if chain_v is None:
            return CHAIN
        best, best_v = CHAIN, chain_v
        tree_best = -1.0
        for n in self.candidates[1:]:
            v = self.value(bucket, n)
            if v is None:
                return n                                # explore the next tree budget
            if v > best_v:
                best, best_v = n, v
            if v < tree_best * (1.0 - self.margin):
                break                                   # past the peak
            tree_best = max(tree_best, v)
        held = self._best.get(bucket)
        if held is not None and held != best:
            held_v = self.value(bucket, held)           # keep the running plan unless clearly beaten
            if held_v is not None and held_v * (1.0 + self.hysteresis) >= best_v:
                best = held
        if held != best:
            self.plan_changes += 1
        self._best[bucket] = best
        if n_dec % self.reexplore_every == 0:
            i = self.candidates.index(best)
            wider = (n_dec // self.reexplore_every) % 2 == 1
            j = i + 1 if (wider and i + 1 < len(self.candidates)) or i == 0 else i - 1
            return self.candidates[j]
        return best

    def plan(self) -> Dict[int, int]:
        """{batch bucket: the budget its last exploiting decision chose} (``CHAIN`` = 0)."""
        return dict(sorted(self._best.items()))

    def describe(self) -> str:
        """The plan as schedule text, e.g. ``"1:31,4:chain"`` (empty before any plan)."""
        return ",".join(f"{b}:{_budget_text(n)}" for b, n in self.plan().items())
