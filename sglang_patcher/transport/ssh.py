"""The ``ssh`` transport: Fabric for connection set-up, a raw paramiko channel per command.

Fabric's :class:`fabric.Connection` resolves the target the way ``ssh`` does (``~/.ssh/config``:
HostName, User, Port, IdentityFile, ProxyJump/ProxyCommand; agent keys). Fabric accepts unknown host
keys by default; here every connection (and every ProxyJump hop) gets paramiko's ``RejectPolicy`` and
the host keys of ``known_hosts`` (the host's own file, else ssh_config's ``UserKnownHostsFile``, else
``~/.ssh/known_hosts``), so an unknown or changed key fails closed with
:class:`~sglang_patcher.errors.HostKeyError` naming ``host:port``.

Commands run on one exec channel each (``exec_command(shlex.join(argv))``), with binary stdin sent
by a writer thread and stdout/stderr drained by reader threads, so neither side can block the other
however large the payloads are. This module is the ONE place where paramiko/socket errors become
:class:`~sglang_patcher.errors.TransportError`.
"""

from __future__ import annotations

import os
import shlex
import socket
import threading
import time
from typing import Callable, Sequence

import paramiko
from fabric import Config, Connection
from invoke.exceptions import AmbiguousEnvVar, UncastableEnvVar, UnknownFileType
from paramiko.ssh_exception import (BadHostKeyException, NoValidConnectionsError,
                                    SSHException)

from ..errors import HostKeyError, IdentityFileError, TransportError
from .base import CommandResult

_CHUNK = 1 << 16


class _RejectUnknownKey(paramiko.MissingHostKeyPolicy):
    """Like paramiko's RejectPolicy, but raising our HostKeyError with what to do."""

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):  # noqa: D401 - paramiko API
        # paramiko passes "[host]:port" for non-22 ports, plain host otherwise
        host, port = _split_hostport(hostname)
        raise HostKeyError(
            f"{host}:{port}: host key unknown ({key.get_name()} "
            f"SHA256:{_fingerprint(key)}); refusing to connect",
            hint=(f"check the fingerprint with the host's owner, then add it: "
                  f"ssh-keyscan -p {port} {host} >> {self.known_hosts}"))


def _split_hostport(hostname: str) -> tuple[str, int]:
    if hostname.startswith("[") and "]:" in hostname:
        host, _, port = hostname[1:].partition("]:")
        return host, int(port)
    return hostname, 22


# the private key types paramiko reads (DSS where this paramiko still has it), as its client tries them
_KEY_CLASSES = tuple(c for c in (getattr(paramiko, n, None) for n in ("RSAKey", "DSSKey", "ECDSAKey", "Ed25519Key"))
                     if c is not None)


def _fingerprint(key: paramiko.PKey) -> str:
    import base64
    import hashlib
    return base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


