"""The figures of ``sglpatch bench`` from per-request results, its history and --compare (no host;
the runs themselves are tested live in tests/live/test_live_bench.py)."""

from __future__ import annotations

import json

import pytest

from sglang_patcher.serve.bench import Arm, BenchRun, Row, last_comparable, load_history, requests_for, store, summarize


def result(tokens: int, latency: float, ttft: float, accept: float | None = None) -> dict:
    meta = {"completion_tokens": tokens}
    if accept is not None:
        meta["spec_accept_length"] = accept
    return {"output_tokens": tokens, "latency_s": latency, "ttft_s": ttft, "meta_info": meta}


def test_summarize_medians_and_throughput():
    arm = Arm("DDTREE", 8)
    rows = [result(11, 2.0, 1.0, 2.0), result(11, 3.0, 1.0, 3.0), result(11, 4.0, 2.0, 4.0), {"error": "boom"}]
    r = summarize(arm, 4, rows, wall_s=5.0)
    assert r.arm == "DDTREE n8" and r.requests == 4 and r.failed == 1
    assert r.output_tokens == 33 and r.tok_s == pytest.approx(6.6)
    assert r.tpot_ms == pytest.approx(200.0)      # (3-1)/10, (2-1)/10, (4-2)/10 s -> median 0.2 s
    assert r.ttft_ms == pytest.approx(1000.0) and r.accept_length == 3.0
    assert summarize(Arm("none"), 1, [result(5, 1, 0.5)], 1.0).accept_length is None


