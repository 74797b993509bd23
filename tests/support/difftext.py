"""Helpers shared by the applier tests: files as difflib lines (independent of the applier)."""

NO_NL = "\\ No newline at end of file\n"


def lines_of(data: bytes) -> list[str]:
    """``data`` as difflib input lines: each keeps its newline; a last line without one stays bare."""
    if not data:
        return []
    parts = data.decode("utf-8", "surrogateescape").split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out
