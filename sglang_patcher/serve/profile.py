"""The serving profile of a host (``serve:`` in ``hosts.yaml``): how to start SGLang there.

Example (a GPU host)::

    serve:
      model: /models/Qwen3-8B                       # --model-path, on the host
      draft_model: /models/Qwen3-8B-DFlash-b16      # --speculative-draft-model-path (DFlash draft)
      args: [--attention-backend, flashinfer, --mem-fraction-static, "0.8"]   # every start
      env: {HF_HUB_OFFLINE: "1"}
      devices: "0"                                  # CUDA_VISIBLE_DEVICES
      port: 30000-30010                             # one port, or a range to take the first free
      start_timeout: 900                            # seconds until /health must answer
      ddtree: {budget: 64, topk: null}              # the DDTREE arguments of checks and bench
                                                    #   (budget_schedule: "1:64,4:16", from bench --sweep,
                                                    #    or auto: chosen by the server as it runs)
      max_new_tokens: 32                            # per prompt in `check --level 2/3`
      bench: {concurrency: [1, 4, 16, 64], requests: 64, max_new_tokens: 256}

Everything but ``model`` has a default; ``draft_model`` is needed for the levels and arms that
speculate (check level 3, bench DFLASH/DDTREE).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .schedule import AUTO, FIXED, is_auto, is_fixed, parse_entries, schedule_text

_PORTS = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
_ENTRY = re.compile(r"^\s*\d+\s*:\s*(\d+|chain)\s*$", re.IGNORECASE)  # one BATCH:BUDGET of a schedule
ALGORITHMS = ("none", "DFLASH", "DDTREE")


class DDTreeSettings(BaseModel):
    """DDTREE's own arguments for the starts that use it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget: int = Field(default=64, ge=1)
    topk: int | None = Field(default=None, ge=1)
    # budget by running batch size, "BATCH:BUDGET,..." with BUDGET a number or chain (DFlash's own
    # step at that batch size; ddtree revision 4), written by `sglpatch bench --sweep`; the
    # server's grammar (serve/schedule.py), kept as its normal text (sorted, lower case, no spaces);
    # or "auto" (ddtree revision 7): the worker's planner chooses each step's budget up to `budget`;
    # or "fixed" (revision 13): every step at `budget`. Unset: the server's default — fixed before
    # revision 13, auto from it on (where `budget` is at least the draft's block size - 1)
    budget_schedule: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _schedule_split_by_a_flow_mapping(cls, data: object) -> object:
        """``ddtree: {budget_schedule: 1:8,4:16}``: inside ``{ }`` YAML ends the value at the first
        comma and reads each later entry as a key of its own (``4:16`` as the number 256, YAML
        1.1's base 60; ``16:chain`` as text). One error that gives the schedule back, quoted,
        instead of one per piece."""
        if not isinstance(data, dict) or "budget_schedule" not in data:
            return data
        strays = [k for k in data if k not in cls.model_fields and data[k] is None and _entry_text(k)]
        if not strays:
            return data
        text = ",".join(_entry_text(x) or str(x) for x in (data["budget_schedule"], *strays))
        keys = ", ".join(f"{_entry_text(k)} read as the number {k}" if isinstance(k, int) else str(k) for k in strays)
        raise ValueError(f"budget_schedule was cut at its first comma: inside {{ }} YAML ends a value at a "
                         f"comma and made the rest keys of their own ({keys}). Quote it: "
                         f"{{budget_schedule: \"{text}\"}}")

    @field_validator("budget_schedule", mode="before")
    @classmethod
    def _schedule_is_text(cls, v: object) -> object:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            # YAML 1.1 reads an unquoted 1:8 as 68 (base 60): the table was lost before we saw it
            raise ValueError(f"budget_schedule must be text, got the number {v!r}: quote it, e.g. "
                             "budget_schedule: \"1:8\" (YAML reads an unquoted 1:8 as the number 68)")
        return v

    @field_validator("budget_schedule")
    @classmethod
    def _schedule(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if is_auto(v):
            return AUTO
        if is_fixed(v):
            return FIXED
        try:
            return schedule_text(parse_entries(v))
        except ValueError as exc:
            raise ValueError(f"budget_schedule must be BATCH:BUDGET pairs like '1:64,4:16,16:chain', auto or fixed, "
                             f"got {v!r}: {exc}") from None

    def flags(self) -> list[str]:
        out = ["--speculative-ddtree-budget", str(self.budget)]
        if self.topk is not None:
            out += ["--speculative-ddtree-topk", str(self.topk)]
        if self.budget_schedule:
            out += ["--speculative-ddtree-budget-schedule", self.budget_schedule]
        return out


# ``bench``'s budget that stands for the profile's own ``ddtree.budget_schedule`` (DDTREE as served)
PROFILE_SCHEDULE = "schedule"


class RepeatedBudget(ValueError):
    """A budget given twice to ``bench_budgets`` (each value is fine; the list is not)."""


def bench_budgets(values: list[object]) -> list[int | str]:
    """DDTREE budgets to bench: whole numbers >= 1, ``auto`` (the server's own planner) and
    ``schedule`` (the profile's ``ddtree.budget_schedule``), each once, in the given order;
    ``"16"`` and ``"Auto"`` are read as 16 and ``auto``. Raises ValueError naming the bad value
    (``RepeatedBudget`` for one given twice)."""
    out: list[int | str] = []
    for v in values:
        text = str(v).strip().lower()
        if isinstance(v, bool) or not (text in (AUTO, PROFILE_SCHEDULE) or (text.isdigit() and int(text) >= 1)):
            raise ValueError(f"{v!r} is not a budget (whole numbers >= 1, auto or schedule)")
        item: int | str = text if text in (AUTO, PROFILE_SCHEDULE) else int(text)
        if item in out:
            raise RepeatedBudget(f"{item} is given twice")
        out.append(item)
    return out


class BenchSettings(BaseModel):
    """What ``sglpatch bench`` sends by default (each can be overridden on the command line)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrency: list[int] = Field(default_factory=lambda: [1, 4, 16, 64])
    requests: int = Field(default=64, ge=1)           # per concurrency level and arm
    max_new_tokens: int = Field(default=256, ge=1)
    # DDTREE budgets to measure (default: ddtree.budget_schedule where the profile has one, else
    # ddtree.budget); auto: the server's own planner (r7 on); schedule: ddtree.budget_schedule
    budgets: list[int | str] = Field(default_factory=list)

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v):
            raise ValueError("values must be >= 1")
        return v

    @field_validator("budgets", mode="before")
    @classmethod
    def _budgets(cls, v: object) -> list[int | str]:
        if not isinstance(v, list):
            raise ValueError("budgets is a list, e.g. [16, 64, auto]")
        return bench_budgets(v)


class ServeProfile(BaseModel):
    """How SGLang is started on a host for ``check`` and ``bench``. See the module docstring."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    draft_model: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    devices: str | None = None
    port: int | str = 30000
    start_timeout: float = Field(default=900, gt=0)
    ddtree: DDTreeSettings = Field(default_factory=DDTreeSettings)
    dflash_args: list[str] = Field(default_factory=list)
    max_new_tokens: int = Field(default=32, ge=1)
    bench: BenchSettings = Field(default_factory=BenchSettings)

    @field_validator("args", "dflash_args", mode="before")
    @classmethod
    def _strings(cls, v: object) -> object:
        # YAML gives numbers for `--mem-fraction-static 0.8`; argv items are strings
        if isinstance(v, list):
            return [str(x) for x in v]
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v: object) -> object:
        if isinstance(v, dict):
            return {str(k): str(x) for k, x in v.items()}
        return v

    @field_validator("port")
    @classmethod
    def _port(cls, v: int | str) -> int | str:
        lo, hi = _parse_ports(v)
        if not (1 <= lo <= hi <= 65535):
            raise ValueError(f"port must be 1-65535 or a range LOW-HIGH within it, got {v!r}")
        return v

    @model_validator(mode="after")
    def _args_are_not_ours(self) -> "ServeProfile":
        owned = {"--model-path", "--port", "--host", "--speculative-algorithm",
                 "--speculative-draft-model-path"}
        clash = sorted(a for a in self.args if a.split("=", 1)[0] in owned)
        if clash:
            raise ValueError(f"`args` may not set {', '.join(clash)}: sglpatch sets those itself "
                             "(use `model`, `draft_model` and `port`)")
        return self

    @model_validator(mode="after")
    def _schedule_to_bench(self) -> "ServeProfile":
        if PROFILE_SCHEDULE in self.bench.budgets and self.ddtree.budget_schedule is None:
            raise ValueError("bench.budgets names `schedule` (ddtree.budget_schedule as served), but "
                             "ddtree has no budget_schedule: set one, or drop `schedule`")
        return self

    @property
    def ports(self) -> range:
        lo, hi = _parse_ports(self.port)
        return range(lo, hi + 1)

    def environment(self) -> dict[str, str]:
        """``env`` plus ``CUDA_VISIBLE_DEVICES`` from ``devices``."""
        out = dict(self.env)
        if self.devices is not None:
            out["CUDA_VISIBLE_DEVICES"] = self.devices
        return out

    def max_level(self) -> int:
        """The highest check level this profile allows: 3 with a draft model, else 2."""
        return 3 if self.draft_model else 2


def _parse_ports(v: int | str) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    m = _PORTS.match(str(v))
    if not m:
        raise ValueError(f"port must be a number or LOW-HIGH, got {v!r}")
    lo = int(m.group(1))
    return lo, int(m.group(2) or lo)


def _entry_text(x: object) -> str | None:
    """A schedule entry as written, from what YAML 1.1 made of it: ``4:16`` read as the base-60
    number 256 gives "4:16"; "16:chain" stays; anything else None."""
    if isinstance(x, int) and not isinstance(x, bool) and x >= 0:
        return "%d:%d" % divmod(x, 60)
    if isinstance(x, str) and _ENTRY.match(x):
        return x.strip()
    return None