def test_requests_cycle_prompts_with_fixed_length():
    reqs = requests_for(["a", "b"], 5, 7)
    assert [r["text"] for r in reqs] == ["a", "b", "a", "b", "a"]
    assert all(r["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 7, "ignore_eos": True} for r in reqs)


def run(host="h", model="/m", tok=10.0, started="t1") -> BenchRun:
    b = BenchRun(host, "0.5.23", "ddtree", 3, model, "/d", ["--x"], 4, 64, 1, started)
    b.rows = [Row("DFLASH", "DFLASH", None, 1, 8, 512, tok, 10.0, 100.0, 2.0),
              Row("DDTREE n8", "DDTREE", 8, 1, 8, 512, tok * 1.5, 7.0, 110.0, 3.0)]
    return b


def test_history_and_last_comparable(tmp_path):
    assert load_history(tmp_path) == [] and last_comparable(run(), tmp_path) is None
    store(run(tok=10.0, started="t1"), tmp_path)
    store(run(model="/other", started="t2"), tmp_path)
    store(run(tok=12.0, started="t3"), tmp_path)
    (tmp_path / "bench" / "history.jsonl").open("a").write("not json\n[1]\n")
    assert len(load_history(tmp_path)) == 3
    prev = last_comparable(run(), tmp_path)
    assert prev["started"] == "t3" and prev["rows"][0]["tok_s"] == 12.0
    assert last_comparable(run(host="other"), tmp_path) is None
    doc = json.loads((tmp_path / "bench" / "history.jsonl").read_text().splitlines()[0])
    assert doc["host"] == "h" and doc["sglang_version"] == "0.5.23" and doc["patchset"] == "ddtree"


def test_ratio_and_rendering_show_the_comparison(tmp_path):
    from rich.console import Console

    b = run(tok=10.0)
    assert b.ratio("DDTREE n8", "DFLASH", 1) == pytest.approx(1.5) and b.ratio("DDTREE n8", "DFLASH", 4) is None
    b.previous = run(tok=8.0, started="earlier").to_json()
    b.history = str(tmp_path / "h.jsonl")
    console = Console(width=120, record=True)
    console.print(b)
    text = console.export_text()
    assert "1.50x" in text and "(+25%)" in text and "earlier" in text


def sweep_run(revision: int = 4, failed_dflash: int = 0) -> BenchRun:
    """DDTREE n8 fastest alone, n16 at 2, DFLASH at 8 (the tree no longer pays under load)."""
    b = BenchRun("gpu", "0.5.23", "ddtree", revision, "/m", "/d", ["--disable-cuda-graph"], 4, 64, 1, "t1")
    tok = {(1, "DFLASH"): 100, (1, 8): 130, (1, 16): 120, (2, 8): 200, (2, 16): 210, (2, "DFLASH"): 190,
           (4, 8): 300, (4, 16): 305, (4, "DFLASH"): 290, (8, 8): 400, (8, 16): 380, (8, "DFLASH"): 450}
    for (c, arm), t in tok.items():
        if arm == "DFLASH":
            b.rows.append(Row("DFLASH", "DFLASH", None, c, 8, 512, t, 1.0, 1.0, 2.0, failed=failed_dflash))
        else:
            b.rows.append(Row(f"DDTREE n{arm}", "DDTREE", arm, c, 8, 512, t, 1.0, 1.0, 3.0))
    return b


def test_sweep_schedule_is_the_fastest_budget_per_concurrency_or_chain_where_dflash_won():
    from sglang_patcher.serve.bench import choose_schedule
    from sglang_patcher.serve.schedule import CHAIN, schedule_text

    assert choose_schedule(sweep_run()) == [(1, 8), (2, 16), (8, CHAIN)]
    assert schedule_text(choose_schedule(sweep_run())) == "1:8,2:16,8:chain"
    # without chain steps (an older revision): the fastest DDTREE budget everywhere
    assert schedule_text(choose_schedule(sweep_run(), chain=False)) == "1:8,2:16,8:8"
    # a DFLASH arm whose requests failed never wins
    assert schedule_text(choose_schedule(sweep_run(failed_dflash=1))) == "1:8,2:16,8:8"
    assert choose_schedule(BenchRun("gpu", "0.5.23", None, None, "/m", None, [], 4, 64, 1, "t")) == []


@pytest.mark.parametrize(("revision", "want"), [(4, "1:8,2:16,8:chain"), (3, "1:8,2:16,8:8")])
def test_sweep_writes_the_schedule_into_the_inventory_keeping_comments(tmp_path, revision, want):
    """`bench --sweep` on a profile served without CUDA graphs: the schedule lands in the host's
    serve.ddtree (chain entries only for a host that carries ddtree revision 4 or later), the
    file's comments stay, and the inventory still loads with it."""
    from sglang_patcher.inventory import load_inventory
    from sglang_patcher.service_sweep import write_sweep

    inv = tmp_path / "hosts.yaml"
    inv.write_text("# my hosts\nhosts:\n  gpu:   # the box\n    transport: local\n    python: /usr/bin/python3\n"
                   "    serve:\n      model: /m\n      draft_model: /d\n      args: [--disable-cuda-graph]\n"
                   "      ddtree:\n        budget: 8   # keep me\n")
    host = load_inventory(inv).hosts["gpu"]
    r = sweep_run(revision)
    write_sweep(r, host, host.serve, inv)
    assert r.schedule == want and "written to" in r.schedule_written
    text = inv.read_text()
    assert "# my hosts" in text and "# the box" in text and "# keep me" in text
    again = load_inventory(inv).hosts["gpu"].serve.ddtree
    assert again.budget_schedule == want and again.budget == 16      # widened to the widest budget won
    assert "--speculative-ddtree-budget-schedule" in again.flags()


def _sweep_inventory(tmp_path):
    from sglang_patcher.inventory import load_inventory

    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  gpu:\n    transport: local\n    python: /usr/bin/python3\n"
                   "    serve:\n      model: /m\n      draft_model: /d\n      args: [--disable-cuda-graph]\n"
                   "      ddtree:\n        budget: 8\n")
    return inv, load_inventory(inv).hosts["gpu"]


@pytest.mark.parametrize(("features", "want", "written"), [
    ("", "1:8,2:16,8:8", False),                                  # no `features:`: nothing to write into
    ("features: {budget_schedule: 1}\n", "1:8,2:16,8:8", True),   # a schedule, but no chain steps
    ("features: {budget_schedule: 1, budget_schedule_chain: 1}\n", "1:8,2:16,8:chain", True),
])
def test_sweep_asks_the_deployed_revision_for_its_features_not_its_name(tmp_path, monkeypatch, features, want,
                                                                         written):
    """Whether the sweep writes a schedule, and with chain entries, is what the patchset a host
    carries declares (``features:`` in its patchset.yaml), whatever its name or revision."""
    from sglang_patcher.inventory import load_inventory
    from sglang_patcher.service_sweep import write_sweep

    root = tmp_path / "patchsets" / "plain"
    root.mkdir(parents=True)
    (root / "patchset.yaml").write_text(f"name: plain\nrevision: 1\n{features}targets:\n  \"0.5.23\": {{}}\n")
    monkeypatch.chdir(tmp_path)                   # ./patchsets/plain is found by name
    inv, host = _sweep_inventory(tmp_path)
    r = sweep_run()
    r.patchset, r.revision = "plain", 1
    write_sweep(r, host, host.serve, inv)
    assert r.schedule == want
    assert load_inventory(inv).hosts["gpu"].serve.ddtree.budget_schedule == (want if written else None)
    if not written:
        assert r.schedule_written.startswith("not written to gpu's profile: host gpu carries plain r1, which has no "
                                            "budget schedule")


def test_sweep_on_a_host_without_a_deployment_shows_the_schedule_only(tmp_path):
    from sglang_patcher.service_sweep import write_sweep

    inv, host = _sweep_inventory(tmp_path)
    r = sweep_run()
    r.patchset = r.revision = None
    write_sweep(r, host, host.serve, inv)
    assert r.schedule == "1:8,2:16,8:8" and "carries no sglpatch deployment" in r.schedule_written


def test_auto_arm_serves_the_planner_up_to_the_budget_and_never_enters_a_sweep():
    """``bench --budgets 8,auto``: the auto arm starts DDTREE with the schedule ``auto`` and the
    profile's budget as its ceiling; its rows are measured like any arm but a sweep never writes
    its budget (it is the planner's ceiling, not a budget that ran)."""
    from sglang_patcher.serve.bench import choose_schedule

    auto = Arm("DDTREE", 64, None, "auto")
    assert auto.label == "DDTREE auto<=64"
    assert auto.ddtree().flags() == ["--speculative-ddtree-budget", "64", "--speculative-ddtree-budget-schedule", "auto"]
    assert Arm("DDTREE", 8).ddtree().flags() == ["--speculative-ddtree-budget", "8"]
    assert summarize(auto, 1, [result(11, 2.0, 1.0, 2.0)], 1.0).schedule == "auto"
    b = run()
    b.rows.append(Row("DDTREE auto<=64", "DDTREE", 64, 1, 8, 512, 99.0, 5.0, 100.0, 3.5, schedule="auto"))
    assert choose_schedule(b) == [(1, 8)]                     # the auto row's 99 tok/s is not a budget
    d = json.loads(json.dumps(b.to_json()))
    assert d["rows"][-1]["schedule"] == "auto"


def test_bench_budgets_option_takes_numbers_and_auto():
    import click

    from sglang_patcher.cli_commands import _budgets

    assert _budgets("16, 64,AUTO") == [16, 64, "auto"] and _budgets(None) is None
    for bad, why in (("", "empty"), ("0", "'0' is not a budget"), ("x", "not a budget"), ("16,,8", "empty"),
                     ("auto2", "not a budget"), ("16,16", "16 is given twice"), ("auto,Auto", "auto is given twice")):
        with pytest.raises(click.BadParameter, match=why) as e:
            _budgets(bad)
        assert e.value.param_hint == "--budgets"
        # the comma tip where the commas may be wrong; a repeated budget is not a comma problem
        assert ("e.g. 16,64,auto" in e.value.message) == ("twice" not in why), e.value.message


def test_profile_bench_budgets_take_auto_too():
    from sglang_patcher.serve.profile import ServeProfile

    p = ServeProfile(model="/m", bench={"budgets": [16, "Auto", "64"]})
    assert p.bench.budgets == [16, "auto", 64]
    for bad in ([0], [16, 16], ["auto2"], [True], "16"):
        with pytest.raises(ValueError):
            ServeProfile(model="/m", bench={"budgets": bad})


def test_bench_measures_the_profile_schedule_as_served_and_says_when_fixed_budgets_leave_it_out():
    """A fresh user's profile served DDTREE with a budget schedule, and `bench` measured only a
    fixed budget without saying so. Now the default DDTREE arm is the profile's schedule (DDTREE as
    served); `--budgets 8,schedule` measures both; fixed budgets alone are said to leave it out;
    a sweep measures fixed budgets (its rows choose the next schedule)."""
    from sglang_patcher.errors import ConfigError
    from sglang_patcher.inventory import Host
    from sglang_patcher.service_bench import _ddtree_arms

    host = Host(name="gpu", hostname="gpu.invalid", python="/usr/bin/python3",
                serve={"model": "/m", "draft_model": "/d", "args": ["--disable-cuda-graph"],
                       "ddtree": {"budget": 32, "budget_schedule": "1:32, 16:chain"}})
    said: list[str] = []
    served = Arm("DDTREE", 32, None, "1:32,16:chain")
    assert _ddtree_arms(host, host.serve, [], sweep=False, log=said.append) == [served] and not said
    assert served.label == "DDTREE schedule 1:32,16:chain (<=n32)"
    assert served.ddtree().flags()[-2:] == ["--speculative-ddtree-budget-schedule", "1:32,16:chain"]
    assert _ddtree_arms(host, host.serve, [8, "schedule"], sweep=False, log=said.append) == [
        Arm("DDTREE", 8, None, "fixed"), served]
    assert not said
    assert _ddtree_arms(host, host.serve, [8], sweep=False, log=said.append) == [Arm("DDTREE", 8, None, "fixed")]
    assert len(said) == 1 and "budget_schedule '1:32,16:chain'" in said[0] and "add `schedule`" in said[0]
    assert _ddtree_arms(host, host.serve, [], sweep=True, log=said.append) == [Arm("DDTREE", 32, None, "fixed")]
    plain = Host(name="cpu", hostname="cpu.invalid", python="/usr/bin/python3",
                 serve={"model": "/m", "draft_model": "/d", "ddtree": {"budget": 16}})
    # no schedule in the profile: the server's default (auto from ddtree revision 13, fixed before)
    assert _ddtree_arms(plain, plain.serve, [], sweep=False, log=said.append) == [Arm("DDTREE", 16)]
    with pytest.raises(ConfigError, match="cpu's serve profile has no ddtree.budget_schedule"):
        _ddtree_arms(plain, plain.serve, ["schedule"], sweep=False, log=said.append)
    auto = Host(name="a", hostname="a.invalid", python="/usr/bin/python3",
                serve={"model": "/m", "draft_model": "/d", "ddtree": {"budget": 16, "budget_schedule": "auto"}})
    assert _ddtree_arms(auto, auto.serve, ["auto", "schedule"], sweep=False,
                        log=said.append) == [Arm("DDTREE", 16, None, "auto")]   # one arm, not two


def test_bench_schedule_budget_needs_a_profile_schedule():
    from sglang_patcher.serve.profile import ServeProfile

    assert ServeProfile(model="/m", ddtree={"budget_schedule": "1:8"}, bench={"budgets": ["Schedule", 8]}
                        ).bench.budgets == ["schedule", 8]
    with pytest.raises(ValueError, match="bench.budgets names `schedule`"):
        ServeProfile(model="/m", bench={"budgets": ["schedule"]})


def test_a_sweep_that_chose_one_budget_everywhere_sets_the_server_budget_to_it_and_keeps_cuda_graphs(tmp_path):
    """With CUDA graphs kept (captured at the server budget's width), a table of one width other
    than the server budget was refused and not written. A sweep whose every concurrency chose the
    same budget now sets the server budget to it — lowered from 32 to 8 here — and the table
    verifies at the captured width; several widths are still refused there before revision 9."""
    from sglang_patcher.inventory import load_inventory
    from sglang_patcher.service_sweep import write_sweep

    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  gpu:\n    transport: local\n    python: /usr/bin/python3\n"
                   "    serve:\n      model: /m\n      draft_model: /d\n      ddtree:\n        budget: 32\n")
    host = load_inventory(inv).hosts["gpu"]
    r = sweep_run()
    r.args = []
    r.rows = [x for x in r.rows if x.budget in (8, None) and x.concurrency < 8]   # n8 beats DFLASH at 1-4
    write_sweep(r, host, host.serve, inv)
    assert r.schedule == "1:8" and "budget = 8 (was 32)" in r.schedule_written, r.schedule_written
    dd = load_inventory(inv).hosts["gpu"].serve.ddtree
    assert (dd.budget, dd.budget_schedule) == (8, "1:8")
    r = sweep_run()
    r.args = []
    host = load_inventory(inv).hosts["gpu"]
    write_sweep(r, host, host.serve, inv)
    assert r.schedule == "1:8,2:16,8:chain" and "verifies at several widths" in r.schedule_written
    assert load_inventory(inv).hosts["gpu"].serve.ddtree.budget_schedule == "1:8"     # left as it was
    # a host carrying revision 9 serves several widths beside the graphs (the others eager): written,
    # the budget widened to the widest chosen (the captured width)
    r = sweep_run(9)
    r.args = []
    write_sweep(r, host, host.serve, inv)
    dd = load_inventory(inv).hosts["gpu"].serve.ddtree
    assert (dd.budget, dd.budget_schedule) == (16, "1:8,2:16,8:chain"), r.schedule_written


