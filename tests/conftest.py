"""Shared fixtures: a real sshd on loopback, real SGLang 0.5.23 venvs, an isolated SGLPATCH_HOME.

Nothing here is a mock. Expensive parts are session-scoped and cached across runs:

- ``sshd``: OpenSSH ``/usr/sbin/sshd`` on 127.0.0.1 (ephemeral port, generated host and client keys,
  its own known_hosts). As root the login user is the dedicated non-root ``sglpatch-test`` (created
  with useradd); otherwise the current user. Skipped when sshd is absent, unless ``$CI`` is set
  (then it fails: CI must install openssh-server).
- ``sglang_target``: a venv owned by the SSH user with ``pip install --no-deps sglang==0.5.23``
  (Debian's /usr/bin/python3, cached under /var/tmp/sglpatch-tests/), reset to pristine before each
  test. A :class:`tests.support.venvs.TargetVenv`: a ``str`` (the interpreter path) with ``.venv``,
  ``.site_packages``, ``.package_dir``.
- ``sglang_target_l1``: the same plus ``sglang_patcher/data/sglang-0.5.23-cpu-requirements.txt`` (CPU torch via PIP_FIND_LINKS);
  skipped while that file does not exist (fails under CI).
- ``local_target``: the same venv for the local transport, owned by the current user.
- ``ssh_host`` / ``local_host``: inventory Hosts for those targets.
- ``sglpatch_home``: ``$SGLPATCH_HOME`` pointed at a fresh tmp dir.
- ``ssh_user_sudo``: for one test, the SSH user may run ``sudo -n`` (root runs only, sudo installed;
  else skipped): a sudoers.d drop-in, removed afterwards. For root-owned installs (``sudo: true``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support import venvs
from tests.support.sshd import SshServer, sshd_available, start_sshd

REPO = Path(__file__).resolve().parent.parent
L1_REQUIREMENTS = REPO / "sglang_patcher" / "data" / "sglang-0.5.23-cpu-requirements.txt"


# pytest-xdist (scripts/test.sh: --dist loadgroup --no-loadscope-reorder): each test file runs on one
# worker, as a unit; the files that share an expensive session fixture run together on one worker
# (else each worker would build it again: the live greedy matrix is ~15 min of CPU), and the longest
# units start first so that the short ones fill the other workers around them.
_SHARED_SESSION_GROUPS = {"greedy_runs": "live-greedy", "patched_ssh_host": "live-ssh-host"}
_FIRST = ("live-greedy", "live-ssh-host", "tests/live/", "tests/integration/")


def _xdist_group(item: pytest.Item) -> str:
    names = getattr(item, "fixturenames", ())
    # sudo rights are machine-wide (/etc/sudoers.d) and every worker's sshd logs in the same user:
    # a test that grants them and one that needs them absent must not run at the same time
    if "ssh_user_sudo" in names or item.get_closest_marker("no_sudo") is not None:
        return "sudoers"
    for fixture, group in _SHARED_SESSION_GROUPS.items():
        if fixture in names:
            return group
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its xdist group (see above) and order the groups, longest first."""
    groups = {item.nodeid: _xdist_group(item) for item in items}

    def rank(item: pytest.Item) -> int:
        g = groups[item.nodeid]
        return next((i for i, first in enumerate(_FIRST) if g.startswith(first)), len(_FIRST))

    items.sort(key=rank)      # stable: the order within a rank is pytest's
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))


def _in_ci() -> bool:
    return bool(os.environ.get("CI"))


def _skip_or_fail(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)")
    pytest.skip(reason)


def _pristine(name: str, extra: list[str] | None = None) -> Path:
    try:
        return venvs.pristine_venv(name, extra)
    except RuntimeError as exc:   # no network and no pip cache, or no python3-venv
        _skip_or_fail(f"cannot build the {name} target venv: {exc}")
        raise


@pytest.fixture(scope="session")
def sshd() -> SshServer:
    """A running sshd (see the module doc); stopped at the end of the session."""
    if not sshd_available():
        _skip_or_fail("OpenSSH sshd (/usr/sbin/sshd) or ssh-keygen is not installed "
                      "(apt-get install openssh-server)")
    workdir = Path(tempfile.mkdtemp(prefix="sglpatch-sshd-"))
    server = start_sshd(workdir)
    yield server
    server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _clone_dir(parent: Path, prefix: str) -> Path:
    venvs.remove_stale_clones(parent, prefix)
    return parent / f"{prefix}-{os.getpid()}"


def _ssh_clone(sshd: SshServer, tmp_path_factory, name: str) -> Path:
    """Where a working copy for the SSH target user goes (under its home, owned by it, when root)."""
    parent = sshd.home / "venvs" if os.geteuid() == 0 else tmp_path_factory.mktemp(f"ssh-{name}")
    if os.geteuid() == 0:
        parent.mkdir(parents=True, exist_ok=True)
        os.chown(parent, sshd.uid, sshd.gid)
    return _clone_dir(parent, f"{name}-{venvs.SGLANG_VERSION}")


