"""``sglpatch check`` levels 0-1 through the CLI on the local transport's real sglang 0.5.23 venv
(no server: levels 2-3 are tested live in tests/live/test_live_check.py)."""

from __future__ import annotations

import pytest

from tests.integration.test_cli import run_json, write_hosts

pytestmark = [pytest.mark.sglang]


def _hosts(tmp_path, local_target, **extra):
    from sglang_patcher.inventory import Host

    return ["--hosts", str(write_hosts(tmp_path / "hosts.yaml",
                                       Host(name="here", transport="local", python=str(local_target), **extra)))]


def test_check_without_a_deployment_or_profile(capsys, tmp_path, sglpatch_home, local_target):
    h = _hosts(tmp_path, local_target)
    # nothing deployed: nothing to check is a failed check (exit 9), never a pass (new user's run)
    code, data, err = run_json(capsys, *h, "check", "--host", "here")
    assert code == 9, err
    assert data["level"] == 1 and not data["passed"] and data["ok"] is False, data
    assert [(c["level"], c["status"]) for c in data["checks"]] == [("L0", "failed")]
    assert "no active sglpatch deployment" in data["checks"][0]["detail"]
    assert "apply a patchset first" in data["checks"][0]["detail"]
    # the one failure's reason is in the error's own line, not only in a table cell (new user)
    assert "failed: L0 a deployment to check — no active sglpatch deployment" in data["error"], data["error"]
    # ...except for a run that only came to stop leftover servers
    code, data, err = run_json(capsys, *h, "check", "--host", "here", "--stop-leftovers")
    assert code == 0 and [(c["level"], c["status"]) for c in data["checks"]] == [("L0", "skipped")], data
    assert any("server starts" in line for line in data["not_proven"]), data["not_proven"]
    code, data, err = run_json(capsys, *h, "check", "--host", "here", "--level", "2")
    assert code == 2 and "no serve profile" in data["error"] and "serve:" in data["hint"], data


def test_check_levels_0_and_1_of_the_deployed_revision(capsys, tmp_path, sglpatch_home, local_target):
    h = _hosts(tmp_path, local_target)
    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")
    # apply's gate lets skipped L1 checks pass (exit 0), but says that L1 proved nothing here
    assert code == 0 and data["status"] == "applied", err
    assert [w for w in data["warnings"] if w.startswith("every L1 smoke check was skipped on here (missing module")
            and "check --host here --level 1` fails" in w], data["warnings"]
    code, data, err = run_json(capsys, *h, "check", "--host", "here", "--level", "0")
    assert code == 0, err
    assert {c["level"] for c in data["checks"]} == {"L0"}
    assert all(c["status"] == "passed" for c in data["checks"]), data["checks"]
    # L1 skips every check on this venv (sglang without its deps): level 1 asked for and nothing
    # proven is a failed check (exit 9) naming why, never a pass (new user's finding)
    code, data, err = run_json(capsys, *h, "check", "--host", "here")
    assert code == 9 and data["level"] == 1 and not data["passed"], err
    l1 = [c for c in data["checks"] if c["level"] == "L1"]
    assert [c["status"] for c in l1[:-1]] and all(c["status"] == "skipped" for c in l1[:-1]), l1
    assert l1[-1]["status"] == "failed" and "every L1 check was skipped" in l1[-1]["detail"], l1[-1]
    assert "missing module" in l1[-1]["detail"] and "--level 0" in l1[-1]["detail"], l1[-1]
    assert data["error"].startswith("here: check --level 1: 1 check(s) failed: L1 smoke checks ran — every L1 "
                                    "check was skipped"), data["error"]
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes", "--gate", "check:1")[0] == 9


def test_a_gate_the_host_cannot_run_is_refused_before_any_write(capsys, tmp_path, sglpatch_home, local_target):
    h = _hosts(tmp_path, local_target)
    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes", "--gate", "check:3")
    assert code == 2 and "cannot run the gate check:3" in data["error"], data
    code, data, err = run_json(capsys, *h, "status", "--host", "here")
    assert data["overall"] == "pristine", data


@pytest.mark.parametrize(("gate", "shown"), [("check:2", "check:2"), ("bench:min-ratio=1.0", "bench:min-ratio=1")])
def test_a_gate_whose_server_cannot_start_rolls_the_deployment_back(capsys, tmp_path, sglpatch_home,
                                                                    local_target, gate, shown):
    """This venv has sglang without its dependencies: a server cannot start there, so each gate
    fails (the bench gate by an error, not a result) and the new deployment is rolled back."""
    (tmp_path / "model").mkdir()
    (tmp_path / "draft").mkdir()      # they exist (else the gate is refused before the push)
    serve = {"model": str(tmp_path / "model"), "draft_model": str(tmp_path / "draft"), "start_timeout": 60}
    h = _hosts(tmp_path, local_target, serve=serve)
    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes", "--gate", gate)
    assert code == 9, (data, err)
    assert f"gate {shown} failed" in data["error"] and "rolled back" in data["error"], data["error"]
    code, data, err = run_json(capsys, *h, "status", "--host", "here")
    assert data["overall"] == "pristine", data
    assert not list((local_target.site_packages / ".sglpatch" / "servers").glob("*.json"))


