"""What every part of the agent shares: the state dir's name, the phases, the expected-failure
exception and its exit code, the clock, deployment ids, and the test hooks that kill the agent, or
make one file operation fail, at a chosen point. (User names: ``access.user_name``.)"""

from __future__ import annotations

import errno
import os
import re
import sys
import time

STATE_NAME = ".sglpatch"
EXPECTED_FAILURE_EXIT = 3
ACTIVE_PHASES = ("staging", "committing", "pushed", "verified", "rolling_back")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Fail(Exception):
    """An expected failure: printed as ``{"ok": false, "kind", "error", **extra}``, exit 3."""

    def __init__(self, kind, error, **extra):
        super().__init__(error)
        self.kind = kind
        self.error = error
        self.extra = extra


def now():
    """UTC, to the microsecond: records sort by it (two deployments within one second stay in order)."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%06dZ" % int((t % 1) * 1e6)


def is_id(did):
    """True when ``did`` has the form of a deployment id (what a name under ``backups/`` may be)."""
    return isinstance(did, str) and bool(_ID_RE.match(did))


def check_id(did):
    if not is_id(did):
        raise Fail("bad_args", "bad deployment id %r" % (did,))
    return did


def crash_point(point, count):
    """Test hook: die (exit 137, nothing cleaned up) when ``SGLPATCH_AGENT_CRASH`` is ``point:count``."""
    spec = os.environ.get("SGLPATCH_AGENT_CRASH")
    if spec and spec == "%s:%d" % (point, count):
        sys.stdout.flush()
        os._exit(137)


def fail_point(point, count, path):
    """Test hook: raise the ``PermissionError`` (EPERM) that renaming over an immutable file gives when
    ``SGLPATCH_AGENT_FAIL`` is ``point:count`` — ``commit:n``: the n-th rename of a push fails,
    ``restore:n``: the n-th rename of a rollback's restore — so tests can make a push or a rollback
    fail mid-way, after some files were renamed, whatever the host allows."""
    spec = os.environ.get("SGLPATCH_AGENT_FAIL")
    if spec and spec == "%s:%d" % (point, count):
        raise PermissionError(errno.EPERM, "Operation not permitted (test hook SGLPATCH_AGENT_FAIL=%s)" % spec,
                              path)
