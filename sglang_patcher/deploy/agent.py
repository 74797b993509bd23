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
from ..remote.agent_client import AgentClient, describe_holder, holder_is_stale
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
    """Whether we may take over ``lock`` (none held: False); raises LockHeldError naming the holder
    when it is held by a live process and ``break_lock`` is not given."""
    if lock is None:
        return False
    if break_lock or holder_is_stale(lock):
        return True
    raise LockHeldError(f"{host}: {what}: the host is locked by {describe_holder(lock)}",
                        hint="wait for it to finish; if that process is gone, rerun with --break-lock")
