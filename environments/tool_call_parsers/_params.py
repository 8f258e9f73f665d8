"""Tagged parameters inside one call (`<parameter=k>v</parameter>`, DSML's `<parameter name="k" ...>`).

Qwen3-Coder and DeepSeek-V3.2 write a call's arguments as a run of open tag, raw value, close tag;
the families differ in the tags, in how a value is typed and in their messages, not in the reading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ._core import valid_key


class ParamError(Exception):
    """A value its family cannot read; the message becomes the call's parse error."""


@dataclass(frozen=True, slots=True)
class ParamTags:
    open: re.Pattern[str]  # group 1: the parameter's name
    close: str
    where: str  # "... inside {where}", formatted with name=
    label: str  # how a parameter is named in messages, formatted with key=
    # A value holding this text swallowed the next parameter (a damaged close tag); None: a value
    # holding a whole open tag did.
    next_open: str | None
    # (open match, call name, key, raw value, the key's JSON schema or None) -> the value; or ParamError
    value: Callable[[re.Match[str], str, str, str, Any], Any]


def read_params(
    tags: ParamTags, text: str, pos: int, end: int, name: str, props: Mapping[str, Any]
) -> tuple[dict[str, Any], int] | str:
    """The parameters of call `name` from `pos` up to `end`: (arguments, where the last one ends), or
    why they cannot be read. `props`: the tool's parameter schemas by name (typing the values)."""
    args: dict[str, Any] = {}
    search, close_tag, next_open, value = tags.open.search, tags.close, tags.next_open, tags.value
    while (m := search(text, pos, end)) is not None:
        if text[pos : m.start()].strip():
            return f"unexpected text inside {tags.where.format(name=name)}: {text[pos : m.start()].strip()[:30]!r}"
        key = m.group(1).strip()
        if not valid_key(key):
            return f"invalid parameter name {key[:30]!r} in {name}"
        close = text.find(close_tag, m.end(), end)
        if close == -1:
            return f"unterminated {tags.label.format(key=key)} in {name}"
        raw = text[m.end() : close]
        if search(raw) if next_open is None else next_open in raw:
            return f"unterminated {tags.label.format(key=key)} in {name}"
        try:
            args[key] = value(m, name, key, raw, props.get(key))
        except ParamError as exc:
            return str(exc)
        pos = close + len(close_tag)
    return args, pos
