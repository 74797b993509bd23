"""No import circles in ``sglang_patcher``: its module import graph, built from the source with
``ast``, is acyclic. Nor in the ddtree patchset's payload, under the names its modules are installed
as (``sglang.srt.speculative.ddtree_*``, ``sglang.kernels.ops.speculative.ddtree_*``), whose Triton
kernel modules import torch, Triton and each other only — never the algorithm modules that call them.

Every import statement counts, wherever it is — at module level, inside a function (a local import
is how a circle is usually hidden), under ``if TYPE_CHECKING:`` — and so does the package
``__init__`` that Python runs first: ``from .deploy.plan import x`` in a module outside
``deploy/`` imports ``sglang_patcher.deploy`` (its ``__init__``) as well as ``deploy.plan``. A module
inside a package does not re-run that package's ``__init__`` (it is already being imported), so
that edge is not counted for it; nor is the top-level ``sglang_patcher`` package, which every module
lies in.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "sglang_patcher"
DDTREE_DIR = Path(__file__).resolve().parents[2] / "patchsets" / "ddtree"


def module_files(package_dir: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module under ``package_dir`` (a package's name is
    its ``__init__.py``)."""
    root = package_dir.name
    out = {}
    for f in sorted(package_dir.rglob("*.py")):
        parts = [root, *f.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return name in files and files[name].name == "__init__.py"


def _targets(node: ast.Import | ast.ImportFrom, module: str, files: dict[str, Path]) -> set[str]:
    """The modules of ``files`` that one import statement in ``module`` names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if _is_package(module, files) else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
    out = set()
    for name in names:
        while name and name not in files:  # `import a.b.c` of a non-module attribute: its module
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """``{module: modules it imports}`` inside the package at ``package_dir``."""
    return import_graph_of(module_files(package_dir))


def import_graph_of(files: dict[str, Path]) -> dict[str, set[str]]:
    """``{module: modules of files it imports}`` for ``files`` (``{dotted module name: file}``)."""
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(node, module, files):
                parts = target.split(".")
                # the target, and each package above it that ``module`` is not inside of (its
                # __init__ runs first); the top-level package holds every module
                for i in range(len(parts), 1, -1):
                    pkg = ".".join(parts[:i])
                    if module != pkg and not module.startswith(pkg + "."):
                        graph[module].add(pkg)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_sglang_patcher_has_no_import_circles():
    graph = import_graph(PACKAGE_DIR)
    # the graph is really built: known edges are in it
    assert "sglang_patcher.deploy" in graph["sglang_patcher.service_apply"]
    assert "sglang_patcher.remote.launcher" in graph["sglang_patcher.discovery"]
    assert "sglang_patcher.transport.ssh" in graph["sglang_patcher.transport"]  # a function-local import
    assert sum(len(v) for v in graph.values()) > 60
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


@pytest.mark.parametrize("files,cycle", [
    # a circle hidden by a function-local import
    ({"pkg/__init__.py": "", "pkg/a.py": "from .b import x\n",
      "pkg/b.py": "x = 1\ndef f():\n    from . import a\n"}, ["pkg.a", "pkg.b", "pkg.a"]),
    # through a subpackage's __init__ that re-exports: c imports pkg.sub.low, whose package
    # __init__ imports high, which imports c
    ({"pkg/__init__.py": "", "pkg/c.py": "from .sub.low import y\n",
      "pkg/sub/__init__.py": "from .high import z\n", "pkg/sub/low.py": "y = 1\n",
      "pkg/sub/high.py": "from ..c import y as z\n"}, ["pkg.c", "pkg.sub", "pkg.sub.high", "pkg.c"]),
    # a type-only import counts too
    ({"pkg/__init__.py": "", "pkg/a.py": "import typing\nif typing.TYPE_CHECKING:\n    import pkg.b\n",
      "pkg/b.py": "from pkg import a\n"}, ["pkg.a", "pkg.b", "pkg.a"]),
    # no circle: siblings inside a package that re-exports them, an absolute import of an attribute
    ({"pkg/__init__.py": "from .sub import f\n", "pkg/sub/__init__.py": "from .one import f\n",
      "pkg/sub/one.py": "from .two import g\nf = g\n", "pkg/sub/two.py": "import pkg.base\ng = 1\n",
      "pkg/base.py": "import os.path\n", "pkg/user.py": "from pkg.sub.two import g\n"}, None),
])
def test_the_graph_finds_hidden_circles(tmp_path, files, cycle):
    assert find_cycle(import_graph(_write(tmp_path, files))) == cycle


def payload_modules(patchset_dir: Path) -> dict[str, Path]:
    """The patchset's whole new modules (``new_files``, every target) under the names they are
    installed as: ``sglang/srt/speculative/ddtree_tree.py`` is ``sglang.srt.speculative.ddtree_tree``."""
    from sglang_patcher.patchset import load_patchset

    ps = load_patchset(patchset_dir)
    return {dst[:-3].replace("/", "."): ps.root / src for version in ps.versions
            for dst, src in ps.target(version).new_files.items() if dst.endswith(".py")}


def imported_names(path: Path) -> set[str]:
    """Every module name an import statement in ``path`` names (relative ones with their dots)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
    return out


def test_ddtree_payload_has_no_import_circles_and_its_kernels_import_only_torch_and_triton():
    files = payload_modules(DDTREE_DIR)
    kernels = {m for m in files if m.startswith("sglang.kernels.ops.speculative.")}
    assert {"sglang.srt.speculative.ddtree_tree", "sglang.srt.speculative.ddtree_accept",
            "sglang.kernels.ops.speculative.ddtree_beam", "sglang.kernels.ops.speculative.ddtree_walk"} <= set(files)
    graph = import_graph_of(files)
    # the graph is really built: the function-local imports of the kernels count
    assert "sglang.kernels.ops.speculative.ddtree_beam" in graph["sglang.srt.speculative.ddtree_tree"]
    assert "sglang.kernels.ops.speculative.ddtree_walk" in graph["sglang.srt.speculative.ddtree_accept"]
    assert "sglang.kernels.ops.speculative.ddtree_keys" in graph["sglang.kernels.ops.speculative.ddtree_beam"]
    cycle = find_cycle({m: graph[m] & set(files) for m in files})
    assert cycle is None, "import circle: " + " -> ".join(cycle)
    for m in sorted(kernels):
        names = imported_names(files[m])
        siblings = {n for n in names if n.startswith(".")}
        assert {f"sglang.kernels.ops.speculative{n}" for n in siblings} <= kernels, (m, siblings)
        assert {n.split(".")[0] for n in names - siblings} <= {"__future__", "torch", "triton"}, (m, names)
