"""deepseek_v3, deepseek_v31 and kimi_k2: calls framed by special tokens."""

from __future__ import annotations

import pytest

from environments.tool_call_parsers import get_parser
from environments.tool_call_parsers import testing as writers

from ._conformance import PING, WEATHER, Call, ParserConformance, calls_of

from environments.tool_call_parsers.testing import (
    DS_BEGIN,
    DS_CALL,
    DS_CALL_END,
    DS_END,
    DS_SEP,
    K_ARGS,
    K_BEGIN,
    K_CALL,
    K_CALL_END,
    K_END,
    deepseek_v3,
    deepseek_v31,
    kimi_k2,
)


class TestDeepSeekV3(ParserConformance):
    names = ("deepseek_v3", "deepseekv3")
    malformed = (
        f'{DS_BEGIN}{DS_CALL}function{DS_SEP}get_weather\n```json\n{{"city": \n```{DS_CALL_END}{DS_END}',
        f'{DS_BEGIN}{DS_CALL}get_weather\n```json\n{{"city": "Paris"}}\n```{DS_CALL_END}{DS_END}',
        f"{DS_BEGIN}{DS_CALL}function{DS_SEP}\n```json\n{{}}\n```{DS_CALL_END}{DS_END}",
    )

    def render(self, calls: list[Call]) -> str:
        return deepseek_v3(calls)


class TestDeepSeekV31(ParserConformance):
    names = ("deepseek_v31", "deepseekv31", "deepseek_v3_1")
    malformed = (
        f'{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{"city": "Paris"{DS_CALL_END}{DS_END}',
        f'{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}["Paris"]{DS_CALL_END}{DS_END}',
    )

    def render(self, calls: list[Call]) -> str:
        return deepseek_v31(calls)


class TestKimiK2(ParserConformance):
    names = ("kimi_k2",)
    malformed = (
        f'{K_BEGIN}{K_CALL}functions.get_weather:0{K_ARGS}{{"city": {K_CALL_END}{K_END}',
        f"{K_BEGIN}{K_CALL}functions.get_weather:0{{}}{K_CALL_END}{K_END}",
    )

    def render(self, calls: list[Call]) -> str:
        return kimi_k2(calls)


class TestDeepSeekV32(ParserConformance):
    names = ("deepseek_v32", "deepseekv32")
    malformed = (
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="days" string="false">three</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get weather">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
    )

    def render(self, calls: list[Call]) -> str:
        return writers.deepseek_v32(calls)


def test_kimi_ids_are_kept():
    _, tool_calls = get_parser("kimi_k2").parse(kimi_k2([WEATHER, PING]))
    assert [c["id"] for c in tool_calls] == ["functions.get_weather:0", "functions.ping:1"]


TOKEN_QUIRKS = {
    "v31 section end missing at the end": (
        "deepseek_v31",
        f"ok{DS_BEGIN}{DS_CALL}ping{DS_SEP}{{}}{DS_CALL_END}",
        "ok",
        [PING],
    ),
    "v31 call end missing at the end": ("deepseek_v31", f"{DS_BEGIN}{DS_CALL}ping{DS_SEP}{{}}", None, [PING]),
    "v31 section begin missing": ("deepseek_v31", f"{DS_CALL}ping{DS_SEP}{{}}{DS_CALL_END}{DS_END}", None, [PING]),
    "v3 without the code fence": (
        "deepseek_v3",
        f"{DS_BEGIN}{DS_CALL}function{DS_SEP}ping\n{{}}{DS_CALL_END}{DS_END}",
        None,
        [PING],
    ),
    "v31 arguments encoded twice": (
        "deepseek_v31",
        f'{DS_BEGIN}{DS_CALL}ping{DS_SEP}"{{}}"{DS_CALL_END}{DS_END}',
        None,
        [PING],
    ),
    "kimi singular section token": (
        "kimi_k2",
        f"<|tool_call_section_begin|>{K_CALL}functions.ping:0{K_ARGS}{{}}{K_CALL_END}<|tool_call_section_end|>",
        None,
        [PING],
    ),
    "kimi text after the section": ("kimi_k2", kimi_k2([PING]) + " done", "done", [PING]),
}


@pytest.mark.parametrize("family, text, content, calls", TOKEN_QUIRKS.values(), ids=list(TOKEN_QUIRKS))
def test_token_quirks(family, text, content, calls):
    got, tool_calls = get_parser(family).parse(text)
    assert (got, calls_of(tool_calls)) == (content, calls)


def test_bad_call_inside_a_good_section_keeps_the_good_ones():
    bad = f"{DS_CALL}get_weather{DS_SEP}{{oops{DS_CALL_END}"
    text = f"{DS_BEGIN}{DS_CALL}ping{DS_SEP}{{}}{DS_CALL_END}{bad}{DS_END}"
    result = get_parser("deepseek_v31").parse_detailed(text)
    assert calls_of(result.tool_calls) == [PING]
    assert result.content == bad and len(result.errors) == 1
