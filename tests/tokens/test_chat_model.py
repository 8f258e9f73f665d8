"""TokenChatModel: the agent loop's ChatModel on a token server, with exact ids underneath."""

from __future__ import annotations

import json

import pytest

from environments.models.base import ChatModel, ModelError, TurnOptions
from environments.models.token_mode import (
    ChatRenderer,
    TokenChatConfig,
    TokenChatModel,
    TokenServerConfig,
    make_token_server,
)
from environments.models.token_mode.testing import TOOLS, template_completion

from .conftest import template_text
from .doubles import Scripted, ScriptedTokenServerDouble


def _call(name, args, call_id):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


async def test_two_turns_send_exactly_the_held_ids(qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen2.5-7B-Instruct"))
    opening = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6*7? Use python."}]
    said = {
        "role": "assistant",
        "content": "Let me compute.",
        "tool_calls": [_call("python", {"code": "print(6*7)"}, "c1")],
    }
    gen1 = template_completion(renderer, opening, said, TOOLS)
    gen2 = renderer.encode("The answer is 42.<|im_end|>")
    script = [Scripted(gen1, [-0.1] * len(gen1)), Scripted(gen2, [-0.2] * len(gen2))]
    async with ScriptedTokenServerDouble(script) as double:
        server = make_token_server(TokenServerConfig(kind="vllm", base_url=double.url))
        model = TokenChatModel(server, renderer, TokenChatConfig(tool_call_parser="hermes"))
        assert isinstance(model, ChatModel)
        try:
            turn = await model.chat(list(opening), TOOLS, TurnOptions(temperature=0.5, max_tokens=64))
            assert turn.content == "Let me compute."
            assert [c["function"]["name"] for c in turn.tool_calls] == ["python"]
            assert json.loads(turn.tool_calls[0]["function"]["arguments"]) == {"code": "print(6*7)"}
            messages = opening + [turn.as_message()]
            messages.append(
                {"role": "tool", "tool_call_id": turn.tool_calls[0]["id"], "name": "python", "content": "42\n"}
            )
            final = await model.chat(messages, TOOLS, TurnOptions(temperature=0.5, max_tokens=64))
        finally:
            await server.aclose()
    assert final.content == "The answer is 42." and not final.tool_calls
    assert double.requests[0][1]["stop_token_ids"] == list(renderer.close.ids)

    first_prompt = double.requests[0][1]["prompt"]["prompt_token_ids"]
    second_prompt = double.requests[1][1]["prompt"]["prompt_token_ids"]
    # Turn 2 extends turn 1's prompt + the generated ids; nothing earlier was re-tokenized.
    assert second_prompt[: len(first_prompt) + len(gen1)] == first_prompt + gen1
    trace = model.token_trace()
    (seq,) = trace.sequences
    assert seq.tokens == second_prompt + gen2
    assert [t for t, m in zip(seq.tokens, seq.masks) if m != -100] == gen1 + gen2
    assert [lp for lp in seq.logprobs if lp is not None] == [-0.1] * len(gen1) + [-0.2] * len(gen2)
    # The suffix is what the template writes for the tool result, once.
    suffix = renderer.decode(second_prompt[len(first_prompt) + len(gen1) :])
    assert suffix == "\n<|im_start|>user\n<tool_response>\n42\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    # Exactly the template's render of the whole conversation: no end-of-turn twice.
    full = renderer.render(messages + [final.as_message()], TOOLS, add_generation_prompt=False)
    assert renderer.decode(seq.tokens) == full.rstrip("\n")
    assert renderer.decode(seq.tokens).count("<|im_end|>") == 5  # system, user, assistant, tool, assistant


async def test_reasoning_is_split_and_context_cap_reports_context_full(qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen3-0.6B"))
    gen = renderer.encode("<think>\nsmall sum\n</think>\n\nIt is 4.<|im_end|>")
    async with ScriptedTokenServerDouble([Scripted(gen, [-0.3] * len(gen))]) as double:
        server = make_token_server(TokenServerConfig(kind="sglang", base_url=double.url))
        model = TokenChatModel(server, renderer, TokenChatConfig(max_context_tokens=400))
        try:
            turn = await model.chat(
                [{"role": "user", "content": "2+2?"}], TOOLS, TurnOptions(temperature=0.0, max_tokens=1000)
            )
            assert turn.reasoning_content == "small sum" and turn.content == "It is 4."
            # The generation cap was clipped to the room left in the context.
            sent = double.requests[0][1]
            assert sent["sampling_params"]["max_new_tokens"] == 400 - len(sent["input_ids"])
            messages = [{"role": "user", "content": "2+2?"}, turn.as_message(), {"role": "user", "content": "x" * 3000}]
            with pytest.raises(ModelError, match="context length exceeded"):
                await model.chat(messages, TOOLS, TurnOptions(temperature=0.0, max_tokens=10))
        finally:
            await server.aclose()


async def test_rewritten_history_is_refused(qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen2.5-7B-Instruct"))
    gen = renderer.encode("Hi.<|im_end|>")
    async with ScriptedTokenServerDouble([Scripted(gen, [-0.1] * len(gen))]) as double:
        server = make_token_server(TokenServerConfig(kind="vllm", base_url=double.url))
        model = TokenChatModel(server, renderer)
        try:
            turn = await model.chat(
                [{"role": "user", "content": "hello"}], [], TurnOptions(temperature=0.0, max_tokens=8)
            )
            edited = [
                {"role": "user", "content": "hello"},
                {**turn.as_message(), "content": "Edited."},
                {"role": "user", "content": "and?"},
            ]
            with pytest.raises(RuntimeError, match="not continued"):
                await model.chat(edited, [], TurnOptions(temperature=0.0, max_tokens=8))
        finally:
            await server.aclose()


@pytest.mark.llm
async def test_real_llamacpp_turns_keep_exact_ids(embedded_llm):
    renderer = ChatRenderer.from_files(embedded_llm.tokenizer_dir)
    server = make_token_server(TokenServerConfig(kind="llamacpp", base_url=embedded_llm.base_url))
    model = TokenChatModel(server, renderer, TokenChatConfig(seed=1))
    messages = [{"role": "user", "content": "Name one colour."}]
    raw: list[str] = []
    try:
        for follow_up in ["Name another one.", "And one more?"]:
            turn = await model.chat(messages, TOOLS, TurnOptions(temperature=0.7, max_tokens=24))
            trace = model.token_trace()
            seq = trace.sequences[-1]
            raw.append(renderer.decode(seq.tokens[seq.spans[-1].start :]))
            messages += [turn.as_message(), {"role": "user", "content": follow_up}]
    finally:
        await server.aclose()
    trace = model.token_trace()
    assert trace.restarts == 0
    (seq,) = trace.sequences
    model_spans = [s for s in seq.spans if s.kind == "model"]
    assert [renderer.decode(seq.tokens[s.start : s.end]) for s in model_spans] == raw
    assert all(
        seq.logprobs[i] is not None or renderer.decode(seq.tokens[s.start : i + 1]).endswith("\ufffd")
        for s in model_spans
        for i in range(s.start, s.end)
    )
    # Each suffix starts with the end-of-turn marker only when the model did not emit it.
    for prev, span in zip(seq.spans, seq.spans[1:]):
        if span.kind == "template":
            model_closed = renderer.decode(seq.tokens[prev.start : prev.end]).endswith("<|im_end|>")
            assert renderer.decode(seq.tokens[span.start : span.end]).startswith("<|im_end|>") != model_closed


async def test_agent_loop_on_token_model_tells_server_failure_from_context_full(qwen_tokenizer, tmp_path):
    from environments.agent_loop import AgentLoopConfig, HermesAgentLoop
    from tools.context import ToolContext, ToolLimits
    from tools.executor import LocalWorkspace

    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen2.5-7B-Instruct"))
    ctx = ToolContext(executor=LocalWorkspace(tmp_path / "ws"), limits=ToolLimits(), task_id="t")
    opening = [{"role": "user", "content": "hello"}]
    async with ScriptedTokenServerDouble([], status=503) as double:
        server = make_token_server(TokenServerConfig(kind="vllm", base_url=double.url))
        try:
            loop = HermesAgentLoop(TokenChatModel(server, renderer), TOOLS, ctx, AgentLoopConfig(max_turns=2))
            broken = await loop.run(opening)
            small = TokenChatModel(server, renderer, TokenChatConfig(max_context_tokens=20))
            full = await HermesAgentLoop(small, TOOLS, ctx, AgentLoopConfig(max_turns=2)).run(opening)
        finally:
            await server.aclose()
    assert broken.stop_reason == "model_error" and broken.infrastructure_failure and "HTTP 503" in broken.error
    assert full.stop_reason == "context_full" and not full.infrastructure_failure


async def test_harmony_analysis_channel_becomes_reasoning_content(qwen_tokenizer):
    # The gpt_oss parser splits harmony's analysis channel from the raw text; it must not be lost.
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen3-0.6B"))
    raw = (
        "<|channel|>analysis<|message|>need python<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.python <|constrain|>json<|message|>{"code": "print(1)"}<|call|><|im_end|>'
    )
    gen = renderer.encode(raw)
    async with ScriptedTokenServerDouble([Scripted(gen, [-0.1] * len(gen))]) as double:
        server = make_token_server(TokenServerConfig(kind="sglang", base_url=double.url))
        model = TokenChatModel(server, renderer, TokenChatConfig(tool_call_parser="gpt_oss", split_reasoning=False))
        try:
            turn = await model.chat(
                [{"role": "user", "content": "run"}], TOOLS, TurnOptions(temperature=0.0, max_tokens=100)
            )
        finally:
            await server.aclose()
    assert turn.reasoning_content == "need python"
    assert turn.tool_calls[0]["function"]["name"] == "python"
