"""The SSH transport against a real OpenSSH sshd on loopback (see tests/conftest.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time

import pytest

from sglang_patcher.errors import HostKeyError, TransportError
from sglang_patcher.transport import connect
from sglang_patcher.transport.ssh import SSHTransport

pytestmark = pytest.mark.ssh

PY = "/usr/bin/python3"


def test_binary_stdin_stdout_round_trip(sshd):
    host = sshd.host_entry(PY)
    payload = bytes(range(256)) * 8192 + os.urandom(3_000_000)     # ~5 MB, every byte value
    with connect(host) as t:
        assert isinstance(t, SSHTransport)
        r = t.run([PY, "-c", "import sys; d = sys.stdin.buffer.read(); "
                             "sys.stdout.buffer.write(d[::-1]); sys.stderr.write('ok')"],
                  stdin=payload)
        assert r.ok and r.stdout == payload[::-1] and r.stderr == b"ok"
        who = t.run(["id", "-un"])
        assert who.stdout.decode().strip() == sshd.user
        assert t.round_trips == 2


def test_no_deadlock_when_both_streams_flood_while_stdin_is_still_sent(sshd):
    # cat echoes while we are still writing; stderr gets 4 MB at the same time. Without
    # concurrent pumping, one side's window fills and both ends wait forever.
    host = sshd.host_entry(PY)
    data = os.urandom(8 << 20)
    script = ("import sys, threading\n"
              "def err():\n    sys.stderr.buffer.write(b'e' * (4 << 20)); sys.stderr.flush()\n"
              "t = threading.Thread(target=err); t.start()\n"
              "while True:\n    b = sys.stdin.buffer.read1(65536)\n    if not b: break\n"
              "    sys.stdout.buffer.write(b)\n"
              "t.join()\n")
    with connect(host) as t:
        r = t.run([PY, "-c", script], stdin=data, timeout=60)
    assert r.ok
    assert hashlib.sha256(r.stdout).digest() == hashlib.sha256(data).digest()
    assert len(r.stderr) == 4 << 20


def test_exit_codes_quoting_and_round_trip_count(sshd):
    host = sshd.host_entry(PY)
    with connect(host) as t:
        r = t.run(["sh", "-c", 'echo "$1"; exit 7', "sh", "a b;$(rm -rf /) 'q'"])
        assert r.exit_code == 7 and r.stdout == b"a b;$(rm -rf /) 'q'\n"
        assert not r.ok
        with pytest.raises(Exception) as ei:
            r.check()
        assert "exit code 7" in str(ei.value)
        missing = t.run(["/nonexistent/python", "-V"])
        assert missing.exit_code == 127
        # a command that exits without reading its (large) stdin neither hangs nor errors
        early = t.run(["/nonexistent/python"], stdin=b"x" * 5_000_000, timeout=30)
        assert early.exit_code == 127
        assert t.round_trips == 3


@pytest.mark.no_sudo
def test_sudo_prefixes_sudo_n(sshd):
    with connect(sshd.host_entry(PY)) as t:
        r = t.run(["true"], sudo=True)
    assert r.argv[:3] == ["sudo", "-n", "true"]
    assert not r.ok    # the test user has no sudo rights (or sudo is absent): it fails, never prompts


def test_timeout_raises_transport_error(sshd):
    with connect(sshd.host_entry(PY)) as t:
        t0 = time.monotonic()
        with pytest.raises(TransportError, match="timed out after 0.5 s"):
            t.run(["sleep", "5"], timeout=0.5)
        assert time.monotonic() - t0 < 4
        assert t.run(["true"]).ok   # the connection is still usable


def test_unknown_host_key_fails_closed(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = sshd.host_entry(PY, known_hosts=str(empty))
    with connect(host) as t:
        with pytest.raises(HostKeyError) as ei:
            t.run(["true"])
    msg = str(ei.value)
    assert f"127.0.0.1:{sshd.port}" in msg and "unknown" in msg
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {empty}" in msg
    assert ei.value.exit_code == 5
    assert empty.read_text() == ""      # nothing was added behind the user's back


def test_missing_known_hosts_file_fails_closed(sshd, tmp_path):
    host = sshd.host_entry(PY, known_hosts=str(tmp_path / "absent"))
    with connect(host) as t, pytest.raises(HostKeyError, match=f"127.0.0.1:{sshd.port}"):
        t.run(["true"])
    assert not (tmp_path / "absent").exists()


def test_changed_host_key_fails_closed(sshd, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kt, kb = other.with_suffix(".pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {kt} {kb}\n")
    with connect(sshd.host_entry(PY, known_hosts=str(kh))) as t:
        with pytest.raises(HostKeyError) as ei:
            t.run(["true"])
    msg = str(ei.value)
    assert f"127.0.0.1:{sshd.port}" in msg and "CHANGED" in msg and "ssh-keygen -R" in msg


def test_wrong_client_key_is_an_authentication_error(sshd, tmp_path):
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with connect(sshd.host_entry(PY, identity_file=str(key))) as t:
        with pytest.raises(TransportError, match="authentication failed") as ei:
            t.run(["true"])
    assert not isinstance(ei.value, HostKeyError)


def test_a_missing_identity_file_is_named_before_any_connection(sshd, tmp_path):
    """A typo in identity_file: the error names the file and the host, not an authentication
    failure after paramiko fell back to other keys (the sshd would have accepted them)."""
    missing = tmp_path / "id_typo"
    with connect(sshd.host_entry(PY, identity_file=str(missing))) as t:
        with pytest.raises(TransportError) as ei:
            t.run(["true"])
        assert t.round_trips == 0
    assert f"identity_file {missing} does not exist" in ei.value.message
    assert "hosts.yaml" in ei.value.hint and "authentication" not in ei.value.message
    assert ei.value.exit_code == 2, "a hosts.yaml setting: bad configuration, as the README's exit table says"
    with connect(sshd.host_entry(PY, identity_file=str(tmp_path))) as t:
        with pytest.raises(TransportError, match="is a directory, not a key file"):
            t.run(["true"])
    pub = sshd.identity_file + ".pub"  # the public half named by mistake
    with connect(sshd.host_entry(PY, identity_file=pub)) as t:
        with pytest.raises(TransportError) as ei:
            t.run(["true"])
    assert "is not a private key" in ei.value.message and ".pub" in ei.value.hint, str(ei.value)
    assert ei.value.exit_code == 2


@pytest.mark.parametrize("kind", ["the public half", "not a key", "missing", "a directory"])
def test_a_bad_identity_file_is_refused_before_any_connection_attempt(tmp_path, capsys, kind):
    """A bad identity_file was named only after connecting (not a key: after the handshake, or
    after the connect timeout on a host that hangs). Now the CLI exits 2 naming the host, the file
    and the inventory, and a real listener that would hang (accepts, never sends a banner) sees no
    connection at all. Control: a passphrase-protected key passes the check (ssh-agent may hold
    it) and the connection is attempted (a closed port: exit 5)."""
    import json
    import socket

    import yaml

    from sglang_patcher.cli import main

    key = tmp_path / "id_test"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (tmp_path / "notes.txt").write_text("not a key\n")
    bad = {"the public half": f"{key}.pub", "not a key": str(tmp_path / "notes.txt"),
           "missing": str(tmp_path / "id_typo"), "a directory": str(tmp_path)}[kind]
    inv = tmp_path / "lab.yaml"

    def run(port: int, identity: str) -> tuple[int, dict]:
        inv.write_text(yaml.safe_dump({"hosts": {"gpu": {"hostname": "127.0.0.1", "port": port, "user": "u",
                                                          "python": PY, "identity_file": identity}}}))
        capsys.readouterr()
        code = main(["--json", "--hosts", str(inv), "status", "--host", "gpu"])
        return code, json.loads(capsys.readouterr().out)

    with socket.socket() as hang:
        hang.bind(("127.0.0.1", 0))
        hang.listen(1)
        hang.setblocking(False)
        t0 = time.monotonic()
        code, data = run(hang.getsockname()[1], bad)
        assert code == 2 and data["type"] == "IdentityFileError", data
        assert data["error"].startswith(f"gpu: identity_file {bad} "), data
        assert str(inv) in data["hint"], data
        with pytest.raises(BlockingIOError):
            hang.accept()                                 # no connection was made
        assert time.monotonic() - t0 < 15, "waited on the network"
    if kind == "the public half":
        enc = tmp_path / "id_enc"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret-pass", "-f", str(enc)], check=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        code, data = run(closed, str(enc))
        assert code == 5 and "connection refused" in data["error"], data


def test_a_key_held_by_ssh_agent_is_used_without_identity_file(sshd, tmp_path, monkeypatch):
    """No identity_file and no key under ~/.ssh: the key comes from a real ssh-agent, as ssh does."""
    import shutil
    if not (shutil.which("ssh-agent") and shutil.which("ssh-add")):
        pytest.skip("ssh-agent / ssh-add not installed (openssh-client)")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", sshd.identity_file], env=env, check=True, capture_output=True)
        home = tmp_path / "home"
        (home / ".ssh").mkdir(parents=True)  # empty: paramiko finds no default key files
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        with connect(sshd.host_entry(PY, identity_file=None)) as t:
            assert t.run(["echo", "via-agent"]).stdout.strip() == b"via-agent"
        monkeypatch.delenv("SSH_AUTH_SOCK")  # and without the agent the same host is refused
        with connect(sshd.host_entry(PY, identity_file=None)) as t:
            with pytest.raises(TransportError, match="no key to log in with") as ei:
                t.run(["true"])
        assert "identity_file" in ei.value.hint and "ssh-add" in ei.value.hint
    finally:
        agent.terminate()
        agent.wait(10)


def test_a_port_that_is_not_sshd_says_so(sshd):
    """Something listens but is no SSH server (it hangs up at once): the error says to check the
    host's hostname/port, not a bare paramiko message."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        with connect(sshd.host_entry(PY, port=srv.getsockname()[1])) as t:
            with pytest.raises(TransportError) as ei:
                t.run(["true"])
    finally:
        srv.close()
    assert "hostname/port" in (ei.value.hint or ""), str(ei.value)


