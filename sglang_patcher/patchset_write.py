"""Writing ``patchset.yaml``: re-pin a target's hashes (``refresh_hashes``) and add a whole target
(``add_target``), editing the YAML text in place so that comments and every other key are kept.

Each write goes to a temporary file renamed over ``patchset.yaml``, and is read back first: what
the file says after the edit must be exactly what was meant, else nothing is written (ConfigError).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .manifest import sha256_bytes
from .patchset import Reader, _load_dir

__all__ = ["refresh_hashes", "add_target"]


def _end(node: Any) -> int:
    """Character index just after the last token of ``node`` (block nodes end at their last child)."""
    if isinstance(node, yaml.ScalarNode) or getattr(node, "flow_style", False) or not node.value:
        return node.end_mark.index
    last = node.value[-1]
    return _end(last[1] if isinstance(node, yaml.MappingNode) else last)


def _scalar(value: str | None) -> str:
    """``value`` as a YAML scalar: plain when it reads back as the same string, else double-quoted."""
    if value is None:
        return "null"
    if re.match(r"^[A-Za-z0-9_./-]+$", value):
        try:
            if yaml.safe_load(f"k: {value}") == {"k": value}:
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value)


def _render_map(key: str, indent: int, mapping: dict[str, str | None]) -> str:
    if not mapping:
        return f"{key}: {{}}"
    pad = " " * (indent + 2)
    rows = [f"{pad}{_scalar(p)}: {_scalar(h)}" for p, h in sorted(mapping.items())]
    return f"{key}:\n" + "\n".join(rows)


def _rewrite(text: str, version: str, maps: dict[str, dict[str, str | None]]) -> str:
    for key, mapping in maps.items():          # one edit per pass: indices shift after each
        root = yaml.compose(text)
        targets = next(v for k, v in root.value if k.value == "targets")
        tnode = next(v for k, v in targets.value if str(k.value) == version)
        if tnode.flow_style:
            raise ConfigError(f"targets.{version} is written in flow style ({{...}}); write it as a block mapping "
                              "so refresh can rewrite its hashes")
        indent = tnode.value[0][0].start_mark.column
        found = [(k, v) for k, v in tnode.value if k.value == key]
        block = _render_map(key, indent, mapping)
        if found:
            k, v = found[0]
            text = text[:k.start_mark.index] + block + text[_end(v):]
        else:
            pos = _end(tnode)
            text = text[:pos] + "\n" + " " * indent + block + text[pos:]
    return text


def refresh_hashes(patchset_dir: str | os.PathLike, version: str, read: Reader) -> dict[str, dict[str, str | None]]:
    """Recompute ``pristine`` and ``expected`` for ``version`` and rewrite them in ``patchset.yaml``.

    A maintainer step after changing the series or modules. ``read`` serves the pristine release tree
    (e.g. ``wheelcache.pristine_tree(version).read``). Only the two mappings of that target are
    rewritten; comments and everything else are kept. The series must still apply strictly
    (:class:`ApplyError` otherwise). Returns ``{"pristine": {...}, "expected": {...},
    "already_applied": [...]}``, the last naming each hunk (``patch: path hunk N @@ ... @@``) or new
    file that the release already carries: merged upstream, to drop from the series of that release.
    """
    root = Path(patchset_dir)
    ps = _load_dir(root, origin=str(root))
    result = ps.render(version, read, check_hashes=False)
    pristine = {p: None if c.old is None else sha256_bytes(c.old) for p, c in result.files.items()}
    expected = {p: None if c.new is None else sha256_bytes(c.new) for p, c in result.files.items()}
    text = ps.yaml_path.read_text(encoding="utf-8")
    new_text = _rewrite(text, version, {"pristine": pristine, "expected": expected})
    check = yaml.safe_load(new_text)
    if (check["targets"][version].get("pristine") or {}) != pristine or \
            (check["targets"][version].get("expected") or {}) != expected:
        raise ConfigError(f"{ps.yaml_path}: could not rewrite the hashes safely; edit them by hand",
                          hint=json.dumps({"pristine": pristine, "expected": expected}, indent=1))
    tmp = ps.yaml_path.with_name(ps.yaml_path.name + ".tmp")
    tmp.write_text(new_text, encoding="utf-8")
    tmp.replace(ps.yaml_path)
    _load_dir(root, origin=str(root)).render(version, read)   # the refreshed manifest must check out
    merged = [f"{h.patch}: {h.path}" + (f" hunk {h.index} {h.header}" if h.index else f" ({h.header})")
              for h in result.hunks if h.status == "already_applied"]
    return {"pristine": pristine, "expected": expected, "already_applied": merged}


def _target_block(version: str, key_indent: int, inner: int, series: list[str], new_files: dict[str, str],
                  comment: str | None, left_out: list[str]) -> str:
    pad, item = " " * inner, " " * (inner + 2)
    rows = [" " * key_indent + json.dumps(version) + ":" + (f"  # {comment}" if comment else "")]
    rows.append(pad + "series:" + ("" if series else " []"))
    rows += [f"{item}- {_scalar(s)}" for s in series]
    rows.append(pad + "new_files:" + ("" if new_files else " {}"))
    rows += [f"{item}{_scalar(d)}: {_scalar(s)}" for d, s in sorted(new_files.items())]
    if left_out:
        rows.append(pad + "left_out:  # apply refuses this target until these are made by hand and this list deleted")
        rows += [f"{item}- {json.dumps(c)}" for c in left_out]
    return "\n".join(rows)


def add_target(patchset_dir: str | os.PathLike, version: str, series: list[str], new_files: dict[str, str],
               read: Reader, *, comment: str | None = None,
               left_out: list[str] | None = None) -> dict[str, dict[str, str | None]]:
    """Add the target ``version`` (its ``series`` and ``new_files``, both relative to the patchset) to
    ``patchset.yaml`` after the last target, then pin it with :func:`refresh_hashes` from ``read``
    (the release's pristine tree). ``comment`` goes on the target's key line; ``left_out`` (a partial
    port's changes that did not carry) becomes the target's ``left_out`` list. Comments and every
    other key are kept. Refuses a version the patchset already targets (:class:`ConfigError`);
    when pinning fails (the series does not apply to ``read``'s tree) ``patchset.yaml`` is put back
    as it was and the error raised. Returns what :func:`refresh_hashes` returns."""
    root = Path(patchset_dir)
    ps = _load_dir(root, origin=str(root))
    if version in ps.spec.targets:
        raise ConfigError(f"{ps.yaml_path}: patchset {ps.name} already has a target {version}",
                          hint=f"remove targets.{version} (and its series) first to make it again")
    text = ps.yaml_path.read_text(encoding="utf-8")
    node = yaml.compose(text)
    targets = next(v for k, v in node.value if k.value == "targets")
    if targets.flow_style:
        raise ConfigError(f"{ps.yaml_path}: targets is written in flow style ({{...}}); write it as a block "
                          "mapping so a target can be added")
    last_key, last_value = targets.value[-1]
    key_indent = last_key.start_mark.column
    inner = (last_value.value[0][0].start_mark.column
             if isinstance(last_value, yaml.MappingNode) and last_value.value and not last_value.flow_style
             else key_indent + 2)
    pos = _end(last_value)
    left = list(left_out or [])
    new_text = (text[:pos] + "\n" + _target_block(version, key_indent, inner, series, new_files, comment, left)
                + text[pos:])
    check = yaml.safe_load(new_text)["targets"].get(version) or {}
    if (check.get("series") or []) != list(series) or (check.get("new_files") or {}) != dict(new_files) \
            or (check.get("left_out") or []) != left:
        raise ConfigError(f"{ps.yaml_path}: could not add target {version} safely; add it by hand",
                          hint=json.dumps({"series": list(series), "new_files": dict(new_files)}, indent=1))
    tmp = ps.yaml_path.with_name(ps.yaml_path.name + ".tmp")
    tmp.write_text(new_text, encoding="utf-8")
    tmp.replace(ps.yaml_path)
    try:
        return refresh_hashes(root, version, read)
    except BaseException:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(ps.yaml_path)
        raise
