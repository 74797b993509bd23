"""The source of a host-side script, as the launcher sends it: one module, or a package joined into one.

A script of :mod:`sglang_patcher.remote` is either one stdlib-only module (``probe.py``) or a package
(``deploy_agent/``) whose ``__init__.py`` holds the script's docstring and ``MODULES``, the order in
which its modules are joined. :func:`join` writes the one source the host runs: the docstring,
the ``from __future__`` imports and every standard-library import once, then each module's code
without its docstring and imports, under a banner naming the module. Each module imports what it
uses from the modules before it (``from .base import Fail``), so the package also imports as it
is, and in the joined script those names are simply defined further up.

A package that could not be joined into a working script is refused with :class:`ValueError`: a
module left out of ``MODULES`` or named there but missing, a relative import of a module that does
not come earlier, of a name that module does not define, with ``as``, or inside a function, two
statements on one line, a top-level name defined in two modules. The same files always give the
same bytes.
"""

from __future__ import annotations

import ast
from importlib import resources
from importlib.resources.abc import Traversable

__all__ = ["script_source", "join"]

_BANNER = "# " + "=" * 78


def script_source(script: str) -> bytes:
    """The source of the remote script ``script``: ``remote/<script>.py`` as it is, or the package
    ``remote/<script>/`` joined by :func:`join`."""
    base = resources.files(__package__)
    pkg = base.joinpath(script)
    if pkg.is_dir():
        return join(pkg).encode("utf-8")
    return base.joinpath(f"{script}.py").read_bytes()


def _docstring(tree: ast.Module) -> ast.Expr | None:
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def _lines(node: ast.stmt) -> range:
    return range(node.lineno, (node.end_lineno or node.lineno) + 1)


def _names_defined(node: ast.stmt) -> list[str]:
    """The module-level names a top-level statement binds (functions, classes, assignments)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    out = []
    for t in targets:
        out += [n.id for n in ast.walk(t) if isinstance(n, ast.Name)]
    return out


def _modules_order(pkg: Traversable) -> tuple[str, list[str], tuple[str, ...]]:
    """``(__init__ source, its docstring's lines, MODULES)`` of the package ``pkg``."""
    init_src = pkg.joinpath("__init__.py").read_text(encoding="utf-8")
    init = ast.parse(init_src)
    order = None
    for node in init.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MODULES" for t in node.targets):
            order = ast.literal_eval(node.value)
    if not isinstance(order, tuple) or not all(isinstance(m, str) for m in order):
        raise ValueError(f"{pkg.name}/__init__.py: MODULES must be a tuple of module names (the join order)")
    doc = _docstring(init)
    head = init_src.splitlines()[doc.lineno - 1:doc.end_lineno] if doc is not None else []
    present = sorted(e.name[:-3] for e in pkg.iterdir() if e.name.endswith(".py") and e.name != "__init__.py")
    if sorted(order) != present:
        raise ValueError(f"{pkg.name}: MODULES {list(order)} must name each of its modules once: {present}")
    return init_src, head, order


def join(pkg: Traversable) -> str:
    """One script from the package ``pkg`` (see the module docstring). Raises ValueError when the
    package cannot be joined into a working script."""
    _init, head, order = _modules_order(pkg)
    future: set[str] = set()
    imports: set[str] = set()
    defined: dict[str, str] = {}  # module-level name → the module that defines it
    parts: list[str] = []
    for i, mod in enumerate(order):
        where = f"{pkg.name}/{mod}.py"
        src = pkg.joinpath(f"{mod}.py").read_text(encoding="utf-8")
        tree = ast.parse(src, filename=where)
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and id(node) not in top:
                raise ValueError(f"{where}:{node.lineno}: a relative import must be at module level")
        drop: set[int] = set()
        keep: set[int] = set()
        doc = _docstring(tree)
        for node in tree.body:
            if node is doc:
                drop.update(_lines(node))
            elif isinstance(node, ast.ImportFrom) and node.level:
                if node.level != 1 or node.module not in order[:i]:
                    raise ValueError(f"{where}:{node.lineno}: imports from {'.' * node.level}{node.module or ''}, "
                                     f"which is not a module joined before {mod} ({', '.join(order[:i])})")
                for a in node.names:
                    if a.asname is not None or defined.get(a.name) != node.module:
                        raise ValueError(f"{where}:{node.lineno}: {a.name} must be imported by its own name "
                                         f"from the module that defines it (not from .{node.module}"
                                         f"{' as ' + a.asname if a.asname else ''})")
                drop.update(_lines(node))
            elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
                future.add(ast.unparse(node))
                drop.update(_lines(node))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.add(ast.unparse(node))
                drop.update(_lines(node))
            else:
                keep.update(_lines(node))
                for name in _names_defined(node):
                    if name in defined and defined[name] != mod:
                        raise ValueError(f"{where}:{node.lineno}: {name} is defined in {defined[name]}.py too; "
                                         "joined into one script, one would replace the other")
                    defined[name] = mod
        if drop & keep:
            raise ValueError(f"{where}:{min(drop & keep)}: one statement per line (an import shares its line)")
        body = "\n".join(line for n, line in enumerate(src.splitlines(), 1) if n not in drop).strip("\n")
        while "\n\n\n\n" in body:
            body = body.replace("\n\n\n\n", "\n\n\n")
        parts.append(f"{_BANNER}\n# {where}\n\n{body}\n")
    bound = {a.asname or a.name.split(".")[0] for s in imports for a in ast.parse(s).body[0].names}  # type: ignore[attr-defined]
    clash = sorted(bound & set(defined))
    if clash:
        raise ValueError(f"{pkg.name}: {', '.join(f'{n} ({defined[n]}.py)' for n in clash)} would replace an "
                         "import of the same name in the joined script")
    plain = sorted(s for s in imports if s.startswith("import "))
    froms = sorted(s for s in imports if s.startswith("from "))
    out = head + [
        "",
        f"# One script joined from the modules of sglang_patcher/remote/{pkg.name}/ by",
        "# sglang_patcher.remote.bundle.join, in this order: edit those modules, not this.",
        f"# {', '.join(order)}",
        "", *sorted(future), "", *plain, *froms, "", ""]
    return "\n".join(out) + "\n\n\n".join(parts)