def test_an_unquoted_one_entry_schedule_is_refused_with_the_quoting_fix_and_a_sweep_writes_it_quoted(tmp_path):
    """`budget_schedule: 1:8` in YAML 1.1 (PyYAML, the inventory's reader) is the number 68: it was
    refused as "not a valid string". Now the error says to quote it; and the sweep's writer
    (ruamel, YAML 1.2, which writes 1:8 plain) quotes what would not read back as itself."""
    from sglang_patcher.errors import InventoryError
    from sglang_patcher.inventory import load_inventory
    from sglang_patcher.inventory_edit import set_host_value

    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  gpu:\n    hostname: g.invalid\n    python: /usr/bin/python3\n"
                   "    serve: {model: /m, ddtree: {budget: 8, budget_schedule: 1:8}}\n")
    with pytest.raises(InventoryError, match=r'got the number 68: quote it, e.g. budget_schedule: "1:8"'):
        load_inventory(inv)
    inv.write_text("hosts:\n  gpu:\n    hostname: g.invalid\n    python: /usr/bin/python3\n"
                   "    serve: {model: /m, ddtree: {budget: 8}}\n")
    set_host_value(inv, "gpu", ["serve", "ddtree", "budget_schedule"], "1:8")
    set_host_value(inv, "gpu", ["serve", "ddtree", "budget"], 16)
    assert '"1:8"' in inv.read_text()
    dd = load_inventory(inv).hosts["gpu"].serve.ddtree
    assert (dd.budget_schedule, dd.budget) == ("1:8", 16)