class SSHTransport:
    """A :class:`~sglang_patcher.transport.base.Transport` over SSH for one inventory host.

    ``round_trips`` counts exec channels opened (one per :meth:`run`). The connection is opened
    lazily on the first :meth:`run` (or :meth:`open`) and reused; :meth:`close` ends it.
    """

    def __init__(self, host, *, connect_timeout: float = 15.0):
        self.host = host
        self.name = host.name
        self.round_trips = 0
        self.connect_timeout = connect_timeout
        self._conn: Connection | None = None

    # -- connection set-up -------------------------------------------------------------------

    def _build_connection(self) -> Connection:
        h = self.host
        config = Config()
        connect_kwargs: dict = {}
        if h.identity_file:
            connect_kwargs["key_filename"] = [h.identity_file]
        target = h.ssh_alias or h.hostname
        kwargs: dict = {"config": config, "connect_timeout": self.connect_timeout,
                        "connect_kwargs": connect_kwargs}
        if h.user:
            kwargs["user"] = h.user
        if h.port:
            kwargs["port"] = h.port
        conn = Connection(target, **kwargs)
        if h.ssh_alias and h.hostname:
            conn.host = h.hostname   # explicit hostname overrides the alias' HostName
        return conn

    def _known_hosts_file(self, conn: Connection) -> str:
        if self.host.known_hosts:
            return self.host.known_hosts
        configured = conn.ssh_config.get("userknownhostsfile")
        if configured:
            return os.path.expanduser(configured.split()[0])
        return os.path.expanduser("~/.ssh/known_hosts")

    def _harden(self, conn: Connection, known_hosts: str) -> None:
        """Strict host-key checking on ``conn`` and every ProxyJump hop before it.

        Keys come from ``known_hosts`` and, unless the host names its own file in hosts.yaml, also
        from the system-wide file (ssh_config ``GlobalKnownHostsFile``, default
        /etc/ssh/ssh_known_hosts), as ``ssh`` does.
        """
        client = conn.client
        client.set_missing_host_key_policy(_RejectUnknownKey(known_hosts))
        files = [known_hosts]
        if not self.host.known_hosts:
            glob = conn.ssh_config.get("globalknownhostsfile") or "/etc/ssh/ssh_known_hosts"
            files += [os.path.expanduser(f) for f in glob.split()]
        for path in files:
            if not os.path.isfile(path):
                continue
            try:
                client.load_system_host_keys(path)
            except (OSError, SSHException) as exc:
                raise TransportError(f"{self.name}: cannot read known_hosts {path} ({exc})",
                                     hint="fix or remove the malformed line") from exc
        if isinstance(conn.gateway, Connection):
            self._harden(conn.gateway, known_hosts)

    def open(self) -> None:
        """Connect (idempotent). Raises HostKeyError / TransportError."""
        if self._conn is not None and self._conn.is_connected:
            return
        where = self.host.address
        key = self.host.identity_file
        if key:
            self._check_identity_file(key)   # before any network attempt: a bad file is said at once
        try:
            conn = self._build_connection()
            known_hosts = self._known_hosts_file(conn)
            self._harden(conn, known_hosts)
            where = f"{conn.host}:{conn.port}"
            conn.open()
        except HostKeyError:
            raise
        except BadHostKeyException as exc:
            bad_host, bad_port = _split_hostport(exc.hostname)
            hop = conn
            while isinstance(hop, Connection):   # paramiko names the host only: find its port
                if hop.host == bad_host:
                    bad_port = hop.port
                    break
                hop = hop.gateway
            known_name = bad_host if bad_port == 22 else f"[{bad_host}]:{bad_port}"
            raise HostKeyError(
                f"{bad_host}:{bad_port}: host key CHANGED (got {exc.key.get_name()} SHA256:{_fingerprint(exc.key)}, "
                f"known_hosts has SHA256:{_fingerprint(exc.expected_key)}); refusing to connect",
                hint=("this may be an attack or a reinstalled host; after checking with its owner, "
                      f"remove the old key (ssh-keygen -R '{known_name}' -f {known_hosts})"
                      " and add the new one with ssh-keyscan")) from exc
        except paramiko.AuthenticationException as exc:
            raise TransportError(f"{self.name} ({where}): authentication failed ({exc})",
                                 hint=f"check user/identity_file in {self._inventory} or your ssh agent; "
                                      "`ssh` to the host by hand to compare") from exc
        except NoValidConnectionsError as exc:   # its text starts "[Errno None]": say what each address said
            why = "; ".join(sorted({(e.strerror or str(e)).lower() for e in exc.errors.values()}))
            raise TransportError(f"{self.name} ({where}): cannot connect ({why or 'no address answered'})",
                                 hint="is the host up and sshd listening on that port?") from exc
        except (socket.timeout, TimeoutError) as exc:
            raise TransportError(f"{self.name} ({where}): connection timed out after "
                                 f"{self.connect_timeout:g} s",
                                 hint="check the network path / ProxyJump settings") from exc
        except socket.gaierror as exc:
            raise TransportError(f"{self.name} ({where}): cannot resolve host name ({exc})",
                                 hint=f"fix hostname/ssh_alias in {self._inventory}") from exc
        except (SSHException, OSError, EOFError, ValueError, AmbiguousEnvVar, UncastableEnvVar,
                UnknownFileType) as exc:
            text = str(exc)
            if "No authentication methods available" in text:
                raise TransportError(f"{self.name} ({where}): no key to log in with (no identity_file, "
                                     "no key in ssh-agent, none under ~/.ssh)",
                                     hint=f"set identity_file of host {self.name} in {self._inventory}, or load "
                                          "the key with ssh-add") from exc
            hint = None
            if key and ("private key" in text or "not a valid" in text):
                raise IdentityFileError(f"{self.name}: identity_file {key} is not a private key this client can read "
                                        f"({text})",
                                        hint=f"name the private key (not the .pub beside it) in identity_file of "
                                             f"host {self.name} in {self._inventory}; a passphrase-protected key goes in "
                                             "ssh-agent instead (ssh-add)") from exc
            if "protocol banner" in text:
                hint = ("something answered on that port but not as an SSH server, or too slowly: check "
                        f"hostname/port in {self._inventory} (and any firewall in between)")
            raise TransportError(f"{self.name} ({where}): SSH connection failed ({exc})", hint=hint) from exc
        self._conn = conn

    def _check_identity_file(self, key: str) -> None:
        """Refuse an ``identity_file`` that cannot serve as this host's key — missing, a directory,
        unreadable, or no private key paramiko can read (a ``.pub``, any other file) — before
        connecting: paramiko would try other keys and fail later, or after a connect timeout.
        A passphrase-protected key passes (paramiko asks ssh-agent for it). Raises
        :class:`IdentityFileError` (exit 2) naming the file, the host and the inventory."""
        fix = (f"fix identity_file of host {self.name} in {self._inventory} (a private key file on this "
               "machine), or remove it to use your ssh agent")
        if os.path.isdir(key) or not os.access(key, os.R_OK):
            why = ("is a directory, not a key file" if os.path.isdir(key) else
                   "is not readable by this user" if os.path.exists(key) else "does not exist")
            raise IdentityFileError(f"{self.name}: identity_file {key} {why}", hint=fix)
        errors = []
        for cls in _KEY_CLASSES:
            try:
                cls.from_private_key_file(key)
                return
            except paramiko.PasswordRequiredException:
                return   # encrypted: the key (or ssh-agent holding it) is tried when connecting
            except (SSHException, ValueError, TypeError, IndexError, UnicodeError) as exc:
                errors.append(str(exc))
            except OSError as exc:
                raise IdentityFileError(f"{self.name}: identity_file {key} cannot be read ({exc.strerror or exc})",
                                        hint=fix) from exc
        raise IdentityFileError(
            f"{self.name}: identity_file {key} is not a private key this client can read "
            f"({'; '.join(dict.fromkeys(errors)) or 'no key type matched'}); no connection was attempted",
            hint=f"name the private key (not the .pub beside it) in identity_file of host {self.name} in "
                 f"{self._inventory}; a passphrase-protected key goes in ssh-agent instead (ssh-add)")

    @property
    def _inventory(self) -> str:
        """The inventory file the host comes from (hints say where to fix it)."""
        return str(getattr(self.host, "inventory_file", "hosts.yaml"))

    @property
    def is_loopback(self) -> bool:
        """Whether the (resolved) target is this machine, where compressing transfers only costs."""
        target = self._conn.host if self._conn is not None else (self.host.hostname or "")
        return target in ("localhost", "::1") or target.startswith("127.")

    # -- commands --------------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = None, sudo: bool = False,
            stdout_sink: Callable[[bytes], None] | None = None) -> CommandResult:
        """Run ``argv`` on the host in one exec channel. See the Transport protocol.

        ``stdin`` bytes are sent then EOF'd; stdout/stderr come back as bytes (stdout handed to
        ``stdout_sink`` piece by piece instead, when given). ``timeout`` (seconds)
        bounds the whole command. Raises TransportError when the host cannot be reached, the
        channel breaks, or the timeout passes; a non-zero exit is in the result.
        """
        argv = list(argv)
        if sudo:
            argv = ["sudo", "-n", *argv]
        self.open()
        assert self._conn is not None
        command = shlex.join(argv)
        deadline = time.monotonic() + timeout if timeout else None
        self.round_trips += 1
        try:
            chan = self._conn.client.get_transport().open_session(timeout=self.connect_timeout)
        except (SSHException, OSError, EOFError, AttributeError) as exc:
            self._drop()
            raise TransportError(f"{self.name}: cannot open an SSH channel ({exc})",
                                 hint="the connection dropped; retry") from exc
        try:
            return self._exec(chan, argv, command, stdin, deadline, timeout, stdout_sink)
        finally:
            chan.close()

    def _exec(self, chan, argv, command, stdin, deadline, timeout, stdout_sink=None) -> CommandResult:
        out: list[bytes] = []
        err: list[bytes] = []
        errors: list[BaseException] = []

        def pump(recv, sink):
            try:
                while True:
                    data = recv(_CHUNK)
                    if not data:
                        return
                    sink(data)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        def feed():
            try:
                if stdin:
                    view = memoryview(stdin)
                    for i in range(0, len(view), _CHUNK):
                        chan.sendall(view[i:i + _CHUNK])
                chan.shutdown_write()
            except BaseException as exc:
                # the remote side may exit without reading all of stdin: not our error to raise
                # when it produced an exit status; recorded for the broken-channel case.
                errors.append(exc)

        try:
            chan.exec_command(command)
        except (SSHException, OSError, EOFError) as exc:
            raise TransportError(f"{self.name}: cannot start command {argv[0]} ({exc})") from exc
        threads = [threading.Thread(target=feed, daemon=True),
                   threading.Thread(target=pump, args=(chan.recv, stdout_sink or out.append), daemon=True),
                   threading.Thread(target=pump, args=(chan.recv_stderr, err.append), daemon=True)]
        for t in threads:
            t.start()
        for t in threads[1:]:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                chan.close()
                raise TransportError(f"{self.name}: command timed out after {timeout:g} s: "
                                     f"{argv[0]}", hint="raise the timeout or check the host's load")
        threads[0].join(5)
        status = chan.recv_exit_status()   # -1 when the channel closed without one
        if status == -1:
            reason = f" ({errors[0]})" if errors else ""
            raise TransportError(f"{self.name}: connection lost while running {argv[0]}{reason}",
                                 hint="retry; check the host's sshd and network")
        return CommandResult(self.name, argv, status, b"".join(out), b"".join(err))

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # closing a broken connection: nothing to report
                pass
        self._conn = None

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._drop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