def test_check_serving_levels_need_a_deployment(capsys, tmp_path, sglpatch_home, local_target):
    h = _hosts(tmp_path, local_target, serve={"model": "/m", "draft_model": "/d"})
    code, data, err = run_json(capsys, *h, "check", "--host", "here")
    assert code == 9, err
    (l2,) = [c for c in data["checks"] if c["level"] == "L2"]
    assert l2["status"] == "failed" and "nothing is deployed" in l2["detail"], l2


def test_a_model_path_missing_on_the_host_is_the_first_line_of_the_error_before_any_server(
        capsys, tmp_path, sglpatch_home, local_target):
    """A wrong model path in the serve profile: the server's traceback came back folded into the
    check table's detail column under "1 check(s) failed". Now check, bench and a gate first look
    at the profile's paths on the host: exit 2, the first line names the host, the key and the
    path (and what the nearest directory holds), the hint says what to fix where; no server is
    started, and a gate refuses before the push."""
    from tests.integration.test_cli import run_cli

    models = tmp_path / "models"
    (models / "Qwen3-8B").mkdir(parents=True)
    missing = models / "Qwen3-8B-typo"
    h = _hosts(tmp_path, local_target, serve={"model": str(missing), "draft_model": str(models / "Qwen3-8B"),
                                              "start_timeout": 60})
    servers = local_target.site_packages / ".sglpatch" / "servers"
    code, data, err = run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes", "--gate", "check:2")
    assert code == 2 and data["error"].startswith(f"here: serve.model {missing} does not exist on here"), data
    assert run_json(capsys, *h, "status", "--host", "here")[1]["overall"] == "pristine"   # nothing pushed
    assert run_json(capsys, *h, "apply", "ddtree", "--host", "here", "--yes")[0] == 0
    code, out, err = run_cli(capsys, *h, "check", "--host", "here", "--level", "2")
    first = err.strip().splitlines()[0]
    assert code == 2 and first.startswith(f"error: here: serve.model {missing} does not exist on here"), err
    said = " ".join(err.split())
    assert f"{models} holds Qwen3-8B (named like Qwen3-8B-typo)" in said, said
    assert "fix serve.model of host here in" in said and str(tmp_path / "hosts.yaml") in said, said
    assert not servers.exists() or not any(servers.iterdir()), "a server was started"
    code, data, _ = run_json(capsys, *h, "bench", "--host", "here")
    assert code == 2 and data["error"].startswith(f"here: serve.model {missing} does not exist"), data
    # a missing subtree under a busy unrelated directory: that directory's listing is not shown
    for junk in ("a.log", "b.sock", "cache"):
        (tmp_path / junk).touch()
    h = _hosts(tmp_path, local_target, serve={"model": str(tmp_path / "weights" / "Qwen3-8B")})
    code, data, _ = run_json(capsys, *h, "check", "--host", "here", "--level", "2")
    assert code == 2 and data["error"].endswith(f"the nearest directory there, {tmp_path}, has no weights"), data
    assert "a.log" not in data["error"], data
    # the models' own folder without a near name: its listing is the help
    h = _hosts(tmp_path, local_target, serve={"model": str(models / "Llama-3")})
    code, data, _ = run_json(capsys, *h, "check", "--host", "here", "--level", "2")
    assert code == 2 and data["error"].endswith(f"the nearest directory there, {models}, holds: Qwen3-8B"), data
    # the draft model is checked too, and a Hugging Face id is left to SGLang
    h = _hosts(tmp_path, local_target, serve={"model": str(models / "Qwen3-8B"), "draft_model": "~/no-such-draft"})
    code, data, _ = run_json(capsys, *h, "check", "--host", "here", "--level", "3")
    assert code == 2 and data["error"].startswith("here: serve.draft_model ~/no-such-draft does not exist"), data
    assert "DFlash draft model's directory" in data["hint"], data
    h = _hosts(tmp_path, local_target, serve={"model": "Qwen/Qwen3-8B", "start_timeout": 5})
    code, data, _ = run_json(capsys, *h, "bench", "--host", "here", "--arms", "none", "--concurrency", "1",
                             "--requests", "1")
    assert code == 9 and "serve.model" not in data["error"], data     # SGLang's to resolve: its server ran


