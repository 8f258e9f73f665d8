"""The one-pass paths for text as templates write it decide exactly what the general paths decide.

Several families read the usual text in one pass and leave anything else to their general path.
Each case here is parsed twice, by the registered parser and by the same parser with its usual
path switched off (a test subclass), and the two results must agree: content, errors, call names,
decoded arguments and written ids. The cases are the edge cases next to the usual shape (tokens
quoted inside arguments, nested braces and quotes, non-object arguments, malformed JSON, text
around and between calls, several sections) and 3,000 fuzzed mutants per family.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest

from environments.tool_call_parsers import get_parser
from environments.tool_call_parsers.hermes import HERMES, JsonTagParser
from environments.tool_call_parsers.llama import BareJsonParser
from environments.tool_call_parsers._token_calls import TokenCallParser
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
    LAYOUTS,
)

from ._conformance import ESCAPES, PING, TYPED, WEATHER
from .test_fuzz import mutate

MUTANTS = 3_000
NESTED = ("edit", {"patch": 'a {"b": [1, {"c": "}]"}]} \\" \'', "deep": {"x": [{"y": {}}, [], "{"]}})


def general_twin(parser: Any) -> Any:
    """The same parser with its usual path switched off."""
    if isinstance(parser, TokenCallParser):

        class Twin(type(parser)):  # type: ignore[misc,valid-type]
            def _parse(self, text, schemas):
                return self._general(text)

    elif isinstance(parser, JsonTagParser):

        class Twin(type(parser)):  # type: ignore[misc,valid-type,no-redef]
            def _usual_body(self, text, body_start):
                return None

    elif isinstance(parser, BareJsonParser):

        class Twin(type(parser)):  # type: ignore[misc,valid-type,no-redef]
            def __init__(self):
                super().__init__()
                self._usual = None

    else:
        raise AssertionError(f"no usual path known for {type(parser).__name__}")
    return Twin()


def decided(result) -> tuple[Any, ...]:
    calls = [
        (
            c["function"]["name"],
            json.loads(c["function"]["arguments"]),
            c["id"] if not c["id"].startswith("call_") else "",
        )
        for c in result.tool_calls
    ]
    return result.content, calls, [(e.start, e.end, e.reason) for e in result.errors]


def assert_same(family: str, text: str) -> None:
    parser = get_parser(LAYOUTS[family][0])
    got, want = parser.parse_detailed(text), general_twin(parser).parse_detailed(text)
    assert decided(got) == decided(want), f"{family}: {json.dumps(text, ensure_ascii=False)}"


# LongCat's JSON layout is the Hermes engine with other tags.
FAMILIES = ["deepseek_v3", "deepseek_v31", "kimi_k2", "hermes", "llama3_json", "llama4_json"]
TOKENS = {
    "deepseek_v3": (DS_BEGIN, DS_END, DS_CALL, DS_CALL_END, DS_SEP),
    "deepseek_v31": (DS_BEGIN, DS_END, DS_CALL, DS_CALL_END, DS_SEP),
    "kimi_k2": (K_BEGIN, K_END, K_CALL, K_CALL_END, K_ARGS),
    "hermes": ("<tool_call>", "</tool_call>"),
    "llama3_json": ("; ", '"name"', '"parameters"', "```json\n"),
    "llama4_json": ("<|python_start|>", "<|python_end|>", "<|python_tag|>", "; ", '"parameters"'),
}


def edge_cases(family: str) -> list[str]:
    write = LAYOUTS[family][1]
    one = write([WEATHER])
    cases = [
        "",
        "plain answer {not json} [x]",
        one,
        "Let me check.\n" + one + "\nDone.",
        write([WEATHER, TYPED, ESCAPES, PING, NESTED]),
        write([("ns.tool/v1:run-x", {"k": "v"})]),
        one + "\n" + one,  # two sections (two blocks)
        one + one,
        one.replace('"Paris"', '"Par\\u00efs"'),
        one.replace('{"city": "Paris", "unit": "celsius"}', '{"city":"Paris","unit":"celsius"}'),
        one.replace('{"city": "Paris", "unit": "celsius"}', ' {"city": "Paris"} '),
        one.replace('{"city": "Paris", "unit": "celsius"}', '["Paris"]'),
        one.replace('{"city": "Paris", "unit": "celsius"}', '"{\\"city\\": \\"Paris\\"}"'),
        one.replace('{"city": "Paris", "unit": "celsius"}', '{"city": "Paris"'),
        one.replace('{"city": "Paris", "unit": "celsius"}', '{"city": "Paris"}}'),
        one.replace('{"city": "Paris", "unit": "celsius"}', '{"n": ' + "9" * 5000 + "}"),
        one.replace('{"city": "Paris", "unit": "celsius"}', '{"n": NaN}'),
        one.replace('{"city": "Paris", "unit": "celsius"}', '{"a": 1, "a": 2}'),
        one.replace("get_weather", "get weather"),
        one.replace("get_weather", "x" * 200),
        one[: len(one) // 2],
        one[:-1],
    ]
    if family in ("hermes", "llama3_json", "llama4_json"):  # the call object around the arguments
        key = '"arguments"' if family == "hermes" else '"parameters"'
        other = '"parameters"' if family == "hermes" else '"arguments"'
        cases += [
            one.replace(key, other),
            one.replace(key, '"args"'),
            one.replace('"get_weather"', '" get_weather"'),
            one.replace('"get_weather"', '"get_\\u0077eather"'),
            one.replace('"celsius"}', '"celsius"}, "extra": 1'),
            one.replace('"celsius"}', '"celsius"}, ' + other + ': {"x": 1}'),
            one.replace('{"name": "get_weather", ', "{" + other + ': {}, "name": "get_weather", '),
            one.replace('{"name"', '{ \n "name"').replace('"celsius"}}', '"celsius"} \n}'),
            one.replace('"celsius"}}', '"celsius"}]'),
            "```json\n" + one + "\n```\nDone.",
            "Call: " + one,
            "<|python_tag|>" + one,
            "<|python_tag|> " + one.replace("{", "[", 1),
            'prose {"name": "x", "parameters": {}} prose\n' + one,
        ]
    for token in TOKENS[family]:  # every token quoted inside an argument, and dropped or doubled
        cases.append(write([("note", {"text": f"see {token} here", "n": 1})]))
        cases.append(one.replace(token, "", 1))
        cases.append(one.replace(token, token + token, 1))
        cases.append(one.replace(token, " " + token + "\n", 1))
        cases.append("before " + token + " after\n" + one)
        cases.append(one + " trailing " + token)
    return cases


@pytest.mark.parametrize("family", FAMILIES)
def test_edge_cases_agree(family):
    for text in edge_cases(family):
        assert_same(family, text)


@pytest.mark.parametrize("family", FAMILIES)
def test_fuzzed_mutants_agree(family):
    write = LAYOUTS[family][1]
    rng = random.Random(sum(map(ord, family)) + 1)
    sets = [[WEATHER], [TYPED, ESCAPES], [WEATHER, PING, NESTED]]
    bases = [(prose + write(calls), [write([c]) for c in calls]) for calls in sets for prose in ("", "Sure.\n")]
    for i in range(MUTANTS):
        text, blocks = bases[i % len(bases)]
        mutated, _ = mutate(rng, text, family, blocks)
        if i % 2:
            mutated, _ = mutate(rng, mutated, family, blocks)
        assert_same(family, mutated)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_usual_path_is_taken(family):
    # The usual text keeps the arguments as written: the general path (Hermes) or both agree on it.
    text = LAYOUTS[family][1]([("f", {"a": [1, 2]})]).replace('{"a": [1, 2]}', '{"a":[1,2]}')
    (call,) = get_parser(LAYOUTS[family][0]).parse(text)[1]
    assert call["function"]["arguments"] == '{"a":[1,2]}'


def test_a_spec_without_the_written_key_is_not_read_as_usual():
    # A family whose spec takes only `arguments` ignores a `parameters` key (general path: no arguments).
    class ArgumentsOnly(JsonTagParser):
        spec = replace(HERMES, arg_keys=("arguments",))

    text = '<tool_call>\n{"name": "f", "parameters": {"x": 1}}\n</tool_call>'
    (call,) = ArgumentsOnly().parse(text)[1]
    assert json.loads(call["function"]["arguments"]) == {}
    assert decided(ArgumentsOnly().parse_detailed(text)) == decided(general_twin(ArgumentsOnly()).parse_detailed(text))