@pytest.mark.parametrize(("written", "keys"), [
    ("1:8,4:16", "4:16 read as the number 256"),
    ("1:8,4:16,16:chain", "4:16 read as the number 256, 16:chain"),
])
def test_a_schedule_cut_by_a_flow_mapping_gets_one_error_with_the_schedule_quoted(tmp_path, written, keys):
    """New-user pass: `ddtree: {budget_schedule: 1:8,4:16}` — inside { } YAML ends the value at the
    comma (68) and makes 4:16 a key of its own (256): two errors, the second "Keys should be
    strings". Now one, giving back the whole schedule quoted; the quoted form loads."""
    from sglang_patcher.errors import InventoryError
    from sglang_patcher.inventory import load_inventory

    inv = tmp_path / "hosts.yaml"
    body = "hosts:\n  gpu:\n    hostname: g.invalid\n    python: /usr/bin/python3\n    serve: {model: /m, ddtree: %s}\n"
    inv.write_text(body % f"{{budget: 8, budget_schedule: {written}}}")
    with pytest.raises(InventoryError) as e:
        load_inventory(inv)
    said = str(e.value)
    assert f"made the rest keys of their own ({keys}). Quote it: {{budget_schedule: \"{written}\"}}" in said, said
    assert "Keys should be strings" not in said and "problems" not in said, said   # one error
    inv.write_text(body % f'{{budget: 8, budget_schedule: "{written}"}}')
    assert load_inventory(inv).hosts["gpu"].serve.ddtree.budget_schedule == written


