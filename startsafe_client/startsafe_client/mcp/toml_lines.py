"""Where each key of a TOML file stands: the line numbers ``tomllib`` does not give.

``tomllib`` reports a syntax error with its line, but a file that parses can still
be wrong (a string where a number belongs, a key no table has). To say *where*,
:func:`key_lines` maps every key path to the line it is written on, so an error
about ``("tools", "mail.send_reply", "key_source")`` names that line.

Each key text is read by ``tomllib`` itself (``tomllib.loads(f"{key} = 0")``), so
quoted and dotted keys are understood exactly as the parser does. The scanner only
finds where statements start: it skips multi-line strings and the lines of a
multi-line array or inline table, and comments.
"""

from __future__ import annotations

import tomllib
from typing import Any

KeyPath = tuple[str, ...]


def key_lines(text: str) -> dict[KeyPath, int]:
    """Every table header and key of a TOML document, with its 1-based line.

    A key of an inline table (``env = { A = "x" }``) is not listed on its own: its
    path falls back to the longest listed prefix (:func:`line_of`).
    """
    lines: dict[KeyPath, int] = {}
    table: KeyPath = ()
    scanner = _ValueScanner()
    for number, line in enumerate(text.splitlines(), start=1):
        if scanner.inside:  # a multi-line string or array goes on
            scanner.scan(line)
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("["):
            header = _header(stripped)
            if header is not None:
                table = header
                lines.setdefault(table, number)
            continue
        split = _split_key(stripped)
        if split is None:
            continue
        key, value = split
        path = _parse_key(key)
        if path is not None:
            lines.setdefault(table + path, number)
        scanner.scan(value)
    return lines


def line_of(lines: dict[KeyPath, int], path: tuple[Any, ...]) -> int | None:
    """The line of ``path``, or of its longest prefix that has one (``None``: none has)."""
    keys = tuple(str(part) for part in path)
    for end in range(len(keys), 0, -1):
        if keys[:end] in lines:
            return lines[keys[:end]]
    return None


def _header(stripped: str) -> KeyPath | None:
    """The key path of ``[a."b.c"]`` or ``[[a]]`` (``None`` when it does not parse)."""
    double = stripped.startswith("[[")
    close = _outside_quotes(stripped, "]]" if double else "]")
    if close is None:
        return None
    inner = stripped[2 if double else 1 : close]
    return _parse_key(inner)


def _split_key(stripped: str) -> tuple[str, str] | None:
    """``key = value`` → ``(key, value)``, the ``=`` found outside quoted key parts."""
    at = _outside_quotes(stripped, "=")
    if at is None:
        return None
    return stripped[:at], stripped[at + 1 :]


def _parse_key(key: str) -> KeyPath | None:
    """A key (bare, quoted or dotted) as ``tomllib`` reads it."""
    try:
        parsed: Any = tomllib.loads(f"{key.strip()} = 0")
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    while isinstance(parsed, dict) and len(parsed) == 1:
        name, parsed = next(iter(parsed.items()))
        path.append(name)
    return tuple(path) if path else None


def _outside_quotes(text: str, token: str) -> int | None:
    """The index of ``token`` in ``text`` outside ``"..."`` and ``'...'``."""
    quote: str | None = None
    index = 0
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\" and quote == '"':
                index += 2
                continue
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif text.startswith(token, index):
            return index
        index += 1
    return None


class _ValueScanner:
    """Follows a value across lines: inside a multi-line string, or an open ``[`` / ``{``."""

    def __init__(self) -> None:
        self.depth = 0  # open brackets and braces
        self.multiline: str | None = None  # '"""' or "'''" while inside one

    @property
    def inside(self) -> bool:
        return self.depth > 0 or self.multiline is not None

    def scan(self, text: str) -> None:
        index = 0
        while index < len(text):
            if self.multiline is not None:
                end = text.find(self.multiline, index)
                if end < 0:
                    return
                index = end + 3
                self.multiline = None
                continue
            char = text[index]
            if text.startswith('"""', index) or text.startswith("'''", index):
                self.multiline = text[index : index + 3]
                index += 3
            elif char in "\"'":
                index = self._end_of_string(text, index)
            elif char == "#":
                return
            else:
                if char in "[{":
                    self.depth += 1
                elif char in "]}":
                    self.depth = max(0, self.depth - 1)
                index += 1

    @staticmethod
    def _end_of_string(text: str, start: int) -> int:
        quote = text[start]
        index = start + 1
        while index < len(text):
            if text[index] == "\\" and quote == '"':
                index += 2
                continue
            if text[index] == quote:
                return index + 1
            index += 1
        return index