@pytest.fixture(scope="session")
def _sglang_ssh_venv(sshd: SshServer, tmp_path_factory) -> venvs.TargetVenv:
    pristine = _pristine("sglang")
    dest = _ssh_clone(sshd, tmp_path_factory, "sglang")
    target = venvs.clone_venv(pristine, dest, sshd.uid, sshd.gid)
    yield target
    venvs.remove_venv(dest, background=True)


@pytest.fixture
def sglang_target(_sglang_ssh_venv: venvs.TargetVenv) -> venvs.TargetVenv:
    """The SSH user's sglang 0.5.23 venv, pristine at the start of the test."""
    _sglang_ssh_venv.reset()
    return _sglang_ssh_venv


@pytest.fixture(scope="session")
def l1_pristine() -> Path:
    """The cached pristine L1 venv: sglang 0.5.23 plus its CPU dependency set (built once)."""
    reqs = venvs.read_requirements(L1_REQUIREMENTS)
    if not reqs:
        _skip_or_fail(f"{L1_REQUIREMENTS} is missing or empty: no L1 target venv")
    if "PIP_FIND_LINKS" not in os.environ and Path("/opt/wheels").is_dir():
        os.environ["PIP_FIND_LINKS"] = "/opt/wheels"   # where the CPU torch wheel lies
    return _pristine("sglang-l1", reqs)


@pytest.fixture(scope="session")
def _sglang_ssh_venv_l1(sshd: SshServer, tmp_path_factory, l1_pristine: Path) -> venvs.TargetVenv:
    dest = _ssh_clone(sshd, tmp_path_factory, "sglang-l1")
    target = venvs.clone_venv(l1_pristine, dest, sshd.uid, sshd.gid, share_deps=True)
    yield target
    venvs.remove_venv(dest, background=True)


@pytest.fixture
def sglang_target_l1(_sglang_ssh_venv_l1: venvs.TargetVenv) -> venvs.TargetVenv:
    """Like ``sglang_target`` plus sglang_patcher/data/sglang-0.5.23-cpu-requirements.txt (CPU torch, light deps)."""
    _sglang_ssh_venv_l1.reset()
    return _sglang_ssh_venv_l1


@pytest.fixture(scope="session")
def _sglang_local_venv(tmp_path_factory) -> venvs.TargetVenv:
    pristine = _pristine("sglang")
    dest = tmp_path_factory.mktemp("local-target") / f"sglang-{venvs.SGLANG_VERSION}"
    target = venvs.clone_venv(pristine, dest)
    yield target
    venvs.remove_venv(dest, background=True)


@pytest.fixture
def local_target(_sglang_local_venv: venvs.TargetVenv) -> venvs.TargetVenv:
    """A sglang 0.5.23 venv owned by the current user (local transport), pristine per test."""
    _sglang_local_venv.reset()
    return _sglang_local_venv


@pytest.fixture
def ssh_host(sshd: SshServer, sglang_target):
    """Inventory Host ``sshd-test`` reaching ``sglang_target`` through ``sshd``."""
    return sshd.host_entry(sglang_target)


@pytest.fixture
def local_host(local_target):
    """Inventory Host ``local-test`` (transport local) for ``local_target``."""
    from sglang_patcher.inventory import Host
    return Host(name="local-test", transport="local", python=str(local_target))


@pytest.fixture
def sglpatch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$SGLPATCH_HOME`` set to a fresh directory for this test; returned."""
    home = tmp_path / "sglpatch-home"
    home.mkdir()
    monkeypatch.setenv("SGLPATCH_HOME", str(home))
    return home


@pytest.fixture
def ssh_user_sudo(sshd: SshServer):
    """Let the SSH user run ``sudo -n`` for the duration of one test (see the module doc)."""
    if os.geteuid() != 0 or shutil.which("sudo") is None or shutil.which("visudo") is None:
        pytest.skip("needs root and sudo to grant the SSH test user passwordless sudo")
    drop_in = Path("/etc/sudoers.d") / f"sglpatch-test-{os.getpid()}"   # no '.': sudo skips those
    tmp = drop_in.with_name(f".sglpatch-test-{os.getpid()}.tmp")
    tmp.write_text(f"{sshd.user} ALL=(root) NOPASSWD: ALL\n")
    os.chmod(tmp, 0o440)
    subprocess.run(["visudo", "-cf", str(tmp)], check=True, capture_output=True)
    os.replace(tmp, drop_in)
    try:
        yield sshd.user
    finally:
        drop_in.unlink(missing_ok=True)
