"""The source of a host-side script, as the launcher sends it: one module, or a package joined into one.

A script of :mod:`sglang_patcher.remote` is either one stdlib-only module (``probe.py``) or a package
(``deploy_agent/``) whose ``__init__.py`` holds the script's docstring and ``MODULES``, the order in
which its modules are joined. :func:`join` writes the one source the host runs: the docstring,
the ``from __future__`` imports and every standard-library import once, then each module's code
without its docstring and imports, under a banner naming the module. Each module imports what it
uses from the modules before it (``from .base import Fail``), so the package also imports as it
is, and in the joined script those names are simply defined further up.

Both kinds of script may also import from a *shared* module of ``remote/`` — ``from .access
import write_problem`` in ``probe.py``, ``from ..access import write_problem`` in a module of the
package — one stdlib-only module with no relative import of its own (``access.py``: what the
probe and the deploy agent both ask of a path): it is joined in ahead of the script's own code,
in the order first named, so one piece of code serves both scripts. A module that imports no
shared module is sent as it is (:func:`join_module`).

A script that could not be joined into a working one is refused with :class:`ValueError`: a
module left out of ``MODULES`` or named there but missing, a relative import of a module that does
not come earlier (nor is a shared module of ``remote/``), of a name that module does not define,
with ``as``, or inside a function, a shared module that imports relatively itself, two
statements on one line, a top-level name defined in two modules. The same files always give the
same bytes.
"""

from __future__ import annotations

import ast
from importlib import resources
from importlib.resources.abc import Traversable
from typing import NamedTuple

__all__ = ["script_source", "join", "join_module"]

_BANNER = "# " + "=" * 78


def script_source(script: str) -> bytes:
    """The source of the remote script ``script``: ``remote/<script>.py`` (:func:`join_module`), or
    the package ``remote/<script>/`` joined by :func:`join`."""
    base = resources.files(__package__)
    pkg = base.joinpath(script)
    if pkg.is_dir():
        return join(pkg).encode("utf-8")
    module = base.joinpath(f"{script}.py")
    src = join_module(module, base)
    return module.read_bytes() if src is None else src.encode("utf-8")


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


class _Unit(NamedTuple):
    """One module joined into a script: ``key`` its dotted name under ``remote/`` (``access``,
    ``deploy_agent.base``), ``where`` its path there, ``src`` its source."""

    key: str
    where: str
    src: str


def _relative_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    return [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.level]


def _resolve(key: str, node: ast.ImportFrom) -> str | None:
    """The key of the module a relative import in the module ``key`` names (None: beyond ``remote/``)."""
    package = key.split(".")[:-1]
    up = node.level - 1
    if not node.module or up > len(package):
        return None
    return ".".join(package[:len(package) - up] + [node.module])


def _shared_units(remote: Traversable | None, units: list[_Unit]) -> list[_Unit]:
    """The shared modules of ``remote/`` that ``units`` import, in the order first named."""
    own = {u.key for u in units}
    out: list[_Unit] = []
    for u in units:
        for node in _relative_imports(ast.parse(u.src, filename=u.where)):
            key = _resolve(u.key, node)
            if remote is None or key is None or key in own or "." in key or key in {s.key for s in out}:
                continue
            f = remote.joinpath(f"{key}.py")
            if not f.is_file():
                continue   # named by the join as a module that does not come earlier
            src = f.read_text(encoding="utf-8")
            if _relative_imports(ast.parse(src, filename=f"{key}.py")):
                raise ValueError(f"{key}.py: a shared module must not import relatively (it is joined into "
                                 f"{u.where.split('/')[0]} and other scripts as it is)")
            out.append(_Unit(key, f"{key}.py", src))
    return out


