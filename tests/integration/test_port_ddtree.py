"""``patchset port`` of the real ddtree patchset from sglang 0.5.23 to 0.5.22, on the real PyPI wheels
(marker ``sglang``; downloads cached under ``$SGLPATCH_TEST_WHEEL_HOME``).

The outcome asserted is the one observed for patches 0001-0009 of revision 3 (33 hunks: 11 as is,
16 at an offset, 1 merged, 3 conflicts, 2 vanished), so a change in the port's rules or in those
patches shows up here; patches added to the series later are ported too but only have to render.
The file-level verdicts are checked against ``git merge-file`` where git is installed, and the
partial port written into a scratch copy must render on the 0.5.22 wheel with its new pins.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sglang_patcher import service_port
from sglang_patcher.errors import PatchsetError
from sglang_patcher.patchset import load_patchset
from sglang_patcher.wheelcache import pristine_tree

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]
DDTREE = REPO / "patchsets" / "ddtree"
FROM, TO = "0.5.23", "0.5.22"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
HOOK = "sglang/srt/arg_groups/speculative_hook.py"
METRICS = "sglang/srt/managers/scheduler_components/metrics_reporter.py"
DRAFT_PARALLEL = "sglang/srt/speculative/draft_parallel.py"

KNOWN = {f"sglang-{FROM}/{name}" for name in (
    "0001-ddtree-speculative-algorithm.patch", "0002-ddtree-server-args.patch",
    "0003-model-config-of-memo-before-import.patch", "0004-ddtree-validation.patch",
    "0005-ddtree-dflash-family-sites.patch", "0006-ddtree-target-verify-width.patch",
    "0007-ddtree-decode-reserve-hook.patch", "0008-ddtree-triton-verify-mask-width.patch",
    "0009-ddtree-refuse-swa-hybrid-hisparse.patch")}
OBSERVED = {   # 0.5.23 -> 0.5.22, patches 0001-0009, per file: {status: hunks}
    "sglang/srt/arg_groups/fields/spec.py": {"applied": 2},
    "sglang/srt/arg_groups/model_override_base.py": {"applied": 2},
    "sglang/srt/arg_groups/model_overrides/nemotron_h.py": {"offset": 1},
    HOOK: {"conflict": 1, "offset": 4},
    "sglang/srt/layers/attention/triton_backend.py": {"offset": 1},
    METRICS: {"conflict": 1},
    "sglang/srt/mem_cache/kv_cache_configurator.py": {"offset": 1},
    "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py": {"offset": 1},
    "sglang/srt/speculative/dflash_info_v2.py": {"applied": 2},
    DRAFT_PARALLEL: {"vanished": 2},
    SPEC_INFO: {"applied": 3, "conflict": 1, "merged": 1, "offset": 7},
    "sglang/srt/speculative/spec_registry.py": {"applied": 1},
    "sglang/srt/speculative/spec_sampling_mask.py": {"applied": 1},
    "sglang/srt/speculative/spec_utils.py": {"offset": 1},
}


@pytest.fixture(scope="module")
def wheel_home() -> Path:
    home = Path(os.environ.get("SGLPATCH_TEST_WHEEL_HOME", "/var/tmp/sglpatch-tests/wheel-home"))
    home.mkdir(parents=True, exist_ok=True)
    try:
        pristine_tree(FROM, home=home)
        pristine_tree(TO, home=home)
    except PatchsetError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot fetch the sglang wheels: {exc}")
    return home


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the ddtree patchset without its 0.5.22 target (revision 5 has one): the port makes it."""
    root = tmp_path_factory.mktemp("src") / "ddtree"
    shutil.copytree(DDTREE, root, ignore=shutil.ignore_patterns("__pycache__", "history"))
    doc = yaml.safe_load((root / "patchset.yaml").read_text())
    if TO in doc["targets"]:
        del doc["targets"][TO]
        doc.pop("history", None)
        (root / "patchset.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        shutil.rmtree(root / f"sglang-{TO}")      # its series too: the port writes it afresh
    return root


@pytest.fixture(scope="module")
def ported(source, wheel_home, tmp_path_factory):
    out = tmp_path_factory.mktemp("port")
    before = (source / "patchset.yaml").read_bytes()
    result = service_port.port_patchset(str(source), FROM, TO, out=out, partial=True, home=wheel_home)
    assert (source / "patchset.yaml").read_bytes() == before      # --out leaves the patchset alone
    return result, out


def test_per_file_outcome_of_the_port_to_0_5_22(ported):
    result, _ = ported
    known = [h for h in result.hunks if h.patch in KNOWN]
    per_file: dict[str, dict[str, int]] = {}
    for h in known:
        per_file.setdefault(h.path, {}).setdefault(h.status, 0)
        per_file[h.path][h.status] += 1
    assert per_file == OBSERVED
    counts = {s: sum(1 for h in known if h.status == s) for s in ("applied", "offset", "merged", "conflict", "vanished")}
    assert counts == {"applied": 11, "offset": 16, "merged": 1, "conflict": 3, "vanished": 2}
    assert result.files[DRAFT_PARALLEL].fate == "vanished"      # new in 0.5.23: no older copy anywhere
    conflicts = {(h.patch.rsplit("/", 1)[1], h.path, h.index) for h in result.hunks if h.status == "conflict"}
    assert conflicts == {("0001-ddtree-speculative-algorithm.patch", SPEC_INFO, 9),
                         ("0004-ddtree-validation.patch", HOOK, 1),
                         ("0005-ddtree-dflash-family-sites.patch", METRICS, 1)}
    # 0.5.22 has no platform-worker hook in create_worker: the DDTREE branch went in above it
    (c,) = next(h for h in result.hunks if h.status == "conflict" and h.path == SPEC_INFO).conflicts
    assert c.ours == () and b"platform_worker_cls = self.get_platform_worker_cls()\n" in b"".join(c.base)
    assert result.seconds < 60


def test_partial_port_in_a_scratch_copy_renders_on_the_0_5_22_wheel(ported, wheel_home):
    result, out = ported
    assert result.mode == "out" and result.written["partial"] is True
    copy = load_patchset(out / "ddtree")
    assert TO in copy.versions and FROM in copy.versions
    t = copy.target(TO)
    assert t.series == [p.dest for p in result.patches if p.text is not None]
    assert DRAFT_PARALLEL not in t.pristine and METRICS not in t.pristine
    rendered = copy.render(TO, pristine_tree(TO, home=wheel_home).read)      # the pins check out
    assert len(rendered.changed_files()) == len(t.expected)
    for path in (SPEC_INFO, HOOK, METRICS):
        marked = (out / "conflicts" / f"sglang-{TO}" / path).read_bytes()
        assert marked.count(b"<<<<<<< sglang 0.5.22\n") == 1 and f">>>>>>> ddtree r{copy.revision}\n".encode() in marked
    assert (out / f"report-sglang-{TO}.json").is_file()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_file_level_verdicts_agree_with_git_merge_file(ported, source, wheel_home, tmp_path):
    """For each file: git merge-file (base 0.5.23, ours 0.5.22, theirs 0.5.23 patched) conflicts
    exactly where the port has a conflicting hunk."""
    result, _ = ported
    old, new = pristine_tree(FROM, home=wheel_home), pristine_tree(TO, home=wheel_home)
    patched = load_patchset(source).render(FROM, old.read)
    for path, change in patched.files.items():
        if change.old is None or new.read(path) is None:
            continue
        for name, data in (("base", change.old), ("ours", new.read(path)), ("theirs", change.new)):
            (tmp_path / name).write_bytes(data)
        proc = subprocess.run(["git", "merge-file", "-p", "ours", "base", "theirs"], cwd=tmp_path,
                              capture_output=True)
        has_conflict = any(h.status == "conflict" for h in result.hunks if h.path == path)
        assert (proc.returncode > 0) == has_conflict, path
