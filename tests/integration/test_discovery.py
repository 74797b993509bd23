"""Discovery on the real sglang 0.5.23 venv, over real SSH and locally; ambiguity is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from sglang_patcher.discovery import discover
from sglang_patcher.errors import DiscoveryError
from sglang_patcher.manifest import read_record
from sglang_patcher.transport import connect

pytestmark = [pytest.mark.sglang]


def _check_info(info, target, host):
    assert info.host == host.name
    assert info.sglang_version == "0.5.23"
    assert info.interpreter == str(target)
    assert info.python_version.startswith("3.")
    assert info.site_packages == str(target.site_packages)
    assert info.package_dir == str(target.package_dir)
    assert info.dist_info == "sglang-0.5.23.dist-info"
    assert [d.version for d in info.distributions] == ["0.5.23"]
    assert info.writable and info.unwritable_count == 0
    assert info.free_bytes > 0
    expected = read_record((target.site_packages / info.dist_info / "RECORD").read_text())
    assert info.record == expected and len(info.record) > 10_000
    assert info.record["sglang/version.py"] is not None
    assert "record" not in info.to_dict() and info.to_dict()["sglang_version"] == "0.5.23"


@pytest.mark.ssh
def test_discover_over_ssh_in_one_round_trip(ssh_host, sglang_target, sshd):
    with connect(ssh_host) as t:
        info = discover(t, ssh_host)
        assert t.round_trips == 1
    _check_info(info, sglang_target, ssh_host)
    assert info.user == sshd.user


def test_discover_local(local_host, local_target):
    with connect(local_host) as t:
        info = discover(t, local_host)
        assert t.round_trips == 1
    _check_info(info, local_target, local_host)


@pytest.mark.ssh
def test_read_only_install_is_reported(ssh_host, sglang_target):
    """A directory whose entries the user cannot change stops apply and is reported; a read-only
    file of the user's own does not (apply renames a new file over it, mode kept)."""
    d = sglang_target.package_dir / "srt" / "speculative"
    os.chmod(sglang_target.package_dir / "srt" / "server_args.py", 0o444)
    with connect(ssh_host) as t:
        info = discover(t, ssh_host)
    assert info.writable and info.unwritable_count == 0, info.unwritable_why
    mode = d.stat().st_mode
    os.chmod(d, 0o555)
    try:
        with connect(ssh_host) as t:
            info = discover(t, ssh_host)
    finally:
        os.chmod(d, mode)
    assert not info.writable and info.unwritable_count == 1
    assert info.unwritable == ["sglang/srt/speculative"], info.unwritable


@pytest.mark.ssh
def test_missing_interpreter_names_host_path_and_fix(sshd):
    host = sshd.host_entry("/opt/nowhere/bin/python", name="gpu-x")
    with connect(host) as t, pytest.raises(DiscoveryError) as ei:
        discover(t, host)
    e = ei.value
    assert "gpu-x" in e.message and "/opt/nowhere/bin/python" in e.message and "does not exist" in e.message
    assert "inventory file" in e.hint and "python" in e.hint
    assert e.exit_code == 6


@pytest.mark.ssh
def test_non_executable_interpreter_over_ssh(sshd, sglang_target):
    fake = sglang_target.venv / "bin" / "python-noexec"
    fake.write_text("")
    os.chmod(fake, 0o644)
    host = sshd.host_entry(str(fake), name="gpu-y")
    with connect(host) as t, pytest.raises(DiscoveryError, match="gpu-y: interpreter .* is not executable"):
        discover(t, host)


def test_missing_interpreter_local(tmp_path):
    from sglang_patcher.inventory import Host
    host = Host(name="loc", transport="local", python=str(tmp_path / "bin/python"))
    with pytest.raises(DiscoveryError, match="does not exist"):
        discover(connect(host), host)


def test_interpreter_without_sglang_is_refused(tmp_path):
    from sglang_patcher.inventory import Host
    venv = tmp_path / "empty-venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    host = Host(name="bare", transport="local", python=str(venv / "bin/python"))
    with pytest.raises(DiscoveryError) as ei:
        discover(connect(host), host)
    assert "no SGLang distribution is visible" in ei.value.message
    assert str(venv / "bin/python") in ei.value.message


def _second_install(target, version: str = "0.5.22"):
    """A second sglang distribution on sys.path: a directory added by a .pth file (as a develop
    install or a stray PYTHONPATH does), holding a real copy of the dist-info with another version."""
    extra = target.site_packages / "zz-extra-site"
    extra.mkdir()
    src = target.site_packages / "sglang-0.5.23.dist-info"
    dst = extra / f"sglang-{version}.dist-info"
    shutil.copytree(src, dst)
    meta = (dst / "METADATA").read_text().replace("Version: 0.5.23", f"Version: {version}", 1)
    (dst / "METADATA").write_text(meta)
    (target.site_packages / "zz-extra.pth").write_text(str(extra) + "\n")
    if os.geteuid() == 0:
        for p in [extra, *extra.rglob("*"), target.site_packages / "zz-extra.pth"]:
            os.chown(p, target.uid, target.gid)
    return extra


