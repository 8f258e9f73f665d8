"""hermes / qwen (2.5, hermes format) and longcat: JSON objects between tags."""

from __future__ import annotations

import pytest

from environments.tool_call_parsers import get_parser

from environments.tool_call_parsers import testing as writers
from ._conformance import PING, WEATHER, Call, ParserConformance, calls_of


class TestHermes(ParserConformance):
    names = ("hermes", "qwen", "qwen25")
    malformed = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>',
        "<tool_call>\nnot json at all\n</tool_call>",
        '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>',
        "<tool_call>\n</tool_call>",
    )

    def render(self, calls: list[Call]) -> str:
        return writers.hermes(calls)


class TestLongcat(ParserConformance):
    names = ("longcat",)
    malformed = ('<longcat_tool_call>{"name": </longcat_tool_call>',)

    def render(self, calls: list[Call]) -> str:
        return writers.longcat(calls)


class TestLongcatKeyValueLayout(ParserConformance):
    # LongCat-Flash-Lite / LongCat 2.0 write the GLM layout; same parser name.
    names = ("longcat",)
    malformed = (
        "<longcat_tool_call>get_weather\n<longcat_arg_key>city</longcat_arg_key>\n<longcat_arg_value>Paris</longcat_tool_call>",
        "<longcat_tool_call>get weather now</longcat_tool_call>",
    )

    def render(self, calls: list[Call]) -> str:
        return writers.longcat_xml(calls)


WEATHER_JSON = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'

# What real models write besides the textbook format (text, expected content, expected calls).
QUIRKS = {
    "smollm2 single line": (f"<tool_call>{WEATHER_JSON}</tool_call>", None, [WEATHER]),
    "missing closing tag at the end": (f"On it.\n<tool_call>\n{WEATHER_JSON}\n", "On it.", [WEATHER]),
    "missing closing tag before the next call": (
        f'<tool_call>{WEATHER_JSON}\n<tool_call>{{"name": "ping", "arguments": {{}}}}</tool_call>',
        None,
        [WEATHER, PING],
    ),
    "code fenced body": (f"<tool_call>\n```json\n{WEATHER_JSON}\n```\n</tool_call>", None, [WEATHER]),
    "missing opening tag": (f"{WEATHER_JSON}\n</tool_call>", None, [WEATHER]),
    "missing opening tag after prose": (f"Checking. {WEATHER_JSON}</tool_call>", "Checking.", [WEATHER]),
    "parameters instead of arguments": (
        '<tool_call>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}</tool_call>',
        None,
        [WEATHER],
    ),
    "arguments encoded twice": (
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}"}</tool_call>',
        None,
        [WEATHER],
    ),
    "no arguments key": ('<tool_call>{"name": "ping"}</tool_call>', None, [PING]),
    "a list of calls in one block": (
        f'<tool_call>[{WEATHER_JSON}, {{"name": "ping"}}]</tool_call>',
        None,
        [WEATHER, PING],
    ),
    "openai wire shape": (
        '<tool_call>{"type": "function", "function": {"name": "ping", "arguments": "{}"}}</tool_call>',
        None,
        [PING],
    ),
    "closing tag inside an argument": (
        '<tool_call>{"name": "write_file", "arguments": {"path": "a.md", "content": "see </tool_call>"}}</tool_call>',
        None,
        [("write_file", {"path": "a.md", "content": "see </tool_call>"})],
    ),
    "python dict literal": (
        "<tool_call>{'name': 'configure', 'arguments': {'flag': True, 'nothing': None, 'tags': ('a',)}}</tool_call>",
        None,
        [("configure", {"flag": True, "nothing": None, "tags": ["a"]})],
    ),
    "python literal that is not JSON stays text": (
        "<tool_call>{'name': 'f', 'arguments': {1: 2}}</tool_call>",
        "<tool_call>{'name': 'f', 'arguments': {1: 2}}</tool_call>",
        [],
    ),
    "stray closing tag stays text": ("done </tool_call>", "done </tool_call>", []),
    "think block stays content": (
        f"<think>hmm</think>\n<tool_call>{WEATHER_JSON}</tool_call>",
        "<think>hmm</think>",
        [WEATHER],
    ),
}


@pytest.mark.parametrize("text, content, calls", QUIRKS.values(), ids=list(QUIRKS))
def test_hermes_quirks(text, content, calls):
    got_content, tool_calls = get_parser("hermes").parse(text)
    assert (got_content, calls_of(tool_calls)) == (content, calls)


def test_stray_closing_tag_is_reported():
    result = get_parser("hermes").parse_detailed("done </tool_call>")
    assert [e.reason for e in result.errors] == ["</tool_call> without a tool call before it"]


def test_invalid_json_error_says_where():
    result = get_parser("hermes").parse_detailed('<tool_call>{"name": "f", "arguments": {"a": }}</tool_call>')
    assert result.tool_calls == []
    (err,) = result.errors
    assert err.reason.startswith("invalid JSON") and err.start == 0
    assert "<tool_call>" in str(err)
