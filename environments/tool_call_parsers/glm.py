"""GLM-4.5 / GLM-4.6 / GLM-4.7 calls: the name after the tag, then key/value pairs.

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

GLM-4.7 writes the same without the newlines. The templates write string values raw and
other values as JSON, so a value is JSON when it parses and the string otherwise (the
tool schema, when given, decides for strings such as `007`). Leniency: a missing
`</tool_call>` at the end of the text or before the next call. A stray `</tool_call>`
is reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from ._values import coerce_value
from ._core import (
    ParseIssue,
    ParseResult,
    TagBlocks,
    ToolCallParser,
    issue,
    join_content,
    make_call,
    valid_key,
    valid_name,
)
from ._registry import register_parser

__all__ = ["GlmSpec", "GlmParser", "GLM"]


@dataclass(frozen=True)
class GlmSpec:
    start: str = "<tool_call>"
    end: str = "</tool_call>"
    key: tuple[str, str] = ("<arg_key>", "</arg_key>")
    value: tuple[str, str] = ("<arg_value>", "</arg_value>")

    def pair_pattern(self) -> re.Pattern[str]:
        (ko, kc), (vo, vc) = self.key, self.value
        # The key cannot hold a tag (`[^<]`): a lazy `.*?` there would retry every later
        # </arg_key> when a value is unterminated (quadratic on broken text).
        return re.compile(rf"\s*{re.escape(ko)}([^<]*){re.escape(kc)}\s*{re.escape(vo)}(.*?){re.escape(vc)}", re.DOTALL)


GLM = GlmSpec()


# GLM-4.7 writes the 4.5 format without newlines; whitespace between tags is optional
# here, so one parser carries both names.
@register_parser("glm45", "glm47")
class GlmParser(ToolCallParser):
    spec: GlmSpec = GLM

    @property
    def stream_markers(self) -> tuple[str, ...]:  # type: ignore[override]  # per instance: built from its spec
        return (self.spec.start,)

    def __init__(self, tools=None) -> None:
        super().__init__(tools)
        self._pair = self.spec.pair_pattern()

    def _parse(self, text: str, schemas: Mapping[str, Mapping[str, Any]]) -> ParseResult:
        spec = self.spec
        pieces: list[str] = []
        calls: list[dict[str, Any]] = []
        errors: list[ParseIssue] = []
        copied = 0
        i = 0
        blocks = TagBlocks(text, spec.start, spec.end)
        while True:
            s = blocks.opens.find(i)
            e = blocks.closes.find(i)
            if e != -1 and (s == -1 or e < s):
                # No lenient reading of a body without its opening tag here: the name would
                # come before any tag, so a stream could not hold it back (see stream_markers).
                errors.append(issue(text, e, e + len(spec.end), f"{spec.end} without a tool call before it"))
                i = e + len(spec.end)
                continue
            if s == -1:
                break
            body_start = s + len(spec.start)
            body_end, block_end = blocks.extent(body_start)
            parsed = self._call(text, body_start, body_end, schemas)
            if (
                block_end == body_end
                and not isinstance(parsed, str)
                and not text[body_start:body_end].rstrip().endswith(spec.value[1])
            ):
                # Without its closing tag a call must end on a complete value: `<tool_call>get_wea`
                # is a truncated name, not a call to `get_wea`.
                parsed = f"unterminated tool call (no {spec.end})"
            if isinstance(parsed, str):
                errors.append(issue(text, s, block_end, parsed))
            else:
                pieces.append(text[copied:s])
                calls.append(make_call(*parsed))
                copied = block_end
            i = block_end
        pieces.append(text[copied:])
        return ParseResult(join_content(pieces), calls, errors)

    def _call(
        self, text: str, start: int, end: int, schemas: Mapping[str, Mapping[str, Any]]
    ) -> tuple[str, dict[str, Any]] | str:
        key_open, value_open = self.spec.key[0], self.spec.value[0]
        first = text.find(key_open, start, end)
        name = text[start : first if first != -1 else end].strip()
        if not name:
            return "tool call without a function name"
        if not valid_name(name):
            return f"invalid function name {name[:40]!r}"
        props = schemas.get(name, {})
        args: dict[str, Any] = {}
        pos = first if first != -1 else end
        while pos < end:
            m = self._pair.match(text, pos, end)
            if m is None:
                rest = text[pos:end].strip()
                if not rest:
                    break
                return f"malformed <arg_key>/<arg_value> pair in {name}: {rest[:30]!r}"
            key, value = m.group(1, 2)
            key = key.strip()
            if not valid_key(key):
                return f"invalid <arg_key> {key[:30]!r} in {name}"
            if key_open in key or key_open in value or value_open in key or value_open in value:
                # A damaged closing tag made the pair swallow the next one.
                return f"broken <arg_key>/<arg_value> tags in {name}"
            args[key] = coerce_value(value, props.get(key))
            pos = m.end()
        return name, args
