"""Token server clients: wire formats (doubles for SGLang/vLLM, the real llama.cpp server)."""

from __future__ import annotations

import socket

import pytest

from environments.models.base import ModelError
from environments.models.token_mode import TokenServerConfig, make_token_server
from environments.models.token_mode.servers import align_llamacpp_logprobs

from .doubles import Scripted, ScriptedTokenServerDouble


@pytest.mark.parametrize("kind", ["vllm", "vllm_openai", "sglang"])
async def test_clients_send_token_ids_and_read_aligned_logprobs(kind):
    script = [Scripted([11, 12, 13], [-0.5, -0.25, -0.125], "stop"), Scripted([7, 8], [-1.0, -2.0], "length")]
    async with ScriptedTokenServerDouble(script) as double:
        server = make_token_server(TokenServerConfig(kind=kind, base_url=double.url + "/v1", model="m"))
        try:
            await server.check()
            first = await server.generate([1, 2, 3], max_tokens=16, temperature=0.7, stop_token_ids=[99], seed=5)
            second = await server.generate([1, 2, 3, 11, 12, 13, 4], max_tokens=2, temperature=0.0)
        finally:
            await server.aclose()
    assert (first.token_ids, first.logprobs, first.finish_reason) == ([11, 12, 13], [-0.5, -0.25, -0.125], "stop")
    assert (second.token_ids, second.logprobs, second.finish_reason) == ([7, 8], [-1.0, -2.0], "length")
    path, body = double.requests[0]
    if kind == "vllm":
        assert path == "/generate" and body["prompt"] == {"prompt_token_ids": [1, 2, 3]} and body["logprobs"] == 0
        assert body["max_tokens"] == 16 and body["stop_token_ids"] == [99] and body["seed"] == 5
    elif kind == "vllm_openai":
        assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and body["return_token_ids"] is True
        assert body["model"] == "m" and body["logprobs"] == 0 and body["stop_token_ids"] == [99]
    else:
        assert path == "/generate" and body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True
        assert body["sampling_params"]["max_new_tokens"] == 16 and body["sampling_params"]["stop_token_ids"] == [99]
    assert double.requests[1][1].get("input_ids", double.requests[1][1].get("prompt")) in (
        [1, 2, 3, 11, 12, 13, 4],
        {"prompt_token_ids": [1, 2, 3, 11, 12, 13, 4]},
    )


@pytest.mark.parametrize("status,retryable", [(500, True), (400, False)])
async def test_server_errors_are_infrastructure_errors(status, retryable):
    async with ScriptedTokenServerDouble([], status=status) as double:
        server = make_token_server(TokenServerConfig(kind="sglang", base_url=double.url))
        try:
            with pytest.raises(ModelError, match=f"HTTP {status}") as info:
                await server.generate([1], max_tokens=4, temperature=0.0)
        finally:
            await server.aclose()
    assert info.value.retryable is retryable


async def test_unreachable_server_names_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = make_token_server(TokenServerConfig(kind="llamacpp", base_url=f"http://127.0.0.1:{port}/v1"))
    try:
        with pytest.raises(ModelError, match=f"127.0.0.1:{port}"):
            await server.check()
        with pytest.raises(ModelError, match="/completion"):
            await server.generate([1], max_tokens=4, temperature=0.0)
    finally:
        await server.aclose()


def test_llamacpp_alignment_leaves_explicit_gaps():
    ids = [10, 235, 118, 321, 231, 5]
    probs = [
        {"id": 10, "logprob": -0.1},
        {"id": 118, "logprob": -0.2},
        {"id": 231, "logprob": -0.3},
        {"id": 5, "logprob": -0.4},
    ]
    assert align_llamacpp_logprobs(ids, probs) == [-0.1, None, -0.2, None, -0.3, -0.4]
    with pytest.raises(ValueError, match="match no generated token"):
        align_llamacpp_logprobs([1, 2], [{"id": 3, "logprob": -1.0}])


@pytest.mark.llm
async def test_llamacpp_native_completion_real_server(embedded_llm):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_llm.tokenizer_dir))
    server = make_token_server(TokenServerConfig(kind="llamacpp", base_url=embedded_llm.base_url))
    try:
        await server.check()
        for question, max_tokens in [
            ("What is 2+2? Answer with one number.", 24),
            ("Write a smiley emoji 😀 and three Chinese characters.", 24),
        ]:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
            )
            ids = tokenizer.encode(prompt, add_special_tokens=False)
            gen = await server.generate(ids, max_tokens=max_tokens, temperature=0.0)
            assert 0 < len(gen.token_ids) <= max_tokens and len(gen.logprobs) == len(gen.token_ids)
            assert gen.finish_reason in ("stop", "length")
            if gen.finish_reason == "stop":  # llama.cpp returns the end-of-turn token it sampled
                assert tokenizer.decode(gen.token_ids[-1:]) == "<|im_end|>"
            # A gap exactly where the text so far ends inside a UTF-8 character.
            for i, lp in enumerate(gen.logprobs):
                partial = tokenizer.decode(gen.token_ids[: i + 1]).endswith("\ufffd")
                assert (lp is None) == partial, (i, lp, partial)
                assert lp is None or lp <= 0.0
    finally:
        await server.aclose()
