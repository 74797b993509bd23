"""Gates of ``sglpatch apply --gate``: checks run after the push; a failed gate rolls back.

``check:N`` — ``sglpatch check --level N`` must pass (N 0-3; ``check`` alone is the highest level
the host's profile allows). ``bench:min-ratio=R`` — at every measured concurrency, DDTREE's output
tokens/s must be at least R times DFLASH's (``bench:`` alone means R = 1.0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

_CHECK = re.compile(r"^check(?::([0-3]))?$")
_BENCH = re.compile(r"^bench(?::min-ratio=([0-9]*\.?[0-9]+))?$")


@dataclass(frozen=True)
class Gate:
    """One parsed gate: ``kind`` check | bench; ``level`` (check; None = the profile's highest);
    ``min_ratio`` (bench)."""

    kind: str
    level: int | None = None
    min_ratio: float = 1.0

    @classmethod
    def parse(cls, text: str) -> "Gate":
        """Raises ConfigError (exit 2) naming the accepted forms."""
        t = text.strip()
        m = _CHECK.match(t)
        if m:
            return cls("check", level=int(m.group(1)) if m.group(1) else None)
        m = _BENCH.match(t)
        if m:
            return cls("bench", min_ratio=float(m.group(1)) if m.group(1) else 1.0)
        raise ConfigError(f"unknown gate {text!r}",
                          hint="use check:N (N 0-3), check, bench:min-ratio=R (e.g. 1.0) or bench")

    def __str__(self) -> str:
        if self.kind == "check":
            return "check" if self.level is None else f"check:{self.level}"
        return f"bench:min-ratio={self.min_ratio:g}"
