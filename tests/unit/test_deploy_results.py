"""How a host's state is put in words (sglang_patcher/deploy/results.py)."""

from __future__ import annotations

from sglang_patcher.deploy.results import active_summary


def test_stacked_upgrades_of_one_patchset_read_as_one_install():
    active = [{"id": "a", "patchset": "ddtree", "revision": 3}, {"id": "b", "patchset": "ddtree", "revision": 4},
              {"id": "c", "patchset": "ddtree", "revision": 5}]
    assert active_summary(active) == "ddtree r5, upgraded from r3, r4: each rollback steps back one"


def test_one_deployment_each_and_two_patchsets():
    assert active_summary([{"patchset": "ddtree", "revision": 5}]) == "ddtree r5"
    two = [{"patchset": "ddtree", "revision": 4}, {"patchset": "other", "revision": 1},
           {"patchset": "ddtree", "revision": 5}]
    assert active_summary(two) == "ddtree r5, upgraded from r4: each rollback steps back one; other r1"
    assert active_summary([]) == ""