def test_closed_port_is_a_transport_error(sshd):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with connect(sshd.host_entry(PY, port=port)) as t:
        with pytest.raises(TransportError, match="cannot connect"):
            t.run(["true"])


def _ssh_config(tmp_path, monkeypatch, sshd, body: str) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(body)
    monkeypatch.setenv("HOME", str(home))


def test_ssh_alias_resolved_through_ssh_config(sshd, tmp_path, monkeypatch):
    _ssh_config(tmp_path, monkeypatch, sshd, f"""
Host sglpatch-alias
    HostName 127.0.0.1
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.identity_file}
    UserKnownHostsFile {sshd.known_hosts}
""")
    from sglang_patcher.inventory import Host
    host = Host(name="aliased", ssh_alias="sglpatch-alias", python=PY)
    with connect(host) as t:
        assert t.run(["id", "-un"]).stdout.decode().strip() == sshd.user


def test_proxyjump_chain_with_strict_keys_on_every_hop(sshd, tmp_path, monkeypatch):
    common = f"""    HostName 127.0.0.1
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.identity_file}
    UserKnownHostsFile {sshd.known_hosts}
"""
    _ssh_config(tmp_path, monkeypatch, sshd,
                f"Host jump1\n{common}\nHost jump2\n{common}    ProxyJump jump1\n"
                f"Host target\n{common}    ProxyJump jump2\n")
    from sglang_patcher.inventory import Host
    logins_before = sshd.log().count("Accepted publickey")
    with connect(Host(name="via-jumps", ssh_alias="target", python=PY)) as t:
        r = t.run(["sh", "-c", "echo $SSH_CONNECTION"])
    assert r.ok and r.stdout.split()[2] == b"127.0.0.1"
    time.sleep(0.2)
    # three logins: jump1, jump2 through jump1, target through jump2
    assert sshd.log().count("Accepted publickey") - logins_before == 3

    # a hop whose key is unknown stops the chain
    kh = tmp_path / "empty_kh"
    kh.write_text("")
    with connect(Host(name="via-jumps", ssh_alias="target", python=PY, known_hosts=str(kh))) as t:
        with pytest.raises(HostKeyError, match=f"127.0.0.1:{sshd.port}"):
            t.run(["true"])


