"""`sglpatch patchset list` / `show` (issue 18: no way to list what a patchset supports): the
real ddtree patchset's revisions, releases, files, checks and withdrawn revision, by the CLI."""

from __future__ import annotations

import json

from rich.console import Console

from sglang_patcher.catalog import list_patchsets, show_patchset
from sglang_patcher.cli import main
from sglang_patcher.patchset import load_patchset


def run_json(capsys, *args):
    capsys.readouterr()
    code = main(["--json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def render(obj, width=120) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(obj)
    return console.export_text()


def test_list_names_each_patchset_with_its_releases_and_withdrawn_revisions(capsys):
    code, data, _ = run_json(capsys, "patchset", "list")
    assert code == 0 and data["ok"] is True
    dd = next(p for p in data["patchsets"] if p["name"] == "ddtree")
    ps = load_patchset("ddtree")
    assert dd["revision"] == ps.revision and dd["releases"] == ps.versions == ["0.5.21", "0.5.22", "0.5.23"]
    revs = {r["revision"]: r for r in dd["revisions"]}
    assert revs[ps.revision]["status"] == "current"
    assert revs[2]["status"] == "withdrawn" and "attn_backend" in revs[2]["withdrawn"]
    assert revs[1]["status"] == "earlier" and revs[1]["releases"] == ["0.5.23"]
    text = render(list_patchsets())
    assert "ddtree" in text and "r2 (withdrawn)" in text and "0.5.23" in text


def test_show_lists_files_per_release_the_series_and_the_checks(capsys):
    ps = load_patchset("ddtree")
    code, data, _ = run_json(capsys, "patchset", "show", "ddtree")
    assert code == 0 and data["revision"] == ps.revision and data["withdrawn"] is None
    t = data["targets"]["0.5.23"]
    assert t["series"] == list(ps.target("0.5.23").series)
    assert "sglang/srt/speculative/ddtree_worker.py" in t["added"]
    assert "sglang/srt/speculative/spec_info.py" in t["modified"] and t["deleted"] == []
    assert sorted(t["added"] + t["modified"]) == ps.touched_paths("0.5.23")
    assert set(data["checks"]) == {"L0", "L1", "L2-L3"} and "checks/l1_ddtree.py" in data["checks"]["L1"]
    text = render(show_patchset("ddtree"))
    assert "withdrawn: revision 2 cannot serve with DDTREE" in text
    assert "sglang/srt/speculative/ddtree_worker.py" in text and "added" in text


def test_show_an_earlier_revision_says_it_is_withdrawn_and_shows_its_own_files(capsys):
    code, data, _ = run_json(capsys, "patchset", "show", "ddtree@2")
    assert code == 0 and data["revision"] == 2 and "attn_backend" in data["withdrawn"]
    r2 = load_patchset("ddtree@2")
    t = data["targets"]["0.5.23"]
    assert sorted(t["added"] + t["modified"] + t["deleted"]) == r2.touched_paths("0.5.23")
    assert "r2 (shown)" in render(show_patchset("ddtree@2"))


def test_show_an_unknown_patchset_is_exit_3_naming_the_known_ones(capsys):
    code, data, _ = run_json(capsys, "patchset", "show", "ddtre")
    assert code == 3 and "ddtree" in data["error"] and "did you mean 'ddtree'" in data["hint"]


def test_earlier_revisions_show_as_ranges_around_withdrawn_ones():
    """`patchset list` keeps its column short as revisions accumulate: consecutive revisions in
    one range, a withdrawn one alone (and named so), a gap breaking a range."""
    from sglang_patcher.catalog import RevisionInfo, _earlier_items

    revs = [RevisionInfo(n, ["0.5.23"], withdrawn="why" if n == 2 else None) for n in (9, 7, 6, 5, 2, 1)]
    assert _earlier_items(revs) == [("r9", False), ("r7–r5", False), ("r2 (withdrawn)", True), ("r1", False)]
    assert _earlier_items([]) == []