@pytest.mark.ssh
def test_two_visible_installs_are_refused_naming_each(ssh_host, sglang_target):
    extra = _second_install(sglang_target)
    with connect(ssh_host) as t, pytest.raises(DiscoveryError) as ei:
        discover(t, ssh_host)
    msg = ei.value.message
    assert "2 SGLang installs are visible" in msg
    assert f"sglang 0.5.23 at {sglang_target.site_packages}" in msg
    assert f"sglang 0.5.22 at {extra}" in msg
    assert "uninstall" in ei.value.hint
    assert sorted(d.version for d in ei.value.distributions) == ["0.5.22", "0.5.23"]


def test_two_visible_installs_refused_locally(local_host, local_target):
    _second_install(local_target, "0.5.24")
    with pytest.raises(DiscoveryError, match="2 SGLang installs"):
        discover(connect(local_host), local_host)


def test_editable_install_is_refused(local_host, local_target):
    di = local_target.site_packages / "sglang-0.5.23.dist-info"
    (di / "direct_url.json").write_text(json.dumps(
        {"url": "file:///src/sglang/python", "dir_info": {"editable": True}}))
    with pytest.raises(DiscoveryError, match="editable install"):
        discover(connect(local_host), local_host)


def test_package_without_metadata_shadowing(local_host, local_target, tmp_path):
    # the dist-info is there but the package directory is gone: a broken install
    shutil.rmtree(local_target.package_dir)
    with pytest.raises(DiscoveryError, match="no importable `sglang` package"):
        discover(connect(local_host), local_host)


@pytest.mark.ssh
@pytest.mark.no_sudo
def test_sudo_that_cannot_run_is_a_transport_error_not_a_missing_interpreter(sshd, sglang_target):
    from sglang_patcher.errors import TransportError
    host = sshd.host_entry(sglang_target, sudo=True)
    with connect(host) as t, pytest.raises(TransportError, match="sudo") as ei:
        discover(t, host)
    assert not isinstance(ei.value, DiscoveryError)
    assert "sudo: false" in ei.value.hint or "passwordless sudo" in ei.value.hint


@pytest.mark.ssh
def test_user_site_install_beside_the_env_is_refused(ssh_host, sglang_target, sshd):
    """A user-site install (pip install --user) seen together with the env's own: the venv is switched
    to include-system-site-packages (which turns the user site on), and the SSH user's
    ~/.local/lib/pythonX.Y/site-packages gets a real copy of the distribution's metadata."""
    cfg = sglang_target.venv / "pyvenv.cfg"
    original = cfg.read_text()
    pyver = sglang_target.site_packages.parent.name            # python3.11
    user_site = sshd.home / ".local" / "lib" / pyver / "site-packages"
    dist = user_site / "sglang-0.5.22.dist-info"
    created = [p for p in (sshd.home / ".local", sshd.home / ".local" / "lib",
                           sshd.home / ".local" / "lib" / pyver, user_site) if not p.exists()]
    try:
        cfg.write_text(original.replace("include-system-site-packages = false",
                                        "include-system-site-packages = true"))
        shutil.copytree(sglang_target.site_packages / "sglang-0.5.23.dist-info", dist)
        meta = dist / "METADATA"
        meta.write_text(meta.read_text().replace("Version: 0.5.23", "Version: 0.5.22", 1))
        if os.geteuid() == 0:
            for p in [*created, dist, *dist.rglob("*")]:
                os.chown(p, sshd.uid, sshd.gid)
        with connect(ssh_host) as t, pytest.raises(DiscoveryError) as ei:
            discover(t, ssh_host)
        msg = ei.value.message
        assert "2 SGLang installs are visible" in msg
        assert f"sglang 0.5.22 at {user_site}" in msg
        assert f"sglang 0.5.23 at {sglang_target.site_packages}" in msg
        assert "--user" in ei.value.hint
    finally:
        cfg.write_text(original)
        shutil.rmtree(dist, ignore_errors=True)
        for p in reversed(created):
            shutil.rmtree(p, ignore_errors=True)


@pytest.mark.ssh
def test_from_a_hosts_yaml_to_discovery(sshd, sglang_target, tmp_path, monkeypatch):
    monkeypatch.setenv("TARGET_VENV", str(sglang_target.venv))
    inv_file = tmp_path / "hosts.yaml"
    inv_file.write_text(f"""
hosts:
  loopback:
    hostname: {sshd.host}
    port: {sshd.port}
    user: {sshd.user}
    identity_file: {sshd.identity_file}
    known_hosts: {sshd.known_hosts}
    python: ${{TARGET_VENV}}/bin/python
    tags: [test]
""")
    from sglang_patcher.inventory import load_inventory
    host = load_inventory(inv_file).get("loopback")
    with connect(host) as t:
        info = discover(t, host)
    assert (info.host, info.sglang_version, info.interpreter) == ("loopback", "0.5.23", str(sglang_target))


def test_package_shadowed_by_pythonpath_is_refused(local_host, local_target, tmp_path, monkeypatch):
    shadow = tmp_path / "checkout"
    (shadow / "sglang").mkdir(parents=True)
    (shadow / "sglang" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(shadow))        # the local transport passes it on
    with pytest.raises(DiscoveryError) as ei:
        discover(connect(local_host), local_host)
    assert f"resolves to {shadow / 'sglang'}" in ei.value.message
    assert "shadows" in ei.value.hint


def test_a_sglang_dir_in_the_working_directory_does_not_count(local_host, local_target, tmp_path,
                                                              monkeypatch):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    info = discover(connect(local_host), local_host)
    assert info.package_dir == str(local_target.package_dir)
