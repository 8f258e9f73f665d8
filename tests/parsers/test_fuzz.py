"""Fuzzing: 10,000+ mutated completions per family; `parse` never raises, never invents a call.

Mutations, from a seeded RNG (reproducible; the seed is in the failure message):
- structural, where the strong invariant holds (every parsed call is one of the calls
  really written, with at most some of its arguments): truncation anywhere, a corrupted
  character inside a markup token, a duplicated whole call block, markup tokens inserted
  at random places;
- free, where only the weak invariant holds (the name of every parsed call is written in
  the text, no more calls than written names, well-formed output): random spans
  duplicated or deleted, random unicode inserted.
Both kinds also check the never-raise contract did not need its safety net (no
"internal parser error").
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from environments.tool_call_parsers import get_parser
from environments.tool_call_parsers._core import strip_code_fence

from ._conformance import ESCAPES, PING, TOOLS, TYPED, WEATHER, calls_of
from environments.tool_call_parsers.testing import LAYOUTS, MARKUP, WRITERS

MUTANTS_PER_FAMILY = 10_000
BASE_CALL_SETS = [[WEATHER], [TYPED], [ESCAPES], [WEATHER, PING], [PING, ESCAPES, WEATHER]]
PROSE = ("", "Let me check.\n", "I'll call the tool now:\n\n")
UNICODE = "é日本🎉\u200b\u0000\t\n\"'\\{}[]<>|｜▁:;=,"


def is_part_of(call: tuple[str, dict[str, Any]], originals: list[tuple[str, dict[str, Any]]]) -> bool:
    name, args = call
    return any(name == n and all(k in a and a[k] == v for k, v in args.items()) for n, a in originals)


def mutate(rng: random.Random, text: str, family: str, blocks: list[str]) -> tuple[str, bool]:
    """A mutated completion, and whether the mutation is structural (strong invariant)."""
    kind = rng.randrange(8)
    n = len(text)
    if kind in (0, 1):  # truncate
        return text[: rng.randrange(n + 1)], True
    if kind == 2:  # corrupt one character inside a markup token
        tokens = [t for t in MARKUP[family] if t in text]
        if tokens:
            tok = rng.choice(tokens)
            starts = [m.start() for m in re.finditer(re.escape(tok), text)]
            # Inside the token: changing its first or last character can legitimately
            # change the neighbouring value instead (`Paris<</parameter>`).
            inner = range(1, len(tok) - 1) if len(tok) > 2 else range(len(tok))
            at = rng.choice(starts) + rng.choice(inner)
            op = rng.randrange(3)
            repl = "" if op == 0 else (text[at] * 2 if op == 1 else rng.choice(UNICODE))
            return text[:at] + repl + text[at + 1 :], True
        return text, True
    if kind == 3:  # a whole call block twice
        block = rng.choice(blocks)
        at = text.find(block)
        if at != -1:
            return text[: at + len(block)] + block + text[at + len(block) :], True
        return text, True
    if kind == 4:  # a markup token dropped somewhere
        at = rng.randrange(n + 1)
        return text[:at] + rng.choice(MARKUP[family]) + text[at:], False
    if kind == 5:  # duplicate a random span
        a = rng.randrange(n + 1)
        b = min(n, a + rng.randrange(1, 40))
        return text[:b] + text[a:b] + text[b:], False
    if kind == 6:  # delete a random span
        a = rng.randrange(n + 1)
        return text[:a] + text[min(n, a + rng.randrange(1, 40)) :], False
    at = rng.randrange(n + 1)
    noise = "".join(rng.choice(UNICODE) for _ in range(rng.randrange(1, 6)))
    return text[:at] + noise + text[at:], False


def check(parser, text: str, originals, structural: bool) -> None:
    result = parser.parse_detailed(text)
    assert all("internal parser error" not in e.reason for e in result.errors), result.errors
    assert result.content is None or (isinstance(result.content, str) and result.content.strip())
    parsed = calls_of(result.tool_calls)
    assert len({c["id"] for c in result.tool_calls}) == len(parsed)
    for name, _ in parsed:
        assert name in text
    names = {name for name, _ in parsed}
    assert len(parsed) <= sum(text.count(name) for name in names)
    if structural:
        for call in parsed:
            assert is_part_of(call, originals), f"invented {call}"


def check_stream(parser, text: str, rng: random.Random) -> None:
    """Streaming never shows text that the full parse does not keep as content."""
    stream = parser.stream()
    shown, pos = "", 0
    while pos < len(text):
        step = rng.randrange(1, 12)
        shown += stream.feed(text[pos : pos + step])
        pos += step
    full = parser.parse_detailed(text)
    assert (full.content or "").startswith(shown), shown
    assert stream.finish().content == full.content


@pytest.mark.parametrize("family", sorted(LAYOUTS))
def test_fuzz(family):
    name, write = LAYOUTS[family]
    parser = get_parser(name, tools=TOOLS)
    seed = sum(map(ord, family))
    rng = random.Random(seed)
    bases = []
    for calls in BASE_CALL_SETS:
        for prose in PROSE:
            bases.append((prose + write(calls), calls, [write([c]) for c in calls]))
    for i in range(MUTANTS_PER_FAMILY):
        text, originals, blocks = bases[i % len(bases)]
        mutated, structural = mutate(rng, text, family, blocks)
        if i % 3 == 0:  # mutations compound
            mutated, again = mutate(rng, mutated, family, blocks)
            structural = structural and again
        try:
            check(parser, mutated, originals, structural)
            if i % 25 == 0:  # 400 streamed mutants per family
                check_stream(parser, mutated, rng)
        except AssertionError as exc:
            raise AssertionError(
                f"{family} mutant #{i} (seed {seed}): {json.dumps(mutated, ensure_ascii=False)}\n{exc}"
            ) from None


def test_empty_and_odd_inputs_never_raise():
    odd = [
        "",
        " ",
        "\x00",
        "<",
        "[",
        "{",
        "<tool_call>",
        "[TOOL_CALLS]",
        "<|message|>",
        "<｜tool▁calls▁begin｜>",
        "{" * 5000,
        "[" * 5000 + "f(",
        "a" * 100_000,
    ]
    for family in sorted(WRITERS):
        parser = get_parser(family)
        for text in odd:
            result = parser.parse_detailed(text)
            assert result.tool_calls == []
            assert all("internal parser error" not in e.reason for e in result.errors), (
                family,
                text[:20],
                result.errors,
            )
        for wrong in (b"<tool_call>", 42, ["<tool_call>"]):
            assert parser.parse(wrong) == (None, [])
            assert "expected the completion text" in parser.parse_detailed(wrong).errors[0].reason


@pytest.mark.parametrize("value", ["NaN", "-Infinity", "1e999", "9" * 5000])
@pytest.mark.parametrize("family", ["hermes", "llama3_json", "mistral", "deepseek_v31", "kimi_k2", "gpt_oss"])
def test_arguments_are_strict_json(family, value):
    # Python's json would accept these (or overflow to inf) and json.dumps would then write
    # arguments no other JSON reader accepts.
    text = WRITERS[family]([("f", {"x": 0})]).replace('{"x": 0}', '{"x": ' + value + "}")
    assert '{"x": ' + value in text
    result = get_parser(family).parse_detailed(text)
    assert result.tool_calls == [] and result.errors
    assert all("internal parser error" not in e.reason for e in result.errors)


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v31", "kimi_k2"])
def test_too_long_integer_is_named(family):
    # The hot path converts integers in C; one past int()'s digit limit must still be reported in the
    # strict decoder's words, at the same place, and not as an internal error.
    text = WRITERS[family]([("f", {"x": 0})]).replace('{"x": 0}', '{"x": [1, ' + "9" * 5000 + "]}")
    (error,) = get_parser(family).parse_detailed(text).errors
    assert error.reason == "invalid JSON: integer with 5000 digits at position 0"


@pytest.mark.parametrize(
    "body, inner",
    [
        ('```json\n{"a": 1}\n```', '{"a": 1}'),
        ("```json\n```", ""),  # the closing fence right after the opening line
        ('  ```json\n\n {"a": 1} \n```\n', '{"a": 1}'),
        ('```json\n{"a": 1}\n``', '{"a": 1}\n``'),  # no closing fence: kept
        ('```JSON5\n{"a": 1}\n```', '{"a": 1}'),
        ('```js on\n{"a": 1}\n```', '```js on\n{"a": 1}\n```'),  # not a language: not a fence
        ('```json{"a": 1}```', '```json{"a": 1}```'),  # no line break: not a fence
    ],
)
def test_code_fence_shapes(body, inner):
    assert strip_code_fence(body) == inner
