"""The host's deploy agent as every step reaches it: the client for an inventory :class:`Host` and
its discovered :class:`HostInfo`, the rule for taking over the host's lock, and the progress
callback the long steps report to.

The client itself (one method per agent op, the agent's refusals as typed errors, the lock
holder, the payload tar) is :mod:`sglang_patcher.remote.agent_client`.
"""

from __future__ import annotations

from typing import Any, Callable

from ..discovery import HostInfo
from ..errors import LockHeldError
from ..inventory import Host
from ..remote.agent_client import AgentClient, describe_holder, describe_running, holder_is_ours, holder_liveness
from ..transport.base import Transport

# ``progress(step, detail)``: told each step of an apply or rollback (the CLI prints it)
Progress = Callable[[str, str], None]


def no_progress(step: str, detail: str) -> None:
    pass


def host_name(host: Host, transport: Transport) -> str:
    return str(host.name or transport.name)


def agent_for(transport: Transport, host: Host, info: HostInfo) -> AgentClient:
    """The agent client of ``host``: the discovered interpreter (else the inventory's), its
    site-packages, its ``state_dir`` and ``sudo``."""
    return AgentClient(transport, str(info.interpreter or host.python), str(info.site_packages),
                       state_dir=host.state_dir, sudo=bool(host.sudo))


def lock_takeover(host: str, lock: dict[str, Any] | None, break_lock: bool, what: str) -> bool:
    """Whether we may take over ``lock`` (none held: False). A holder that is a process of this
    machine that no longer runs is taken over by itself; ``break_lock`` breaks a holder that cannot
    be checked from here (another machine's, an unreadable lock) or this very process's own; a
    holder that still runs is never broken (the agent checks again on the host). Raises
    LockHeldError (exit 8) naming the holder — its pid, host and command and that it still runs,
    when it does — and what to do."""
    if lock is None:
        return False
    state, command = holder_liveness(lock)
    if state == "gone":
        return True
    if state == "running" and holder_is_ours(lock):
        if break_lock:
            return True
        raise LockHeldError(f"{host}: {what}: the host is locked by {describe_holder(lock)}, an earlier step "
                            f"of this process", hint="rerun with --break-lock")
    if state == "running":
        raise LockHeldError(
            f"{host}: {what}: the host is locked by {describe_holder(lock)}: {describe_running(lock, command)}"
            + ("; --break-lock breaks only a lock whose holder no longer runs" if break_lock else ""),
            hint=f"wait for it to finish (`sglpatch status --host {host}` shows the lock), or, if it hangs, "
                 f"stop that process (`kill {lock.get('pid')}` on {lock.get('host')}) and rerun")
    if break_lock:
        return True
    raise LockHeldError(f"{host}: {what}: the host is locked by {describe_holder(lock)}",
                        hint="wait for it to finish; if that process is gone, rerun with --break-lock")
