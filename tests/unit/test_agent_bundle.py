"""The host agent is one script on the wire and a package of modules in the repository: the joined
script (what the launcher sends) uses the standard library only, is byte-identical from run to run,
and holds the same ops as the package; the joiner refuses a package it could not join into a
working script."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_patcher.remote import access, launcher
from sglang_patcher.remote.bundle import join, join_module, script_source

AGENT_DIR = Path(launcher.__file__).parent / "deploy_agent"


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_the_joined_agent_uses_the_standard_library_only():
    src = script_source("deploy_agent").decode("utf-8")
    tree = ast.parse(src)
    found = set()
    for node in _imports(tree):  # module level and inside functions (`import pwd`)
        assert not getattr(node, "level", 0), ast.unparse(node)  # no relative import is left
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
        for name in names:
            found.add(name.split(".")[0])
    assert {"os", "json", "tarfile", "pwd"} <= found
    assert not found - set(sys.stdlib_module_names), found - set(sys.stdlib_module_names)
    assert ast.get_docstring(tree).startswith("Host-side deploy agent")
    compile(src, "<sglpatch-remote>", "exec")


def test_the_joined_agent_is_byte_identical_from_run_to_run():
    """Joined twice here and in two fresh interpreters with other hash seeds: the same bytes, and
    the same argv the launcher sends."""
    first = script_source("deploy_agent")
    assert script_source("deploy_agent") == first
    code = ("import sys, hashlib; from sglang_patcher.remote import launcher, bundle; "
            "print(hashlib.sha256(bundle.script_source('deploy_agent')).hexdigest(), "
            "hashlib.sha256(launcher._encoded_source('deploy_agent').encode()).hexdigest())")
    repo = Path(launcher.__file__).resolve().parents[2]  # this checkout's sglang_patcher first on sys.path
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")}
    assert len(outs) == 1, outs
    import hashlib
    assert outs.pop().split() == [hashlib.sha256(first).hexdigest(),
                                  hashlib.sha256(launcher._encoded_source("deploy_agent").encode()).hexdigest()]


def test_the_joined_agent_holds_the_ops_of_the_package():
    from sglang_patcher.remote.deploy_agent import MODULES
    from sglang_patcher.remote.deploy_agent.main import OPS

    for mod in MODULES:  # every module imports as it is
        importlib.import_module(f"sglang_patcher.remote.deploy_agent.{mod}")
    ns: dict = {"__name__": "joined"}
    exec(compile(script_source("deploy_agent"), "<sglpatch-remote>", "exec"), ns)
    assert sorted(ns["OPS"]) == sorted(OPS) and "put_backups" in OPS
    assert {n: f.__name__ for n, f in ns["OPS"].items()} == {n: f.__name__ for n, f in OPS.items()}


def test_a_single_module_without_shared_imports_is_sent_as_it_is(tmp_path):
    (tmp_path / "plain.py").write_text('"""A plain script."""\n\nimport os\n\nX = os.sep\n')
    assert join_module(tmp_path / "plain.py") is None   # script_source then sends its bytes


def test_the_probe_and_the_agent_carry_the_same_shared_access_code():
    """One piece of code decides whether a path can be changed on the host: ``access.py``, joined
    into the probe (``hosts --check``'s writable column) and into the deploy agent (apply's
    refusal before any write) — once each, ahead of their own code, byte for byte the same."""
    shared = (Path(launcher.__file__).parent / "access.py").read_text()
    body = shared[shared.index("# FS_IOC_GETFLAGS"):].strip("\n")
    for script in ("probe", "deploy_agent"):
        src = script_source(script).decode("utf-8")
        assert src.count(body) == 1, script
        assert src.index(body) < src.index("def op_"), script
        assert "from .access" not in src and "from ..access" not in src
        tree = ast.parse(src)
        for node in _imports(tree):
            assert not getattr(node, "level", 0), ast.unparse(node)
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            assert all(n.split(".")[0] in sys.stdlib_module_names for n in names), names
        ns: dict = {"__name__": "joined"}
        exec(compile(src, "<sglpatch-remote>", "exec"), ns)
        here = str(Path(launcher.__file__).parent)
        assert ns["write_problem"](here) == access.write_problem(here)
        assert ns["attr_problem"](here) == access.attr_problem(here)
    assert script_source("probe") == script_source("probe")


def test_a_script_joins_the_shared_modules_it_imports_first(tmp_path):
    (tmp_path / "common.py").write_text('"""Shared."""\n\nimport os\n\n\ndef where():\n    return os.sep\n')
    pkg = _package(tmp_path, {"a": "from ..common import where\n\nX = where()\n"})
    (tmp_path / "one.py").write_text('"""One script."""\n\nfrom .common import where\n\nY = where() * 2\n')
    for src in (join(pkg), join_module(tmp_path / "one.py")):
        assert src.index("def where") < src.index("= where()") and "from ." not in src
        ns: dict = {}
        exec(compile(src, "joined", "exec"), ns)
        assert ns["where"]() == "/"
    assert join_module(tmp_path / "one.py").startswith('"""One script."""\n')
    (tmp_path / "common.py").write_text("from .other import Z\n")
    with pytest.raises(ValueError, match="a shared module must not import relatively"):
        join(pkg)


def _package(root: Path, modules: dict[str, str], order: tuple[str, ...] | None = None) -> Path:
    pkg = root / "agentpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f'"""A test agent."""\n\nMODULES = {order or tuple(modules)!r}\n')
    for name, text in modules.items():
        (pkg / f"{name}.py").write_text(text)
    return pkg


def test_a_package_joins_into_one_working_script(tmp_path):
    pkg = _package(tmp_path, {
        "a": '"""Module a."""\n\nfrom __future__ import annotations\n\nimport os\n\nX = 1\n\n\ndef f():\n    return X\n',
        "b": "import os\nimport json\n\nfrom .a import X, f\n\n\ndef g():\n    import pwd  # a local import stays\n"
             "    return f() + X, json.dumps(os.sep)\n",
    })
    src = join(pkg)
    assert src.startswith('"""A test agent."""\n')
    assert src.count("import os\n") == 1 and "from .a" not in src and "Module a." not in src
    ns: dict = {}
    exec(compile(src, "joined", "exec"), ns)
    assert ns["g"]() == (2, '"/"')
    assert join(pkg) == src


@pytest.mark.parametrize("modules,order,says", [
    ({"a": "from .b import Y\n", "b": "Y = 1\n"}, None, "not a module joined before a"),
    ({"a": "X = 1\n", "b": "from .a import X as Z\n"}, None, "by its own name"),
    ({"a": "import os\n", "b": "from .a import os\n"}, None, "module that defines it"),
    ({"a": "X = 1\n", "b": "X = 2\n"}, None, "defined in a.py too"),
    ({"a": "X = 1\n", "b": "def f():\n    from .a import X\n"}, None, "at module level"),
    ({"a": "import os\n", "b": "def os():\n    pass\n"}, None, "would replace an import"),
    ({"a": "X = 1\n", "b": "from .a import X; Y = X\n"}, None, "one statement per line"),
    ({"a": "X = 1\n", "b": "Y = 2\n"}, ("a",), "must name each of its modules once"),
])
def test_a_package_that_would_not_work_joined_is_refused(tmp_path, modules, order, says):
    with pytest.raises(ValueError, match=says):
        join(_package(tmp_path, modules, order))
