"""The serve profile of hosts.yaml, the gates of ``apply --gate`` and the prompts file of ``check``:
validation and clear errors (no host, no server)."""

from __future__ import annotations

import pytest

from sglang_patcher.errors import ConfigError, InventoryError
from sglang_patcher.inventory import Host, load_inventory
from sglang_patcher.serve.check import BUILTIN_PROMPTS, compare_arms, first_difference, load_prompts, ArmOutput
from sglang_patcher.serve.gate import Gate
from sglang_patcher.serve.profile import ServeProfile
from sglang_patcher.serve.server import launch_argv


def host(**serve) -> Host:
    return Host(name="gpu", transport="local", python="/opt/venv/bin/python", serve=serve or None)


def test_profile_defaults_and_port_range():
    p = ServeProfile(model="/m", draft_model="/d", port="30000-30002", args=["--mem-fraction-static", 0.8],
                     env={"A": 1}, devices="0,1")
    assert list(p.ports) == [30000, 30001, 30002]
    assert p.args == ["--mem-fraction-static", "0.8"] and p.environment() == {"A": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert p.max_level() == 3 and ServeProfile(model="/m").max_level() == 2
    assert ServeProfile(model="/m", port=31000).ports == range(31000, 31001)


@pytest.mark.parametrize("bad", [{"port": "0"}, {"port": "9-7"}, {"port": "abc"},
                                 {"args": ["--port", "1"]}, {"args": ["--model-path=/x"]},
                                 {"start_timeout": 0}, {"bench": {"concurrency": [0]}}, {"unknown": 1}])
def test_profile_refuses(bad):
    with pytest.raises(ValueError):
        ServeProfile(model="/m", **bad)


def test_inventory_names_the_line_of_a_bad_profile(tmp_path):
    f = tmp_path / "hosts.yaml"
    f.write_text("hosts:\n  gpu:\n    transport: local\n    python: /usr/bin/python3\n"
                 "    serve:\n      model: /m\n      port: 99999\n")
    with pytest.raises(InventoryError) as e:
        load_inventory(f)
    assert "port" in str(e.value) and str(f) in str(e.value)


def test_launch_argv_per_algorithm():
    h = host(model="/m", draft_model="/d", args=["--tp", "2"], ddtree={"budget": 16, "topk": 4})
    base = launch_argv(h, h.serve, "none", 30001)
    assert base[:3] == ["/opt/venv/bin/python", "-m", "sglang.launch_server"]
    assert "--speculative-algorithm" not in base and base[-2:] == ["--tp", "2"]
    dd = launch_argv(h, h.serve, "DDTREE", 30001)
    assert dd[dd.index("--speculative-algorithm") + 1] == "DDTREE"
    assert dd[-4:] == ["--speculative-ddtree-budget", "16", "--speculative-ddtree-topk", "4"]
    assert "--speculative-ddtree-budget" not in launch_argv(h, h.serve, "DFLASH", 30001)
    with pytest.raises(ConfigError, match="draft_model"):
        launch_argv(host(model="/m"), host(model="/m").serve, "DDTREE", 1)


@pytest.mark.parametrize("text,want", [("check", Gate("check")), ("check:2", Gate("check", level=2)),
                                       ("bench", Gate("bench")), ("bench:min-ratio=1.2", Gate("bench", min_ratio=1.2))])
def test_gate_parse(text, want):
    assert Gate.parse(text) == want and Gate.parse(str(want)) == want


@pytest.mark.parametrize("text", ["check:4", "bench:ratio=1", "lint", "check:"])
def test_gate_refused_with_the_forms(text):
    with pytest.raises(ConfigError, match="check:N"):
        Gate.parse(text)


def test_prompts_file_forms(tmp_path):
    assert load_prompts(None) == list(BUILTIN_PROMPTS)
    (tmp_path / "p.txt").write_text("one\n\n two \n")
    assert load_prompts(tmp_path / "p.txt") == ["one", " two "]
    (tmp_path / "p.json").write_text('["a", "b"]')
    assert load_prompts(tmp_path / "p.json") == ["a", "b"]
    for text in ('["a", 1]', "[", "\n\n"):
        (tmp_path / "bad").write_text(text)
        with pytest.raises(ConfigError, match="bad"):
            load_prompts(tmp_path / "bad")
    with pytest.raises(ConfigError, match="cannot read"):
        load_prompts(tmp_path / "missing.txt")


def test_token_comparison_names_the_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    base = ArmOutput("none", [[1, 2, 3]], [[1, 2, 3]])
    same = ArmOutput("DDTREE", [[1, 2, 3]], [[1, 2, 3]])
    off = ArmOutput("DDTREE", [[1, 2, 3]], [[1, 5, 3]])
    assert compare_arms(base, same, ["p"]) == []
    (line,) = compare_arms(base, off, ["p"])
    assert "concurrent" in line and "token 1" in line


def test_budget_schedule_takes_numbers_and_chain():
    p = ServeProfile(model="/m", ddtree={"budget": 32, "budget_schedule": "1:32, 16:Chain"})
    assert p.ddtree.budget_schedule == "1:32,16:chain"
    auto = ServeProfile(model="/m", ddtree={"budget": 32, "budget_schedule": " Auto"})
    assert auto.ddtree.budget_schedule == "auto"
    assert auto.ddtree.flags()[-2:] == ["--speculative-ddtree-budget-schedule", "auto"]
    for bad in ("1:0", "1:tree", "x:4", "1:4;2:8"):
        with pytest.raises(ValueError, match="BATCH:BUDGET"):
            ServeProfile(model="/m", ddtree={"budget_schedule": bad})
