"""JSON Lines text, split into records at "\\n" only.

`str.splitlines()` also splits at \\r, \\v, \\f, \\x1c-\\x1e, \\x85, U+2028 and U+2029, which JSON
written with `ensure_ascii=False` leaves raw inside strings: one model answer holding such a
character would cut its record in two.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

__all__ = ["jsonl_lines", "jsonl_rows"]


def jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) for every non-blank line of a JSONL text."""
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            yield n, line


def jsonl_rows(text: str, source: object) -> list[Any]:
    """Every record of a JSONL text; a line that is not JSON is a ValueError naming `source`:line."""
    rows = []
    for n, line in jsonl_lines(text):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}:{n} is not JSON ({exc.msg})") from None
    return rows
