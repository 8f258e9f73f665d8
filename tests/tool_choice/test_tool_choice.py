"""tool_choice on the real embedded llama.cpp server, in token mode and in chat mode.

`required` and a named function always give a parsed call of an offered (or the named) tool;
`none` never gives one; in token mode the ids the session trains are the ids the server's
`/completion` answered with, and their logprobs are the server's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from pydantic import TypeAdapter
from transformers import AutoTokenizer

from environments.models.base import ModelRequestError, TurnOptions
from environments.models.chat_mode import OpenAIChatConfig, OpenAIChatModel
from environments.models.tool_choice import ToolChoice, check_tool_choice
from environments.models.token_mode import ChatRenderer, TokenChatConfig, TokenChatModel, TokenServerConfig
from environments.models.token_mode.servers import HTTPTokenServer

from .conftest import PROMPTS, TOOLS

pytestmark = pytest.mark.llm

# What the envs send to llama.cpp (environments/models/token_mode/wiring.py: sampling_setup).
SAMPLER = {"top_k": 40, "top_p": 0.95, "min_p": 0.05}
CHOICES = ["required", {"type": "function", "function": {"name": "set_timer"}}, "none"]


def _choice(value: Any) -> ToolChoice:
    return TypeAdapter(ToolChoice).validate_python(value)


def _check_turn(choice: ToolChoice, turn: Any) -> None:
    if choice == "none":
        assert not turn.tool_calls and not turn.parse_errors
        assert "<tool_call>" not in (turn.content or "") and "</tool_call>" not in (turn.content or "")
        return
    assert turn.tool_calls, f"no call under tool_choice {choice}: {turn.content!r}"
    assert not turn.parse_errors
    for call in turn.tool_calls:
        name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
        if choice != "required":
            assert name == choice.function.name  # type: ignore[union-attr]
        if name == "get_weather":
            assert args == {"city": args["city"]} and args["city"] in ("Paris", "Tokyo", "Lima")
        else:
            assert name == "set_timer" and isinstance(args["minutes"], int) and 1 <= args["minutes"] <= 60


@pytest.mark.parametrize("value", CHOICES, ids=["required", "named", "none"])
async def test_token_mode_tool_choice_and_the_trained_ids_are_the_sampled_ids(embedded_llm, value):
    choice = _choice(value)
    answers: list[dict[str, Any]] = []

    async def keep_answer(response: httpx.Response) -> None:
        if response.request.url.path == "/completion":
            await response.aread()
            answers.append(response.json())

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(embedded_llm.tokenizer_dir)))
    client = httpx.AsyncClient(timeout=600, event_hooks={"response": [keep_answer]})
    server = HTTPTokenServer(
        TokenServerConfig(kind="llamacpp", base_url=embedded_llm.server_url, extra_body=SAMPLER), client
    )
    try:
        for seed, prompt in enumerate(PROMPTS):
            model = TokenChatModel(server, renderer, TokenChatConfig(tool_call_parser="hermes", seed=seed))
            messages = [{"role": "user", "content": prompt}]
            turn = await model.chat(messages, TOOLS, TurnOptions(temperature=0.7, max_tokens=96, tool_choice=choice))
            _check_turn(choice, turn)
            answer = answers[-1]
            trace = model.token_trace()
            assert trace is not None and len(trace.sequences) == 1
            seq = trace.sequences[0]
            (span,) = [s for s in seq.spans if s.kind == "model"]
            # The trained ids are exactly the ids llama.cpp sampled under the grammar, and all of them are trained.
            assert seq.tokens[span.start : span.end] == answer["tokens"]
            assert seq.trained[span.start : span.end] == [True] * len(answer["tokens"])
            reported = [(p["id"], p["logprob"]) for p in answer["completion_probabilities"]]
            held = [(t, lp) for t, lp in zip(seq.tokens[span.start : span.end], seq.logprobs[span.start : span.end])]
            assert [pair for pair in held if pair[1] is not None] == reported
            if choice != "none":
                # A constrained call ends with the template's end-of-turn token, sampled as well.
                assert answer["tokens"][-1] == renderer.close.ids[-1] and turn.finish_reason == "stop"
    finally:
        await server.aclose()
    assert len(answers) == len(PROMPTS)


@pytest.mark.parametrize("value", CHOICES, ids=["required", "named", "none"])
async def test_chat_mode_tool_choice_with_tools_in_the_system_prompt(embedded_llm, value):
    choice = _choice(value)
    model = OpenAIChatModel(
        OpenAIChatConfig(
            base_url=embedded_llm.base_url, model=embedded_llm.model_name, tools_in="system_prompt", extra_body=SAMPLER
        )
    )
    try:
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            turn = await model.chat(messages, TOOLS, TurnOptions(temperature=0.7, max_tokens=96, tool_choice=choice))
            _check_turn(choice, turn)
    finally:
        await model.aclose()


async def test_chat_mode_sends_tool_choice_with_tools_in_the_request(embedded_llm):
    sent: list[dict[str, Any]] = []

    async def keep_request(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    http = httpx.AsyncClient(event_hooks={"request": [keep_request]})
    client = openai.AsyncOpenAI(base_url=embedded_llm.base_url, api_key="local", http_client=http)
    model = OpenAIChatModel(OpenAIChatConfig(base_url=embedded_llm.base_url, model=embedded_llm.model_name), client)
    named = _choice({"type": "function", "function": {"name": "get_weather"}})
    try:
        await model.chat(
            [{"role": "user", "content": "Hi"}], TOOLS, TurnOptions(temperature=0.0, max_tokens=4, tool_choice=named)
        )
        await model.chat([{"role": "user", "content": "Hi"}], TOOLS, TurnOptions(temperature=0.0, max_tokens=4))
    finally:
        await client.close()
    assert sent[0]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent[0]["tools"] == TOOLS
    assert "tool_choice" not in sent[1]  # auto: the server's own default, nothing sent


async def test_a_named_tool_that_is_not_offered_stops_before_a_request(embedded_llm):
    model = OpenAIChatModel(OpenAIChatConfig(base_url=embedded_llm.base_url, model=embedded_llm.model_name))
    try:
        with pytest.raises(ModelRequestError, match="'delete_all', which is not offered"):
            await model.chat(
                [{"role": "user", "content": "Hi"}],
                TOOLS,
                TurnOptions(0.0, 4, _choice({"type": "function", "function": {"name": "delete_all"}})),
            )
    finally:
        await model.aclose()


def test_protocols_that_cannot_carry_a_choice_are_refused_before_any_rollout():
    with pytest.raises(ValueError, match="needs the llamacpp protocol"):
        check_tool_choice(["auto", "required"], "vllm", "request", {})
    with pytest.raises(ValueError, match="remove grammar/json_schema"):
        check_tool_choice([None, "none"], "llamacpp", "request", {"grammar": "root ::= x"})
    check_tool_choice(["auto", None], "vllm", "request", {"grammar": "x"})  # nothing constrained: nothing refused
    check_tool_choice(["required"], None, "request", {"grammar": "x"})  # chat mode, tools=: the server decides


def _invited(city: str) -> list[dict[str, Any]]:
    """A user asking for the call's markup verbatim: a small model copies it, and so calls the tool."""
    markup = f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'
    return [{"role": "user", "content": f"Repeat exactly this text and nothing else:\n{markup}"}]


async def test_none_holds_where_the_model_would_call_a_tool(embedded_llm):
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(embedded_llm.tokenizer_dir)))
    server = HTTPTokenServer(TokenServerConfig(kind="llamacpp", base_url=embedded_llm.server_url, extra_body=SAMPLER))
    calls = {"auto": 0, "none": 0}

    async def one(seed: int, choice: ToolChoice) -> None:
        model = TokenChatModel(server, renderer, TokenChatConfig(tool_call_parser="hermes", seed=seed))
        turn = await model.chat(
            _invited(["Tokyo", "Lima"][seed % 2]),
            TOOLS,
            TurnOptions(temperature=0.7, max_tokens=64, tool_choice=choice),
        )
        calls[choice] += len(turn.tool_calls)
        if choice == "none":
            _check_turn("none", turn)

    try:
        # The server's 4 slots decode together: one batch costs about what one sequence does on CPU.
        for seed in range(0, 6, 2):
            await asyncio.gather(*(one(s, c) for s in (seed, seed + 1) for c in ("auto", "none")))
    finally:
        await server.aclose()
    assert calls["auto"] > 0  # the conversation does invite a call: `none` is what keeps it out
    assert calls["none"] == 0
