"""The DDTREE budget schedule as sglpatch reads and writes it, in the server's own grammar.

One grammar: the ddtree payload's ``ddtree_budget`` module (``patchsets/ddtree/modules/``, installed
on hosts as ``sglang/srt/speculative/ddtree_budget.py``, where the server parses
``--speculative-ddtree-budget-schedule``) defines the text — ``BATCH:BUDGET`` entries joined by
commas, BUDGET a whole number >= 1 or ``chain`` (DFlash's own step at that batch size), batch sizes
whole numbers >= 1, each once. sglpatch imports that module from the ``patchsets`` package (the
source tree, or the copy shipped with sglpatch as package data) rather than keeping a second
parser: a profile ``hosts.yaml`` accepts is one the server accepts, and a schedule ``bench --sweep``
writes reads back the same. The module is pure Python (no torch at import); importing it runs
``patchsets/ddtree/modules/__init__.py``, which only binds the kernels' SGLang module names to
lazily loaded modules where Triton is installed (nothing is executed).
"""

from __future__ import annotations

from collections.abc import Iterable

from patchsets.ddtree.modules.ddtree_budget import AUTO, CHAIN, FIXED, BudgetSchedule, is_auto, parse_schedule

__all__ = ["AUTO", "CHAIN", "FIXED", "Entry", "is_auto", "is_fixed", "parse_entries", "schedule_text"]

#: (batch size >= 1, budget >= 1 or ``CHAIN``): one schedule entry, budget in tree nodes per request.
Entry = tuple[int, int]

# The server clamps each tree budget to [floor, ceiling] (the draft's block - 1, its
# --speculative-ddtree-budget) at every step; the entries sglpatch reads and writes are the schedule
# as written, unclamped, so these bounds only satisfy BudgetSchedule's constructor.
_FLOOR = _CEILING = 1


def is_fixed(text: object) -> bool:
    """Whether a schedule value is ``fixed``: every step at the server's budget (the server reads it
    from ddtree revision 13 on, where an unset schedule means ``auto``)."""
    return isinstance(text, str) and text.strip().lower() == FIXED


def parse_entries(text: str) -> tuple[Entry, ...]:
    """``"1:64, 16:Chain"`` -> ``((1, 64), (16, CHAIN))``, sorted by batch size. Raises ValueError
    saying what is wrong (the bad entry and what to write; an empty schedule; a batch size below 1
    or given twice; a budget of 0), in the server's words."""
    return parse_schedule(text, floor=_FLOOR, ceiling=_CEILING).entries


def schedule_text(entries: Iterable[Entry]) -> str:
    """``[(1, 64), (16, CHAIN)]`` -> ``"1:64,16:chain"`` (sorted by batch size), the text
    :func:`parse_entries` and the server read back. Raises ValueError for entries the grammar
    refuses (none, a batch size below 1 or repeated, a budget below 1 other than ``CHAIN``)."""
    return BudgetSchedule(tuple(sorted(entries)), _FLOOR, _CEILING).text()
