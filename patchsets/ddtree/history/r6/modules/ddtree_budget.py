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
    "CHAIN",
    "BudgetSchedule",
    "VerifyCostModel",
    "parse_schedule",
    "load_schedule",
    "plan_budget",
    "best_budget_per_batch",
]

_ENTRY = re.compile(r"^\s*(\d+)\s*:\s*(\d+|chain)\s*$", re.IGNORECASE)

#: The schedule's value for a chain step (DFlash's own decode step): not a tree budget.
CHAIN = 0


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