def test_bench_plot_without_matplotlib_is_refused_before_the_run(monkeypatch, tmp_path):
    """matplotlib comes with the ddtree extra only: `bench --plot` found out after the whole run."""
    import sys

    from sglang_patcher.errors import ConfigError
    from sglang_patcher.inventory import Host
    from sglang_patcher.service_bench import bench_host

    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import matplotlib -> ImportError
    host = Host(name="gpu", hostname="gpu.invalid", python="/usr/bin/python3",
                serve={"model": "/m", "draft_model": "/d"})
    with pytest.raises(ConfigError, match="--plot needs matplotlib") as e:
        bench_host(host, plot_path=tmp_path / "b.png", store_run=False)    # no connection is tried
    assert "ddtree extra" in e.value.hint


def test_bench_options_refuse_empty_entries_no_arms_and_arms_beside_a_sweep(capsys):
    """A new user's `--concurrency 1,,4` and `--arms ''` were taken, and `--sweep` silently put
    DFLASH,DDTREE in place of the --arms given."""
    import click

    from sglang_patcher.cli import main
    from sglang_patcher.cli_commands import _ints

    assert _ints("1, 4,16") == [1, 4, 16]
    for bad in ("1,,4", "1,4,", ""):
        with pytest.raises(click.BadParameter, match="empty entry"):
            _ints(bad)
    for argv, said in ((["--arms", ""], "name at least one of none, DFLASH, DDTREE"),
                       (["--sweep", "--arms", "none,DDTREE"], "--sweep measures DFLASH and DDTREE")):
        capsys.readouterr()
        assert main(["bench", "--host", "nowhere", *argv]) == 2       # before the host is looked up
        assert said in " ".join(capsys.readouterr().err.split())


