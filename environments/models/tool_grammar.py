"""`tool_choice` as a llama.cpp grammar that constrains the sampling: token mode's `/completion`
requests, and chat mode's requests when the tools travel in the system prompt (llama.cpp's chat
endpoint takes a `grammar` but not together with tools=).

The grammar follows the parser family's markup, so what the model is made to write is what
the same parser reads back:

- `none`: GBNF (any llama.cpp build) for text that contains neither the family's opening nor
  its closing tag, so no block can be read as a call (the hermes parser also reads a body
  right before a lone closing tag).
- `required` / a named function: an llguidance grammar (`%llguidance`; llama.cpp built with
  LLAMA_LLGUIDANCE, as the `xllamacpp` wheel is) of one call (as with `parallel_tool_calls`
  false): the family's tags around a JSON object whose `name` is an offered tool (or the named
  one) and whose `arguments` follow that tool's parameter schema.

The server samples under the grammar and returns the ids it sampled, which are the ids the
session holds and trains. llama.cpp's logprobs (n_probs, post_sampling_probs off) are the
log-softmax of the raw logits: a constrained token's logprob is under the unconstrained
distribution (docs/trainers.md).
"""

from __future__ import annotations

import json
from typing import Any

from environments.models.tool_choice import ToolChoice, offered_tools
from environments.tool_call_parsers import ToolCallParser
from environments.tool_call_parsers.hermes import JsonTagParser

__all__ = ["tool_choice_grammar", "avoid_strings_gbnf", "calls_grammar"]

# JSON written as json.dumps writes it (and the Hermes template renders arguments): no free
# whitespace a small model could spend its budget on; unsupported schema keywords ignored.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


def tool_choice_grammar(
    parser: ToolCallParser, tools: list[dict[str, Any]], choice: ToolChoice, close_id: int | None = None
) -> str | None:
    """The llama.cpp grammar that enforces `choice` for this parser family (None: `auto`).
    `close_id`: the template's end-of-turn token, which a call is made to end with (without it the
    model may end the turn with any end-of-generation token, e.g. SmolLM2's <|endoftext|>).
    ValueError when the family's markup has no grammar here, or the choice names no offered tool."""
    if choice == "auto":
        return None
    if not isinstance(parser, JsonTagParser):
        raise ValueError(
            f"tool_choice {choice!r} in token mode needs a parser family whose calls are JSON between tags "
            f"(hermes, qwen, longcat); {type(parser).__name__} has no grammar yet: use tool_choice auto or chat mode"
        )
    start, end = parser.spec.start, parser.spec.end
    if choice == "none":
        return avoid_strings_gbnf([start, end])
    return calls_grammar(start, end, offered_tools(tools, choice), close_id)


def calls_grammar(start: str, end: str, tools: list[dict[str, Any]], close_id: int | None = None) -> str:
    """llguidance grammar: `start\\n{"name": N, "arguments": {...}}\\nend`, once (then only the end of
    the turn): a grammar that allows another call lets a small model repeat its call until the token cap."""
    options = []
    for tool in tools:
        fn = tool["function"]
        params = dict(fn.get("parameters") or {"type": "object"})
        # A schema that does not say lets any key through; a tool call names only its own.
        params.setdefault("additionalProperties", False)
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = {"anyOf": options, "x-guidance": _JSON_OPTIONS}
    return (
        "%llguidance {}\n"
        f"start: call{f' <[{close_id}]>' if close_id is not None else ''}\n"
        f"call: {json.dumps(start + chr(10))} %json {json.dumps(schema)} {json.dumps(chr(10) + end)}\n"
    )


def _char(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02X}" if code < 0x80 else f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def avoid_strings_gbnf(banned: list[str]) -> str:
    """GBNF for any text containing none of `banned` (an Aho-Corasick automaton, one rule per
    state: the state is the longest suffix of the text so far that begins a banned string)."""
    prefixes = sorted({b[:i] for b in banned for i in range(len(b))}, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(prefixes)}
    alphabet = sorted({c for b in banned for c in b})

    def step(state: str, c: str) -> str | None:
        text = state + c
        if any(text.endswith(b) for b in banned):
            return None
        for k in range(len(text) + 1):  # the longest suffix that is still a live prefix
            if text[k:] in index:
                return text[k:]
        return ""

    rules = []
    for state in prefixes:
        alts = ['""', f"[^{''.join(_char(c) for c in alphabet)}] s0"]
        for c in alphabet:
            nxt = step(state, c)
            if nxt is not None:
                alts.append(f'"{_char(c)}" s{index[nxt]}')
        rules.append(f"s{index[state]} ::= " + " | ".join(alts))
    return "root ::= s0\n" + "\n".join(rules) + "\n"