def join(pkg: Traversable, shared_from: Traversable | None = None) -> str:
    """One script from the package ``pkg`` (see the module docstring); the shared modules it
    imports (``from ..access import x``) come from ``shared_from`` (default: the directory holding
    ``pkg``). Raises ValueError when the package cannot be joined into a working script."""
    _init, head, order = _modules_order(pkg)
    units = [_Unit(f"{pkg.name}.{mod}", f"{pkg.name}/{mod}.py", pkg.joinpath(f"{mod}.py").read_text(encoding="utf-8"))
             for mod in order]
    remote = shared_from if shared_from is not None else getattr(pkg, "parent", None)
    return _join(head, _shared_units(remote, units) + units, f"the modules of sglang_patcher/remote/{pkg.name}/")


def join_module(module: Traversable, shared_from: Traversable | None = None) -> str | None:
    """One script from the single module ``module`` and the shared modules it imports (``from
    .access import x``; from ``shared_from``, default the directory holding it); None when it
    imports none (then it is sent as it is, byte for byte). Raises ValueError as :func:`join` does."""
    src = module.read_text(encoding="utf-8")
    tree = ast.parse(src, filename=module.name)
    if not _relative_imports(tree):
        return None
    doc = _docstring(tree)
    head = src.splitlines()[doc.lineno - 1:doc.end_lineno] if doc is not None else []
    unit = _Unit(module.name[:-3], module.name, src)
    remote = shared_from if shared_from is not None else getattr(module, "parent", None)
    return _join(head, _shared_units(remote, [unit]) + [unit], f"sglang_patcher/remote/{module.name}")


def _join(head: list[str], units: list[_Unit], what: str) -> str:
    future: set[str] = set()
    imports: set[str] = set()
    defined: dict[str, str] = {}  # module-level name → the key of the module that defines it
    where_of = {u.key: u.where for u in units}
    parts: list[str] = []
    for i, (key, where, src) in enumerate(units):
        mod = key.rsplit(".", 1)[-1]
        earlier = [u.key for u in units[:i]]
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
                source = _resolve(key, node)
                if source not in earlier:
                    raise ValueError(f"{where}:{node.lineno}: imports from {'.' * node.level}{node.module or ''}, "
                                     f"which is not a module joined before {mod} "
                                     f"({', '.join(k.rsplit('.', 1)[-1] for k in earlier)})")
                for a in node.names:
                    if a.asname is not None or defined.get(a.name) != source:
                        raise ValueError(f"{where}:{node.lineno}: {a.name} must be imported by its own name "
                                         f"from the module that defines it (not from {'.' * node.level}{node.module}"
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
                    if name in defined and defined[name] != key:
                        raise ValueError(f"{where}:{node.lineno}: {name} is defined in "
                                         f"{where_of[defined[name]].rsplit('/', 1)[-1]} too; joined into one script, "
                                         "one would replace the other")
                    defined[name] = key
        if drop & keep:
            raise ValueError(f"{where}:{min(drop & keep)}: one statement per line (an import shares its line)")
        body = "\n".join(line for n, line in enumerate(src.splitlines(), 1) if n not in drop).strip("\n")
        while "\n\n\n\n" in body:
            body = body.replace("\n\n\n\n", "\n\n\n")
        parts.append(f"{_BANNER}\n# {where}\n\n{body}\n")
    bound = {a.asname or a.name.split(".")[0] for s in imports for a in ast.parse(s).body[0].names}  # type: ignore[attr-defined]
    clash = sorted(bound & set(defined))
    if clash:
        raise ValueError(f"{units[-1].where.split('/')[0]}: "
                         f"{', '.join(f'{n} ({where_of[defined[n]]})' for n in clash)} would replace an "
                         "import of the same name in the joined script")
    plain = sorted(s for s in imports if s.startswith("import "))
    froms = sorted(s for s in imports if s.startswith("from "))
    out = head + [
        "",
        f"# One script joined from {what} by",
        "# sglang_patcher.remote.bundle, in this order (under sglang_patcher/remote/): edit those modules, not this.",
        f"# {', '.join(u.where for u in units)}",
        "", *sorted(future), "", *plain, *froms, "", ""]
    return "\n".join(out) + "\n\n\n".join(parts)