def test_a_fixed_budget_is_said_as_fixed_where_an_unset_schedule_is_auto():
    """From ddtree revision 13 an unset --speculative-ddtree-budget-schedule means auto: bench's
    fixed-budget arms (and a sweep's) must pass `fixed` there, and leave it out before (the word is
    unknown to revisions 3-12, whose unset schedule is the fixed budget). The profile's own
    default arm is labelled for what the server does with it."""
    fixed, default = Arm("DDTREE", 8, None, "fixed"), Arm("DDTREE", 16)
    new, old = fixed.for_revision(True), fixed.for_revision(False)
    assert new.ddtree().flags() == ["--speculative-ddtree-budget", "8", "--speculative-ddtree-budget-schedule", "fixed"]
    assert old.ddtree().flags() == ["--speculative-ddtree-budget", "8"]          # control: nothing added
    assert new.label == old.label == "DDTREE n8" and new.row_schedule is None is old.row_schedule
    served_new, served_old = default.for_revision(True), default.for_revision(False)
    assert served_new.ddtree().flags() == served_old.ddtree().flags() == ["--speculative-ddtree-budget", "16"]
    assert served_new.label == "DDTREE auto<=16" and served_new.row_schedule == "auto"
    assert served_old.label == "DDTREE n16" and served_old.row_schedule is None
    table = Arm("DDTREE", 32, None, "1:32,16:chain")
    assert table.for_revision(True) == table == table.for_revision(False)
    assert Arm("DFLASH").for_revision(True) == Arm("DFLASH")