STAND_IN_SERVER = r"""
import http.server, sys, time
port = int(sys.argv[1])
print("\x1b[32m[2026-12-02 10:00:00 TP0] INFO\x1b[0m Load weight begin. avail mem=" + "7.5 GB " * 30
      + "[/dim] [rank0]: the end of a long line", flush=True)
time.sleep(4)                  # sglpatch polls every ~2 s: each stage is seen
for pct in (10, 50, 100):      # a progress bar rewritten in place, as tqdm draws it
    sys.stdout.write("\rLoading safetensors checkpoint shards: %3d%% Completed | %d/10" % (pct, pct // 10))
    sys.stdout.flush()
    time.sleep(2.5)
print("\n\x1b[1m\x1b[33mThe server is fired up and ready to roll!\x1b[0m", flush=True)
time.sleep(3)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_a_loading_servers_lines_are_shown_whole_and_without_escape_codes_stand_in_server(tmp_path, local_host):
    """While check/bench wait for a server, its newest log line was shown cut to its last 100
    characters and with the terminal escape codes SGLang colours its logs with (and a line holding
    "[/dim]" broke the console's markup). A real process in SGLang's place (a stand-in: the venv
    here cannot run SGLang's server) writes a coloured 260-character line and a tqdm bar rewritten
    with \\r, then answers /health: each line is said whole, without escapes, the bar as its last
    state, and a console 80 columns wide wraps them instead of cropping."""
    import io
    import re
    import socket

    from rich.console import Console

    from sglang_patcher.discovery import discover
    from sglang_patcher.serve.profile import ServeProfile
    from sglang_patcher.serve.server import RemoteServer
    from sglang_patcher.transport import connect

    script = tmp_path / "stand_in_server.py"
    script.write_text(STAND_IN_SERVER)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    said: list = []
    with connect(local_host) as t:
        info = discover(t, local_host)
        profile = ServeProfile(model="/m", port=port, start_timeout=60)
        with RemoteServer(t, local_host, info, profile, "stand-in", lambda p: [local_host.python, str(script), str(p)],
                          said.append) as server:
            server.wait_ready()
    text = [str(x) for x in said]
    assert not any("\x1b" in x for x in text), text
    long = next(x for x in text if "Load weight begin" in x)
    assert long.endswith("[2026-12-02 10:00:00 TP0] INFO Load weight begin. avail mem=" + "7.5 GB " * 30
                         + "[/dim] [rank0]: the end of a long line"), long
    bars = [x.split(") ", 1)[1] for x in text if "Loading safetensors" in x]
    assert bars and all(re.fullmatch(r"Loading safetensors checkpoint shards: +\d+% Completed \| \d+/10", b)
                        for b in bars), bars        # one state of the bar each time, not its states run together
    assert any(x.endswith(") The server is fired up and ready to roll!") for x in text), text
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    for x in said:
        console.print(x)
    shown = out.getvalue()
    assert max(len(line) for line in shown.splitlines()) <= 80
    assert "[/dim] [rank0]: the end of a long line" in " ".join(shown.split()), shown    # wrapped, not cut


def test_a_schedule_the_deployed_revision_cannot_serve_is_refused_before_any_server(capsys, tmp_path,
                                                                                    sglpatch_home, local_target):
    """A profile asking for ``budget_schedule: auto`` on a host that carries ddtree r6 (no planner):
    ``check`` and ``bench`` say so as one configuration error (exit 2) before any server starts, a
    gate of an apply of r6 before anything is pushed; and a profile that keeps CUDA graphs is
    refused for r8 too (several verify widths; revision 9 verifies the other widths eagerly)."""
    models = tmp_path / "models"
    (models / "m").mkdir(parents=True)
    serve = {"model": str(models / "m"), "draft_model": str(models / "m"), "args": ["--disable-cuda-graph"],
             "ddtree": {"budget": 16, "budget_schedule": "auto"}, "start_timeout": 60}
    h = _hosts(tmp_path, local_target, serve=serve)
    servers = local_target.site_packages / ".sglpatch" / "servers"
    code, data, err = run_json(capsys, *h, "apply", "ddtree@6", "--host", "here", "--yes", "--gate", "check:2")
    assert code == 2 and "carries ddtree r6, which has no auto budget planner" in data["error"], data
    assert str(tmp_path / "hosts.yaml") in data["hint"], data
    assert run_json(capsys, *h, "status", "--host", "here")[1]["overall"] == "pristine"   # nothing pushed
    assert run_json(capsys, *h, "apply", "ddtree@6", "--host", "here", "--yes")[0] == 0
    code, data, err = run_json(capsys, *h, "check", "--host", "here", "--level", "2")
    assert code == 2 and "carries ddtree r6, which has no auto budget planner" in data["error"], data
    code, data, err = run_json(capsys, *h, "bench", "--host", "here", "--budgets", "16,auto")
    assert code == 2 and "carries ddtree r6, which has no auto budget planner" in data["error"], data
    assert not servers.exists() or not any(servers.iterdir()), "a server was started"
    # CUDA graphs kept: refused for r8 too, before the push
    graphs = dict(serve, args=[])
    h2 = _hosts(tmp_path, local_target, serve=graphs)
    code, data, err = run_json(capsys, *h2, "apply", "ddtree@8", "--host", "here", "--yes", "--gate", "check:2")
    assert code == 2 and "verifies at several widths" in data["error"] and "--disable-cuda-graph" in data["hint"], data
    assert run_json(capsys, *h2, "status", "--host", "here")[1]["overall"] != "pristine"   # r6 still there
