"""``compile``: the L0 smoke check — ``py_compile`` of each touched file with the host's own
interpreter, the bytecode written to a temp dir (never ``__pycache__``)."""

from __future__ import annotations

import os
import py_compile
import sys
import tempfile

from .host import HostState


def op_compile(a):
    h = HostState(a)
    results = {}
    with tempfile.TemporaryDirectory(prefix="sglpatch-pyc-") as tmpd:
        for i, rel in enumerate(a.get("paths", [])):
            t = h.target(rel)
            if not os.path.exists(t):
                results[rel] = {"status": "failed", "detail": "missing"}
                continue
            try:
                py_compile.compile(t, cfile=os.path.join(tmpd, "%d.pyc" % i), doraise=True)
                results[rel] = {"status": "passed", "detail": ""}
            except py_compile.PyCompileError as exc:
                results[rel] = {"status": "failed", "detail": exc.msg.strip()}
    return {"results": results, "python": sys.version.split()[0], "executable": sys.executable}