def test_the_test_sshd_has_no_sftp_and_we_do_not_need_it(sshd):
    # hosts without SFTP must work: everything travels on exec channels
    with connect(sshd.host_entry(PY)) as t:
        assert t.run([PY, "-c", "print(1)"]).stdout == b"1\n"
        with pytest.raises(Exception):
            t._conn.client.open_sftp()


def test_an_unreachable_host_says_what_each_address_answered_without_paramikos_errno_none(sshd, tmp_path):
    """Issue 18: paramiko's "[Errno None] Unable to connect to port N" leaked into the message.
    Also: the hint names the inventory file the host was read from."""
    import socket

    import yaml

    from sglang_patcher.inventory import load_inventory
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inv = tmp_path / "lab.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"gone": {"hostname": "127.0.0.1", "port": port, "python": PY,
                                                      "identity_file": "/nonexistent/key"}}}))
    host = load_inventory(inv).get("gone")
    with connect(host.model_copy(update={"identity_file": sshd.identity_file})) as t:
        with pytest.raises(TransportError) as ei:
            t.run(["true"])
    assert "Errno None" not in str(ei.value) and "connection refused" in ei.value.message, ei.value
    with connect(host) as t:
        with pytest.raises(TransportError) as ei:
            t.run(["true"])
    assert str(inv) in ei.value.hint and "hosts.yaml" not in ei.value.hint
