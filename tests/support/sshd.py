"""A real OpenSSH ``sshd`` on 127.0.0.1 for integration tests.

:func:`start_sshd` generates a host key and a client key with ``ssh-keygen``, writes an sshd_config
(public-key login only, no root login, no SFTP subsystem, ``AllowUsers`` the target user), starts
``sshd -D -e -f <config>`` on a free port and waits until it accepts connections. The caller's
known_hosts (in the work dir) holds the host key under ``[127.0.0.1]:PORT``.

When run as root the target is a dedicated non-root user (:data:`TEST_USER`, created with
``useradd`` if missing); otherwise sshd runs unprivileged and the target is the current user.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
TEST_USER = "sglpatch-test"


@dataclass
class SshServer:
    """A running sshd: where it listens, who may log in, and the client-side key material."""

    host: str
    port: int
    user: str
    identity_file: str
    known_hosts: str
    workdir: Path
    host_key: str                          # path of the server's private host key
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def uid(self) -> int:
        return pwd.getpwnam(self.user).pw_uid

    @property
    def gid(self) -> int:
        return pwd.getpwnam(self.user).pw_gid

    @property
    def home(self) -> Path:
        return Path(pwd.getpwnam(self.user).pw_dir)

    def host_entry(self, python: str, name: str = "sshd-test", **overrides):
        """An inventory :class:`~sglang_patcher.inventory.Host` for this server with ``python``."""
        from sglang_patcher.inventory import Host
        data = dict(name=name, transport="ssh", hostname=self.host, port=self.port, user=self.user,
                    identity_file=self.identity_file, known_hosts=self.known_hosts,
                    python=str(python))
        data.update(overrides)
        return Host(**data)

    def log(self) -> str:
        try:
            return (self.workdir / "sshd.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def sshd_available() -> bool:
    return os.access(SSHD, os.X_OK) and shutil.which("ssh-keygen") is not None


def ensure_test_user(name: str = TEST_USER) -> str:
    """Create the non-root login user (root only); returns its name. Idempotent."""
    # pytest-xdist workers start their own sshd at the same time: one useradd/usermod at a time
    with open(f"/tmp/.sglpatch-test-user-{name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True,
                           capture_output=True)
        # sshd refuses accounts whose password field is locked ('!') even for key login without
        # PAM; '*' means "no password" but not locked.
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
    home = Path(pwd.getpwnam(name).pw_dir)
    home.mkdir(parents=True, exist_ok=True)
    return name


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM sshd when the test process dies, so a killed
    pytest leaves no listener behind (best effort; a no-op elsewhere)."""
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except Exception:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)


def start_sshd(workdir: Path, *, user: str | None = None, attempts: int = 5) -> SshServer:
    """Start sshd for ``user`` (default: see module doc) with its files under ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o755)   # the target user must read authorized_keys here
    is_root = os.geteuid() == 0
    if user is None:
        user = ensure_test_user() if is_root else pwd.getpwuid(os.geteuid()).pw_name
    host_key = workdir / "ssh_host_ed25519_key"
    client_key = workdir / "client_ed25519"
    for k, c in ((host_key, "sglpatch-test-host"), (client_key, "sglpatch-test-client")):
        if not k.exists():
            _keygen(k, c)
    auth = workdir / "authorized_keys"
    shutil.copyfile(client_key.with_suffix(".pub"), auth)
    os.chmod(auth, 0o644)
    if is_root:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)   # privilege separation directory
    last_log = ""
    for _ in range(attempts):
        port = _free_port()
        cfg = workdir / "sshd_config"
        cfg.write_text("\n".join([
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {host_key}",
            f"PidFile {workdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {auth}",
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin no",
            "UsePAM no",
            f"AllowUsers {user}",
            "PrintMotd no",
            "LogLevel VERBOSE",
            "MaxStartups 50",
            "MaxSessions 50",
            "",
        ]))
        log = open(workdir / "sshd.log", "wb")
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + 10
        up = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    up = True
                    break
            except OSError:
                time.sleep(0.05)
        if up:
            known = workdir / "known_hosts"
            pub = host_key.with_suffix(".pub").read_text().split()
            known.write_text(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
            return SshServer(host="127.0.0.1", port=port, user=user,
                             identity_file=str(client_key), known_hosts=str(known),
                             workdir=workdir, host_key=str(host_key), proc=proc)
        last_log = (workdir / "sshd.log").read_text(errors="replace")
        if proc.poll() is None:
            proc.terminate()
            proc.wait(5)
    raise RuntimeError(f"sshd did not start after {attempts} attempts; last log:\n{last_log}")
