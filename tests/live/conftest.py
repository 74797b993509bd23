"""Fixtures of the live tests: a real SGLang 0.5.23 server stack on the CPU, patched by sglpatch.

Every test under ``tests/live/`` carries the ``live`` marker (``pytest -m live`` runs exactly
them). Expensive parts are session-scoped and cached across runs:

- ``live_pristine``: the cached pristine CPU server venv (``tests/support/live_env.py``).
- ``live_models``: the tiny model fixtures (``tests/live/tiny_models.py``), built once per
  version of that script under the test cache.
- ``ddtree_venv``: a working copy of the pristine venv that ``sglpatch apply ddtree`` patched
  through the real deploy path (local transport, its own ``SGLPATCH_HOME``); ``status --expect
  patched`` must hold before any test uses it.
- ``pristine_live_venv``: an unpatched working copy (the target alone, DFLASH unpatched).

Live tests need minutes of CPU; they fail (not skip) under ``$CI`` when the environment is missing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import live_env, venvs
from tests.support.live_env import LiveVenv
from tests.support.live_sglang import EngineRun, LiveRecord, ModelFixture, run_engines
from tests.support.live_ssh import SshHost, cpu_serve_profile, port_range, ssh_venv

LIVE_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(LIVE_DIR):
            item.add_marker(pytest.mark.live)
            item.add_marker(pytest.mark.slow)


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def live_pristine() -> Path:
    try:
        return live_env.pristine_live_venv()
    except RuntimeError as exc:
        _skip_or_fail(f"cannot build the live CPU SGLang venv: {exc}")
        raise


@pytest.fixture(scope="session")
def ddtree_venv(live_pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> LiveVenv:
    """The live venv patched with the current ``ddtree`` revision by ``sglpatch apply``."""
    where = tmp_path_factory.mktemp("live-ddtree")
    copy = live_env.patched_copy(live_pristine, where)
    yield copy
    venvs.remove_venv(copy.venv, background=True)


@pytest.fixture(scope="session")
def pristine_live(live_pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> LiveVenv:
    """An unpatched working copy of the live venv (SGLang 0.5.23 as released)."""
    venv = venvs.clone_venv(live_pristine, tmp_path_factory.mktemp("live-pristine") / "venv",
                            share_deps=True)
    yield LiveVenv(str(venv), venv.venv)
    venvs.remove_venv(venv.venv, background=True)


@pytest.fixture(scope="session")
def live_models() -> dict[str, ModelFixture]:
    """{fixture name: ModelFixture}, built once per version of tests/live/tiny_models.py
    (``$SGLPATCH_LIVE_MODELS``: a directory of fixtures built already, used as it is)."""
    given = os.environ.get("SGLPATCH_LIVE_MODELS")
    if given:
        return {d.name: ModelFixture.load(d) for d in sorted(Path(given).iterdir())
                if (d / "fixture.json").exists()}
    from tests.live import tiny_models

    digest = live_env.file_digest(Path(tiny_models.__file__))
    out = venvs.cache_root() / "live-models" / digest
    done = out / ".complete"
    if not done.exists():
        with venvs.locked(venvs.cache_root() / ".live-models.lock"):
            if not done.exists():
                tiny_models.build_fixtures(out)
                for path in [out, *out.rglob("*")]:      # the SSH test user reads them too
                    path.chmod(path.stat().st_mode | (0o755 if path.is_dir() else 0o644))
                done.write_text(digest + "\n")
    return {d.name: ModelFixture.load(d) for d in sorted(out.iterdir()) if (d / "fixture.json").exists()}


_RECORD = LiveRecord()


@pytest.fixture(scope="session")
def live_record() -> LiveRecord:
    return _RECORD


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _RECORD.rows:
        return
    terminalreporter.section("live SGLang runs: SGLang's accept lengths (tokens per verify)")
    for line in _RECORD.table():
        terminalreporter.write_line(line)
    path = os.environ.get("SGLPATCH_LIVE_RECORD")
    if path:
        Path(path).write_text(json.dumps(_RECORD.rows, indent=1))
        terminalreporter.write_line(f"(written to {path})")


@pytest.fixture(scope="session")
def greedy_runs(ddtree_venv: LiveVenv, live_models: dict[str, ModelFixture],
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, EngineRun]]:
    """{fixture: {arm: EngineRun}}: every arm of ``tests/live/matrix.py`` on ``ddtree_venv``,
    one driver process per fixture (run once per session)."""
    from tests.live import matrix

    out: dict[str, dict[str, EngineRun]] = {}
    for name, arms in matrix.ARMS.items():
        fx = live_models[name]
        specs = [matrix.engine_spec(fx, a) for a in arms if a.algorithm is None or a.block in fx.drafts]
        out[name] = run_engines(ddtree_venv.python, specs, tmp_path_factory.mktemp(f"greedy-{name}"))
        _RECORD.add_runs(name, out[name])
    return out


@pytest.fixture(scope="session")
def patched_ssh_host(sshd, live_pristine, live_models, tmp_path_factory) -> SshHost:
    """An SSH host (the real loopback sshd) whose live venv carries ddtree, applied over SSH by
    the CLI; shared by the check and bench tests."""
    venv = ssh_venv(sshd, live_pristine, tmp_path_factory, "live-check")
    h = SshHost(sshd, venv, tmp_path_factory.mktemp("live-check"), "live-ssh")
    h.write(cpu_serve_profile(live_models["trained"], port_range()))
    applied = h.run("apply", "ddtree", "--host", h.name, "--yes", "--json")
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    yield h
    h.kill_all()
    venvs.remove_venv(venv.venv, background=True)


@pytest.fixture
def host(patched_ssh_host: SshHost, live_models) -> SshHost:
    """``patched_ssh_host`` with the trained fixture's serve profile; no server of sglpatch may
    still run after the test."""
    patched_ssh_host.write(cpu_serve_profile(live_models["trained"], port_range()))
    yield patched_ssh_host
    left = patched_ssh_host.running()
    patched_ssh_host.kill_all()
    assert not left, f"sglpatch left servers running on the host: {left}"
