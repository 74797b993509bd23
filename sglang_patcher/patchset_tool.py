"""Maintainer commands for patchsets (not part of the user CLI).

``python -m sglang_patcher.patchset_tool refresh DIR VERSION [--tree DIR]`` recomputes the
``pristine``/``expected`` hashes of one target in ``DIR/patchset.yaml`` (from the PyPI wheel of
VERSION unless ``--tree`` names a site-packages-like directory) and rewrites only those mappings.

``python -m sglang_patcher.patchset_tool tree VERSION`` prints the directory of the verified pristine
tree of VERSION (downloaded once), to make series against: ``diff -u`` or ``git diff --no-index``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import SglpatchError
from .patchset import _YAML, refresh_hashes


def main(argv: list[str] | None = None) -> int:
    """Maintainer commands: ``refresh DIR VERSION [--tree DIR]`` and ``tree VERSION``."""
    ap = argparse.ArgumentParser(prog="python -m sglang_patcher.patchset_tool")
    sub = ap.add_subparsers(dest="cmd", required=True)
    rf = sub.add_parser("refresh", help="recompute pristine/expected hashes of one target in patchset.yaml")
    rf.add_argument("patchset_dir")
    rf.add_argument("version")
    rf.add_argument("--tree", help="a site-packages-like directory to read pristine files from "
                                   "(default: the PyPI wheel of VERSION, cached)")
    tr = sub.add_parser("tree", help="print the directory of the verified pristine tree of VERSION (PyPI wheel)")
    tr.add_argument("version")
    args = ap.parse_args(argv)
    if args.cmd == "tree":
        from .wheelcache import pristine_tree
        print(pristine_tree(args.version).tree)
        return 0
    if args.tree:
        base = Path(args.tree)

        def read(p: str) -> bytes | None:
            f = base / p
            return f.read_bytes() if f.is_file() else None
    else:
        from .wheelcache import pristine_tree
        read = pristine_tree(args.version).read
    maps = refresh_hashes(args.patchset_dir, args.version, read)
    print(f"refreshed {len(maps['expected'])} file hashes for sglang {args.version} in "
          f"{Path(args.patchset_dir) / _YAML}")
    return 0


if __name__ == "__main__":     # pragma: no cover
    try:
        sys.exit(main())
    except Exception as exc:   # noqa: BLE001 - the maintainer sees the message, not a traceback
        if isinstance(exc, SglpatchError):
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(exc.exit_code)
        raise
