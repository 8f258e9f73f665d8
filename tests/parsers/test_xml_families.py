"""qwen3_coder (`<function=..><parameter=..>`) and glm45/glm47 (`<arg_key>/<arg_value>`)."""

from __future__ import annotations

import pytest

from environments.tool_call_parsers import get_parser
from environments.tool_call_parsers._core import JSON_DECODER
from environments.tool_call_parsers._values import coerce_value

from environments.tool_call_parsers import testing as writers
from ._conformance import TOOLS, TYPED, WEATHER, Call, ParserConformance, calls_of


def qwen3_coder_block(name: str, args: dict) -> str:
    return writers.qwen3_coder([(name, args)])


def glm_block(name: str, args: dict) -> str:
    return writers.glm([(name, args)])


class TestQwen3Coder(ParserConformance):
    names = ("qwen3_coder", "qwen3_xml")
    malformed = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
        "<tool_call>\n<function=get weather!>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\nsome junk\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather\n</function>\n</tool_call>",
    )

    def render(self, calls: list[Call]) -> str:
        return writers.qwen3_coder(calls)


class TestGlm45(ParserConformance):
    names = ("glm45",)
    malformed = (
        "<tool_call>\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\nParis\n</tool_call>",
        "<tool_call>get weather now</tool_call>",
    )

    def render(self, calls: list[Call]) -> str:
        return writers.glm(calls)


class TestGlm47(TestGlm45):
    names = ("glm47",)

    def render(self, calls: list[Call]) -> str:
        return writers.glm47(calls)


QWEN3_CODER_QUIRKS = {
    "no <tool_call> wrapper": (
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
        None,
        [("get_weather", {"city": "Paris"})],
    ),
    "missing </function> and </tool_call> at the end": (
        "ok\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",
        "ok",
        [("get_weather", {"city": "Paris"})],
    ),
    "missing </function> before </tool_call>": (
        "<tool_call>\n<function=ping>\n</tool_call>",
        None,
        [("ping", {})],
    ),
    "only one newline is stripped": (
        "<function=write_file>\n<parameter=content>\n\nindented\n\n</parameter>\n</function>",
        None,
        [("write_file", {"content": "\nindented\n"})],
    ),
    "values on one line": (
        "<function=get_weather><parameter=city>Paris</parameter></function>",
        None,
        [("get_weather", {"city": "Paris"})],
    ),
}


@pytest.mark.parametrize("text, content, calls", QWEN3_CODER_QUIRKS.values(), ids=list(QWEN3_CODER_QUIRKS))
def test_qwen3_coder_quirks(text, content, calls):
    got, tool_calls = get_parser("qwen3_coder").parse(text)
    assert (got, calls_of(tool_calls)) == (content, calls)


@pytest.mark.parametrize("family, render", [("qwen3_coder", qwen3_coder_block), ("glm45", glm_block)])
def test_values_without_a_schema_are_json_or_text(family, render):
    # No tool schema: JSON when the text is JSON, the string otherwise.
    name, args = TYPED
    text = render("unknown_tool", {"n": 42, "obj": {"a": [1]}, "s": "plain words", "q": '"quoted"'})
    _, tool_calls = get_parser(family).parse(text)
    assert calls_of(tool_calls) == [("unknown_tool", {"n": 42, "obj": {"a": [1]}, "s": "plain words", "q": "quoted"})]


@pytest.mark.parametrize("family, render", [("qwen3_coder", qwen3_coder_block), ("glm45", glm_block)])
def test_schema_types_win_over_json_looks(family, render):
    args = {"label": "007", "count": 42, "flag": True, "nothing": None, "ratio": 1.5, "tags": ["x"]}
    text = render("configure", args)
    # Without the schema "007" is not JSON (leading zero) but "42"/"True" are ambiguous;
    # with it every value comes back as declared.
    assert calls_of(get_parser(family, tools=TOOLS).parse(text)[1]) == [("configure", args)]
    assert calls_of(get_parser(family).parse(text, tools=TOOLS)[1]) == [("configure", args)]


def test_schema_mismatch_keeps_what_the_model_wrote():
    text = qwen3_coder_block("configure", {"count": "many"})
    assert calls_of(get_parser("qwen3_coder", tools=TOOLS).parse(text)[1]) == [("configure", {"count": "many"})]


def test_glm_missing_closing_tag_at_end():
    text = "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>"
    assert calls_of(get_parser("glm47").parse(text)[1]) == [WEATHER]
    assert get_parser("glm47").parse(text)[0] == "Checking."


@pytest.mark.parametrize("family", ["glm45", "glm47"])
def test_glm_stray_closing_tag_is_reported(family):
    result = get_parser(family).parse_detailed("no call here </tool_call>")
    assert result.tool_calls == [] and result.content == "no call here </tool_call>"
    assert [e.reason for e in result.errors] == ["</tool_call> without a tool call before it"]


@pytest.mark.parametrize(
    "raw",
    ["1", " 1\n", "1\x0b", "\u00a01", "007", "-0.5e3", "NaN", "1e999", "9" * 5000, '"s"', ' ["a", {"b": null}] ', "{}",
     "tru", "true", "1 2", "[1,", "", "  ", "\t{\"a\": 1}\r\n", "{'a': 1}", "naïve"],
)  # fmt: skip
def test_untyped_value_is_json_exactly_when_json_reads_it(raw):
    # Without a schema a value is what a strict json.loads makes of it (JSON whitespace only
    # around it, no NaN/overflow/huge integers), else the text as written.
    try:
        want = JSON_DECODER.decode(raw)
    except ValueError:
        want = raw
    got = coerce_value(raw, None)
    assert got == want and type(got) is type(want)
