"""Conformance cases every parser family must pass (a mixin, one subclass per family).

A family's test class says which registered names it covers, how to write calls in the
family's markup (`render`), and what malformed markup looks like; the mixin supplies the
table: no calls, single, parallel, typed args, empty args, surrounding text, escapes,
malformed alone and beside a good call. `test_registry.py` checks that every registered
name is covered by some subclass.
"""

from __future__ import annotations

import json
import random
from typing import Any, ClassVar

from environments.tool_call_parsers import get_parser

Call = tuple[str, dict[str, Any]]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "configure",
            "description": "Typed arguments of every JSON kind.",
            "parameters": {
                "type": "object",
                "properties": {
                    "options": {"type": "object"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "flag": {"type": "boolean"},
                    "nothing": {"type": ["string", "null"]},
                    "count": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "label": {"type": "string"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "ping",
            "description": "No arguments.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]

WEATHER: Call = ("get_weather", {"city": "Paris", "unit": "celsius"})
TYPED: Call = (
    "configure",
    {
        "options": {"depth": 2, "inner": {"ok": True, "list": [1, 2.5, None, "x"]}},
        "tags": ["a", "b c"],
        "flag": False,
        "nothing": None,
        "count": 42,
        "ratio": -0.125,
        "label": "007",  # a string that looks like a number stays a string (schema says so)
    },
)
ESCAPES: Call = (
    "write_file",
    {
        "path": 'notes/it\'s "quoted".txt',
        "content": "line 1\nline 2\twith tab\nbackslash \\ and unicode: naïve café 日本語 🎉\n{\"json\": 'like'}",
    },
)
PING: Call = ("ping", {})


def calls_of(tool_calls: list[dict[str, Any]]) -> list[Call]:
    """(name, arguments) pairs, after checking each call has the OpenAI shape."""
    out = []
    for call in tool_calls:
        assert set(call) == {"id", "type", "function"}, call
        assert call["type"] == "function"
        assert isinstance(call["id"], str) and call["id"]
        fn = call["function"]
        assert set(fn) == {"name", "arguments"}, fn
        assert isinstance(fn["name"], str) and fn["name"]
        assert isinstance(fn["arguments"], str)
        args = json.loads(fn["arguments"])
        assert isinstance(args, dict), fn["arguments"]
        out.append((fn["name"], args))
    return out


class ParserConformance:
    names: ClassVar[tuple[str, ...]]  # registered names this class covers (first = canonical)
    malformed: ClassVar[tuple[str, ...]]  # markup that must give no call and an error
    trailing_text: ClassVar[bool] = True  # the format allows prose after the calls
    leading_text: ClassVar[bool] = True

    def render(self, calls: list[Call]) -> str:
        """The calls as the family's model writes them."""
        raise NotImplementedError

    # -- helpers ---------------------------------------------------------------------
    @property
    def parser(self):
        return get_parser(self.names[0], tools=TOOLS)

    def roundtrip(self, calls: list[Call], before: str = "", after: str = "") -> tuple[str | None, list[Call]]:
        text = before + self.render(calls) + after
        content, tool_calls = self.parser.parse(text)
        return content, calls_of(tool_calls)

    # -- the table -------------------------------------------------------------------
    def test_every_name_resolves_to_the_same_family(self):
        classes = {type(get_parser(n)) for n in self.names}
        assert len(classes) == 1, classes

    def test_no_calls(self):
        text = "Just an answer, with no tools. It has <tags> and {braces} and [brackets]."
        assert self.parser.parse(text) == (text, [])

    def test_empty_text(self):
        assert self.parser.parse("") == (None, [])
        assert self.parser.parse(None) == (None, [])

    def test_single(self):
        assert self.roundtrip([WEATHER]) == (None, [WEATHER])

    def test_parallel(self):
        calls = [WEATHER, ("get_weather", {"city": "Tokyo", "unit": "fahrenheit"}), PING]
        assert self.roundtrip(calls) == (None, calls)

    def test_typed_arguments(self):
        assert self.roundtrip([TYPED]) == (None, [TYPED])

    def test_empty_arguments(self):
        assert self.roundtrip([PING]) == (None, [PING])

    def test_escapes(self):
        assert self.roundtrip([ESCAPES]) == (None, [ESCAPES])

    def test_leading_text(self):
        if not self.leading_text:
            return
        before = "Let me check the weather first.\n\n"
        assert self.roundtrip([WEATHER], before=before) == (before.strip(), [WEATHER])

    def test_trailing_text(self):
        if not self.trailing_text:
            return
        after = "\n\nI will report back."
        assert self.roundtrip([WEATHER], after=after) == (after.strip(), [WEATHER])

    def test_ids_are_unique(self):
        _, tool_calls = self.parser.parse(self.render([WEATHER, WEATHER, PING]))
        assert len({c["id"] for c in tool_calls}) == 3

    def test_malformed_is_reported_and_kept_as_content(self):
        for text in self.malformed:
            result = self.parser.parse_detailed(text)
            assert result.tool_calls == [], text
            assert result.errors, f"no error reported for {text!r}"
            assert all("internal" not in e.reason for e in result.errors), result.errors
            assert result.content and result.content.strip(), text

    def test_malformed_beside_a_good_call(self):
        for bad in self.malformed:
            text = self.render([WEATHER]) + "\n" + bad
            result = self.parser.parse_detailed(text)
            assert calls_of(result.tool_calls) == [WEATHER], (text, result)
            assert result.errors, text

    def test_parse_agrees_with_parse_detailed(self):
        text = "Sure.\n" + self.render([WEATHER, TYPED])
        detailed = self.parser.parse_detailed(text)
        content, tool_calls = self.parser.parse(text)
        assert content == detailed.content
        assert calls_of(tool_calls) == calls_of(detailed.tool_calls)

    def test_streaming_equals_full(self):
        rng = random.Random(0)
        texts = [
            "Plain answer, no tools.",
            self.render([WEATHER]),
            "Let me check.\n\n" + self.render([WEATHER, TYPED, ESCAPES]),
            self.render([PING]) + "\n\nDone." if self.trailing_text else self.render([PING]),
            *self.malformed,
        ]
        for text in texts:
            for sizes in ([1], [3, 7], [len(text)]):
                stream = self.parser.stream()
                shown, pos = "", 0
                while pos < len(text):
                    step = rng.choice(sizes)
                    shown += stream.feed(text[pos : pos + step])
                    pos += step
                result = stream.finish()
                full = self.parser.parse_detailed(text)
                assert (result.content, calls_of(result.tool_calls)) == (full.content, calls_of(full.tool_calls))
                assert shown == stream.shown
                assert (full.content or "").startswith(shown), (text, shown)

    def test_streaming_shows_text_before_the_first_call(self):
        if type(self.parser).stream_markers is None:
            return  # this family holds everything until finish() (see its stream_markers)
        stream = self.parser.stream()
        assert stream.feed("Let me check the weather.\n") == "Let me check the weather."
        markup = self.render([WEATHER])
        assert stream.feed(markup[:-3]) == ""
        stream.feed(markup[-3:])
        assert calls_of(stream.finish().tool_calls) == [WEATHER]
