"""hosts.yaml: valid files load; every bad file gives ONE InventoryError naming file, line and fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sglang_patcher.errors import InventoryError
from sglang_patcher.inventory import Host, Inventory, load_inventory, parse_inventory

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "hosts.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_repo_hosts_yaml_loads(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLPATCH_HOME", str(tmp_path))
    inv = load_inventory(REPO / "hosts.yaml")
    ct = inv.get("ct200")
    assert ct.transport == "ssh" and ct.python == "/opt/venvs/sglang/bin/python"
    assert "gpu" in ct.tags
    sb = inv.get("sandbox")
    assert sb.transport == "local"
    assert sb.python == f"{tmp_path}/sandbox/venv/bin/python"


def test_sglpatch_home_in_the_inventory_is_the_state_dir(monkeypatch, tmp_path):
    """${SGLPATCH_HOME} expands as the state dir does: empty -> its default (it expanded to '' and
    the sandbox read /sandbox/venv/bin/python), relative -> the state dir's own error (it said
    'python must be an absolute path')."""
    from sglang_patcher.errors import ConfigError

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("SGLPATCH_HOME", "")
    assert load_inventory(REPO / "hosts.yaml").get("sandbox").python == \
        f"{tmp_path}/xdg/sglpatch/sandbox/venv/bin/python"
    monkeypatch.setenv("SGLPATCH_HOME", "rel/home")
    with pytest.raises(ConfigError, match="SGLPATCH_HOME must be an absolute path"):
        load_inventory(REPO / "hosts.yaml")


def test_full_ssh_host_and_env_expansion(tmp_path, monkeypatch):
    monkeypatch.setenv("VENVS", "/srv/venvs")
    monkeypatch.setenv("HOME", str(tmp_path))
    p = write(tmp_path, """
        hosts:
          gpu1:
            hostname: 10.0.0.5
            port: 2222
            user: ml
            identity_file: ~/.ssh/id_gpu
            known_hosts: ${HOME}/kh
            python: ${VENVS}/sglang/bin/python
            sudo: true
            tags: [gpu, a]
            state_dir: /var/lib/sglpatch
          alias1:
            ssh_alias: jumpy
            python: /usr/bin/python3
    """)
    inv = load_inventory(p)
    h = inv.get("gpu1")
    assert h == Host(name="gpu1", hostname="10.0.0.5", port=2222, user="ml",
                     identity_file=f"{tmp_path}/.ssh/id_gpu", known_hosts=f"{tmp_path}/kh",
                     python="/srv/venvs/sglang/bin/python", sudo=True, tags=["gpu", "a"],
                     state_dir="/var/lib/sglpatch")
    assert h.address == "ml@10.0.0.5:2222"
    assert inv.get("alias1").transport == "ssh"
    assert inv.names() == ["alias1", "gpu1"]
    assert [x.name for x in inv.with_tag("gpu")] == ["gpu1"]


def test_default_path_from_env(tmp_path, monkeypatch):
    p = write(tmp_path, "hosts:\n  l:\n    transport: local\n    python: /usr/bin/python3\n")
    monkeypatch.setenv("SGLPATCH_HOSTS", str(p))
    assert load_inventory().get("l").python == "/usr/bin/python3"
    monkeypatch.delenv("SGLPATCH_HOSTS")
    monkeypatch.chdir(tmp_path)
    assert load_inventory().path == "hosts.yaml"


def test_unknown_host_lists_known(tmp_path):
    inv = load_inventory(write(tmp_path, """
        hosts:
          b: {transport: local, python: /x/python}
          a: {transport: local, python: /y/python}
    """))
    with pytest.raises(InventoryError) as ei:
        inv.get("nope")
    msg = str(ei.value)
    assert "'nope'" in msg and "known hosts: a, b" in msg and str(tmp_path) in msg


def test_bad_yaml_names_file_and_line(tmp_path):
    p = write(tmp_path, """
        hosts:
          a:
            python: /usr/bin/python3
           bad: [unclosed
    """)
    with pytest.raises(InventoryError) as ei:
        load_inventory(p)
    msg = str(ei.value)
    assert str(p) in msg and "not valid YAML" in msg
    assert "line 5" in msg or "line 6" in msg
    assert ei.value.exit_code == 2


def test_missing_python_names_line_and_fix(tmp_path):
    p = write(tmp_path, """
        hosts:
          ok: {transport: local, python: /usr/bin/python3}
          gpu:
            hostname: h.example
            user: u
    """)
    with pytest.raises(InventoryError) as ei:
        load_inventory(p)
    e = ei.value
    assert str(p) in e.message and "line 4" in e.message and "hosts.gpu.python" in e.message
    assert "`python` is required" in e.message
    assert "absolute path" in e.hint and "python" in e.hint


def test_relative_python_names_its_line(tmp_path):
    p = write(tmp_path, """
        hosts:
          gpu:
            hostname: h.example

            python: venv/bin/python
    """)
    with pytest.raises(InventoryError) as ei:
        load_inventory(p)
    msg = str(ei.value)
    assert "line 6" in msg and "must be an absolute path" in msg and "'venv/bin/python'" in msg


def test_unknown_field_and_several_problems_in_one_error(tmp_path):
    p = write(tmp_path, """
        hosts:
          a:
            hostname: h
            pyhton: /usr/bin/python3
          b:
            transport: telnet
            python: /usr/bin/python3
    """)
    with pytest.raises(InventoryError) as ei:
        load_inventory(p)
    msg = str(ei.value)
    assert "problems" in msg
    assert "line 5: hosts.a.pyhton: unknown field `pyhton`" in msg
    assert "line 4: hosts.a.python: `python` is required" in msg or "hosts.a.python" in msg
    assert "line 7: hosts.b.transport" in msg


@pytest.mark.parametrize("text, line, said, hint", [
    ("host:\n  a: {hostname: h, python: /p}\n", 1, "unknown field `host` (did you mean `hosts`?)",
     "top level takes only `hosts:`"),
    ("hosts:\n  a:\n    hostnme: h\n    python: /p\n", 3, "hosts.a.hostnme: unknown field `hostnme` (did you mean `hostname`?)",
     "a host takes: transport"),
    ("path: /elsewhere\nhosts:\n  a: {hostname: h, python: /p}\n", 1, "unknown field `path`",
     "top level takes only `hosts:`"),
])
def test_a_misspelt_key_is_named_with_its_likely_meaning(text, line, said, hint):
    """A key the format lacks: the line, the closest known key, and what that level takes (the top
    level's `hosts:`, a host's fields); `path` is not a key (it is where the file was read from)."""
    with pytest.raises(InventoryError) as ei:
        parse_inventory(text, origin="x.yaml")
    assert f"line {line}: " in ei.value.message and said in ei.value.message, ei.value.message
    assert hint in ei.value.hint, ei.value.hint


def test_ssh_host_needs_a_target_and_local_takes_no_ssh_settings(tmp_path):
    with pytest.raises(InventoryError, match=r"line 3: hosts.a: .*ssh_alias"):
        parse_inventory("hosts:\n\n  a:\n    python: /p\n", origin="x.yaml")
    with pytest.raises(InventoryError, match=r"local host takes no SSH settings \(remove hostname, port\)"):
        parse_inventory("hosts:\n  a: {transport: local, hostname: h, port: 22, python: /p}\n")


def test_port_range_and_name_charset(tmp_path):
    with pytest.raises(InventoryError, match=r"hosts.a.port"):
        parse_inventory("hosts:\n  a: {hostname: h, port: 70000, python: /p}\n")
    with pytest.raises(InventoryError, match=r"host names may hold"):
        parse_inventory("hosts:\n  'a/b': {hostname: h, python: /p}\n")


def test_unset_variable_is_named(monkeypatch):
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    with pytest.raises(InventoryError) as ei:
        parse_inventory("hosts:\n  a:\n    transport: local\n    python: ${NOPE_NOT_SET}/bin/python\n",
                        origin="inv.yaml")
    assert "line 4" in ei.value.message and "${NOPE_NOT_SET} is not set" in ei.value.message
    # the hint is the variable's (the python: field's own hint told to write an absolute path)
    assert ei.value.hint.startswith("export NOPE_NOT_SET before running sglpatch"), ei.value.hint
    assert "absolute path of the host's interpreter" not in ei.value.hint


def test_missing_file_and_wrong_shape(tmp_path):
    with pytest.raises(InventoryError, match="cannot read the inventory"):
        load_inventory(tmp_path / "absent.yaml")
    with pytest.raises(InventoryError, match=r"expected a mapping"):
        parse_inventory("- a\n- b\n")
    with pytest.raises(InventoryError, match=r"expected a mapping"):
        parse_inventory("hosts: [a, b]\n")
    assert parse_inventory("").hosts == {}
    assert parse_inventory("hosts:\n").hosts == {}  # `hosts:` with nothing under it, as an empty file


def test_inventory_is_pydantic():
    inv = Inventory(hosts={"x": {"transport": "local", "python": "/p"}})
    assert inv.get("x").name == "x"


def test_duplicate_host_names_are_an_error_not_a_silent_override():
    text = "hosts:\n  a: {transport: local, python: /p}\n  b: {transport: local, python: /q}\n" \
           "  a: {transport: local, python: /r}\n"
    with pytest.raises(InventoryError) as ei:
        parse_inventory(text, origin="h.yaml")
    assert "h.yaml, line 4: `a` is defined twice (first on line 2)" in ei.value.message
    with pytest.raises(InventoryError, match="`python` is defined twice"):
        parse_inventory("hosts:\n  a:\n    python: /p\n    transport: local\n    python: /q\n")


@pytest.mark.parametrize("data", [
    b"hosts:\n  # caf\xe9 (Latin-1)\n  gpu:\n    hostname: h\n    python: /usr/bin/python3\n",
    b"\x00\xff\xfe binary \x80\x81",
])
def test_a_file_that_is_not_utf8_is_one_inventory_error_naming_file_and_line(tmp_path, data):
    p = tmp_path / "hosts.yaml"
    p.write_bytes(data)
    with pytest.raises(InventoryError) as ei:
        load_inventory(p)
    msg = str(ei.value)
    assert str(p) in msg and "not UTF-8" in msg and "line" in msg
    assert "UTF-8" in (ei.value.hint or "")


def test_a_missing_file_is_named_by_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InventoryError) as ei:
        load_inventory("hosts.yaml")
    assert str(tmp_path / "hosts.yaml") in str(ei.value) and "--hosts" in (ei.value.hint or "")


def test_one_broken_host_entry_leaves_the_others_usable_when_asked():
    """``skip_bad_hosts``: problems inside host entries leave those hosts out (each named with
    its problem, and ``get`` of one raises that problem) and the valid hosts load; problems of
    the file itself still refuse it; without the flag the whole file is refused as before."""
    text = textwrap.dedent("""\
        hosts:
          good:
            hostname: 10.0.0.1
            python: /usr/bin/python3
            tags: [gpu]
          typo:
            hostname: 10.0.0.2
            pyton: /usr/bin/python3
          relative:
            hostname: 10.0.0.3
            python: bin/python
          empty:
        """)
    inv = parse_inventory(text, origin="inv.yaml", skip_bad_hosts=True)
    assert inv.names() == ["good"] and inv.with_tag("gpu") == [inv.get("good")]
    assert set(inv.invalid) == {"typo", "relative", "empty"}
    problem, fix = inv.invalid["typo"]
    assert "line 8" in problem and "did you mean `python`" in problem and "absolute path" in fix
    with pytest.raises(InventoryError, match=r"inv.yaml: host 'relative' is invalid: line 11: .*absolute path"):
        inv.get("relative")
    with pytest.raises(InventoryError, match="unknown host 'nope'"):
        inv.get("nope")
    with pytest.raises(InventoryError, match="3 problems|4 problems"):
        parse_inventory(text, origin="inv.yaml")
    with pytest.raises(InventoryError, match="unknown field `hostz`"):  # the file's own top level
        parse_inventory(text + "hostz: {}\n", origin="inv.yaml", skip_bad_hosts=True)


def test_hints_name_the_inventory_file_in_use(tmp_path):
    """Issue 18: hints said `hosts.yaml` while another inventory file was in use."""
    from sglang_patcher.discovery import _interpreter_hint
    from sglang_patcher.inventory import Host, load_inventory
    from sglang_patcher.transport.ssh import SSHTransport

    inv_file = tmp_path / "lab-inventory.yaml"
    inv_file.write_text("hosts:\n  gpu1:\n    hostname: gpu1.example\n    python: /opt/py/bin/python\n")
    host = load_inventory(inv_file).get("gpu1")
    assert host.inventory_file == str(inv_file)
    assert str(inv_file) in _interpreter_hint(host) and "hosts.yaml" not in _interpreter_hint(host)
    assert SSHTransport(host)._inventory == str(inv_file)
    built = Host(name="x", hostname="h", python="/usr/bin/python3")   # made in code: no file
    assert "hosts.yaml" in built.inventory_file and "inventory file" in built.inventory_file


def test_a_host_without_a_serve_profile_is_told_where_to_add_one(tmp_path, monkeypatch, capsys):
    """A new user ran `bench --host sandbox` (no hosts.yaml): the hint said to add `serve:` to
    sandbox "in the inventory", which does not exist. The embedded sandbox is told to use a host
    of hosts.yaml; a host read from a file is told that file."""
    from sglang_patcher.cli import main
    from sglang_patcher.sandbox import sandbox_host

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SGLPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SGLPATCH_HOSTS", raising=False)
    assert "embedded sandbox" in sandbox_host(home=tmp_path).serve_hint()
    f = tmp_path / "hosts.yaml"
    f.write_text("hosts:\n  gpu: {hostname: gpu.invalid, python: /usr/bin/python3}\n")
    assert f"add `serve:` (model, draft_model) to gpu in {f}" in load_inventory(f).get("gpu").serve_hint()
    f.unlink()
    capsys.readouterr()
    assert main(["bench", "--host", "sandbox"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "the embedded sandbox is SGLang without a model" in err, err


def test_snapshot_takes_host_as_every_command_does_and_unknown_hosts_name_sandbox(tmp_path, capsys):
    """A new user typed `snapshot --host sandbox` (every other command takes --host) and got "No
    such option"; an unknown host's hint listed the inventory's hosts but not sandbox."""
    from sglang_patcher.cli import main

    f = tmp_path / "hosts.yaml"
    f.write_text("hosts:\n  gpu: {hostname: g.invalid, python: /usr/bin/python3}\n")
    capsys.readouterr()
    assert main(["--hosts", str(f), "snapshot", "--host", "nope"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "unknown host 'nope'" in err and "`--host sandbox` (the embedded default target) works too" in err, err
    assert main(["--hosts", str(f), "snapshot"]) == 2
    assert "name the host" in capsys.readouterr().err
    assert main(["--hosts", str(f), "snapshot", "gpu", "--host", "other"]) == 2
    assert "two hosts given" in capsys.readouterr().err


def test_a_list_cut_by_a_flow_mapping_gets_one_error_that_gives_it_back_in_brackets():
    """New-user pass: `bench: {concurrency: 1,4,16}` gave "Input should be a valid list" plus a
    "Keys should be strings" per later piece, with no hint. Now one error: the list in brackets."""
    with pytest.raises(InventoryError) as ei:
        parse_inventory("hosts:\n  a:\n    transport: local\n    python: /p\n"
                        "    serve: {model: /m, bench: {concurrency: 1,4,16}}\n", origin="inv.yaml")
    said = ei.value.message
    assert "problems" not in said and "Keys should be strings" not in said, said
    assert "line 5: hosts.a.serve.bench.concurrency: concurrency was cut at its first comma" in said, said
    assert "write the list in brackets: concurrency: [1, 4, 16]" in said and "[ ]" in ei.value.hint
    # beside another field's error: each keeps its own
    with pytest.raises(InventoryError) as ei:
        parse_inventory("hosts:\n  a:\n    transport: local\n    python: /p\n"
                        "    serve: {model: /m, bench: {requests: abc, concurrency: 1,4,16}}\n")
    said = ei.value.message
    assert "2 problems" in said and "concurrency: [1, 4, 16]" in said and "bench.requests: Input should be a valid integer" in said
    # brackets load
    inv = parse_inventory("hosts:\n  a:\n    transport: local\n    python: /p\n"
                          "    serve: {model: /m, bench: {concurrency: [1, 4, 16]}}\n")
    assert inv.get("a").serve.bench.concurrency == [1, 4, 16]


def test_an_unknown_field_inside_serve_is_matched_against_serves_own_fields():
    """`serve: {modle: /x}`: no "did you mean", and the hint listed a host's fields."""
    with pytest.raises(InventoryError) as ei:
        parse_inventory("hosts:\n  a:\n    transport: local\n    python: /p\n    serve: {modle: /x}\n")
    assert "unknown field `modle` (did you mean `model`?)" in ei.value.message, ei.value.message
    assert "`serve:` takes: model, draft_model" in ei.value.hint and "transport" not in ei.value.hint
    with pytest.raises(InventoryError) as ei:
        parse_inventory("hosts:\n  a:\n    transport: local\n    python: /p\n    serve: {model: /x, ddtree: {budgt: 3}}\n")
    assert "(did you mean `budget`?)" in ei.value.message and "`ddtree:` takes: budget, topk" in ei.value.hint
    with pytest.raises(InventoryError) as ei:   # a host's own field: the host's list, as before
        parse_inventory("hosts:\n  a:\n    transport: local\n    pyton: /p\n")
    assert "(did you mean `python`?)" in ei.value.message and "a host takes: " in ei.value.hint
