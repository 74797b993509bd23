"""Whether the process named by a lock holder (``{"user", "pid", "host", "started", ...}``: the
client that took the host's lock) still runs — the one rule behind taking over a stale lock and
behind ``--break-lock``, which breaks only a lock whose holder is gone (or cannot be checked from
here: another machine's), never one whose holder still runs.

Standard library only, and no import of other modules: shared by the client
(:mod:`sglang_patcher.remote.agent_client`) and the deploy agent (joined into it, see
:mod:`sglang_patcher.remote.bundle`), which checks again on the host before it breaks a lock.
"""

import calendar
import os
import socket
import time


def _proc_stat(pid):
    """``(state, started)`` of process ``pid`` from /proc: its state letter (``b"Z"`` for a zombie)
    and when it started (epoch seconds); None for what cannot be read."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None, None
    state = fields[0][:1] if fields else None
    try:
        ticks = int(fields[19])       # field 22, starttime: clock ticks after boot
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return state, btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return state, None


def process_command(pid, limit=160):
    """The command line of ``pid`` (from /proc, cut at ``limit`` characters), or None."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None
    text = " ".join(argv)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def holder_liveness(h):
    """``(state, detail)`` of the lock holder ``h`` as seen from this machine: ``gone`` (a process
    of this machine that no longer runs: exited, a zombie not yet reaped, or its pid now another,
    later process's), ``running`` (it runs here; ``detail`` its command line, when readable),
    ``unknown`` (another machine's, an unreadable lock, no pid: it cannot be checked from here)."""
    if not h or h.get("unreadable") or h.get("host") != socket.gethostname():
        return "unknown", None
    try:
        pid = int(h.get("pid"))
    except (TypeError, ValueError):
        return "unknown", None
    if pid <= 0:
        return "unknown", None
    if pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone", None
        except PermissionError:
            pass                        # another user's process: it exists
        except OSError:
            return "unknown", None
        proc_state, begun = _proc_stat(pid)
        if proc_state == b"Z":          # killed, not yet reaped by its parent: it holds nothing any more
            return "gone", None
        started = _lock_started(h)
        if started is not None and begun is not None and begun > started + 2:
            return "gone", None         # the pid was given to a process started after the lock was taken
    return "running", process_command(pid)


def _lock_started(h):
    try:
        return calendar.timegm(time.strptime(str(h.get("started")), "%Y-%m-%dT%H:%M:%SZ"))
    except (TypeError, ValueError):
        return None
