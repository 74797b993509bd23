"""Write one value into ``hosts.yaml`` keeping everything else — comments, order, quoting — as the
user wrote it (ruamel.yaml's round trip), atomically (temp file beside it, then rename).

Used by ``sglpatch bench --sweep`` to store the budget schedule it chose in the host's profile.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml as pyyaml   # the inventory's reader (YAML 1.1)
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from .errors import InventoryError
from .inventory import load_inventory


def _read_back(text: str) -> object:
    """What the inventory's reader (PyYAML, YAML 1.1) makes of ``text`` written as a plain scalar."""
    try:
        return pyyaml.safe_load(text)
    except pyyaml.YAMLError:
        return None


def set_host_value(path: Path, host: str, keys: list[str], value: Any) -> None:
    """Set ``hosts.<host>.<keys...>`` to ``value`` in the inventory file ``path``.

    Missing intermediate mappings are created. The result is validated as an inventory before it
    replaces the file. Raises InventoryError (no such host, a key path through a non-mapping, or
    a result that does not validate: the file is left untouched).
    """
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096            # never re-wrap the user's long lines
    text = path.read_text(encoding="utf-8")
    doc = yaml.load(text)
    hosts = doc.get("hosts") if isinstance(doc, dict) else None
    if not isinstance(hosts, dict) or host not in hosts:
        raise InventoryError(f"{path}: no host {host!r} to write into",
                             hint="the value is written into the inventory the host came from")
    node = hosts[host]
    for k in keys[:-1]:
        if node.get(k) is None:
            node[k] = CommentedMap()
        node = node[k]
        if not isinstance(node, dict):
            raise InventoryError(f"{path}: hosts.{host}.{k} is not a mapping; cannot set {'.'.join(keys)}")
    if isinstance(value, str) and _read_back(value) != value:
        # ruamel writes YAML 1.2; the inventory is read as YAML 1.1 (PyYAML), where a plain 1:8 is
        # the sexagesimal number 68: a string that would not read back as itself is quoted
        value = DoubleQuotedScalarString(value)
    node[keys[-1]] = value
    out = io.StringIO()
    yaml.dump(doc, out)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(out.getvalue())
        load_inventory(Path(tmp))          # refuse to write what would not load
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
