"""Transports: how sglpatch runs one command on a host. ``connect(host)`` picks the right one.

See :mod:`.base` for the interface every transport offers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import CommandResult, Transport
from .local import LocalTransport

if TYPE_CHECKING:
    from ..inventory import Host

__all__ = ["CommandResult", "LocalTransport", "Transport", "connect"]


def connect(host: "Host") -> Transport:
    """A transport for inventory ``host``: :class:`LocalTransport` for ``transport: local``, else an
    :class:`~.ssh.SSHTransport` (connected lazily on the first command; the SSH connection errors,
    host keys included, surface from that first ``run``). Use it as a context manager or ``close()``.
    """
    if host.transport == "local":
        return LocalTransport(host.name)
    from .ssh import SSHTransport  # paramiko is only imported when SSH is used
    return SSHTransport(host)
