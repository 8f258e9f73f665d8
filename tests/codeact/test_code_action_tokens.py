"""Token mode under smolagents' CodeAgent: every model call's trained tokens are exactly the ids the token
server sampled (cut right after the stop string the model wrote), with its logprobs, after exactly the
prompt ids the server was sent; one trainer sequence per model call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from atroposlib.envs.base import APIServerConfig

pytest.importorskip("smolagents")

from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer  # noqa: E402
from environments.smolagents_gaia_env import SmolagentsGaiaEnv, SmolagentsGaiaEnvConfig  # noqa: E402
from tests.tokens.doubles import Scripted, ScriptedTokenServerDouble  # noqa: E402

ACTIONS = ["x = 5", "print('x is', x)", "final_answer(x)"]


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    cfg = EmbeddedLLMConfig()
    return str(ensure_gguf_tokenizer(cfg.model_path, chat_template=cfg.resolved_chat_template()))


async def test_trained_tokens_are_the_sampled_tokens_call_by_call(tokenizer_dir: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    # What the "model" samples: a code action, then text past the closing tag (cut by the stop
    # string), then its end of turn. Logprobs differ per position so a shift would show.
    sampled = [
        tok.encode(f"Thought: step {i}.\n<code>\n{code}\n</code>\nObservation: made up", add_special_tokens=False)
        + [end_of_turn]
        for i, code in enumerate(ACTIONS)
    ]
    script = [Scripted(ids, [-0.01 * (k + 1) - i for k in range(len(ids))]) for i, ids in enumerate(sampled)]
    async with ScriptedTokenServerDouble(list(script)) as server:
        config = SmolagentsGaiaEnvConfig(
            tokenizer_name=tokenizer_dir,
            use_wandb=False,
            data_path_to_save_groups=None,
            runtime={  # confinement is tested in test_code_actions.py; here only the tokens: unconfined
                "token_server": "vllm",
                "tool_backend": "local",
                "unconfined_tools": True,
                "workspace": {"workspace_root": str(tmp_path / "ws")},
                "loop": {"temperature": 0.8},
            },
            max_token_length=16384,
            split_sequences="all",  # every model call's sequence (docs/trainers.md), to compare each one
        )
        server_config = APIServerConfig(base_url=server.url, model_name="m", api_key="x", server_type="openai")
        env = SmolagentsGaiaEnv(config, [server_config])
        async with env.runtime():
            await env.setup()
            item = next(t for t in env.tasks if t["task_id"] == "offline-txt-log")
            rollout = await env.rollout(item)
            group = env.build_group([rollout])
    assert rollout.error is None, rollout.error
    assert rollout.score == 1.0 and rollout.result.final_answer == 5
    assert len(server.requests) == 3
    assert len(group["tokens"]) == 3  # one trainer sequence per model call
    assert group["group_overrides"]["sequence_rollouts"] == [0, 0, 0]  # all three from the one rollout
    for k, ((_, request), tokens, masks, logprobs) in enumerate(
        zip(server.requests, group["tokens"], group["masks"], group["inference_logprobs"])
    ):
        prompt = request["prompt"]["prompt_token_ids"]
        assert request["temperature"] == 0.8
        assert tokens[: len(prompt)] == prompt  # the sequence starts with what the server was sent
        assert all(m == -100 for m in masks[: len(prompt)])
        generated = tokens[len(prompt) :]
        assert masks[len(prompt) :] == generated  # every generated token trained
        assert generated == sampled[k][: len(generated)]  # a prefix of what was sampled, never re-tokenized
        text = tok.decode(generated)
        assert text.rstrip().endswith("</code>") and "Observation" not in text
        assert logprobs[len(prompt) :] == script[k].logprobs[: len(generated)]
        if k:  # the next prompt holds the previous code action's observation
            assert "Observation" in tok.decode(prompt)
    assert "x is 5" in tok.decode(server.requests[2][1]["prompt"]["prompt_token_ids"])


@pytest.mark.llm
@pytest.mark.slow
def test_process_on_the_embedded_model_writes_scored_groups(embedded_llm, tmp_path: Path) -> None:
    from tests.support.cli import run_cli
    from tests.support.embedded import embedded_model_flags, small_group_flags

    out = tmp_path / "codeact.jsonl"
    proc = run_cli(
        SmolagentsGaiaEnv,
        "process",
        *embedded_model_flags(embedded_llm),
        "--env.total_steps",
        "1",
        "--env.runtime.token_server",
        "llamacpp",
        "--env.max_token_length",
        "4000",  # the test server's context is 4096; smolagents' system prompt alone is ~2.4k tokens
        "--env.runtime.sandbox.backend.data_root",
        str(tmp_path / "sb"),
        *small_group_flags(out, max_turns=1, max_tokens=32),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 1
    group = groups[0]
    assert group["generation_params"]["token_server"] == "llamacpp"
    assert group["generation_params"]["agent"].startswith("smolagents 1.")
    infos = group["rollout_info"]
    assert sorted({i["rollout"] for i in infos}) == [0, 1]  # both rollouts, each a sequence per model call
    assert all(0.0 <= s <= 1.0 for s in group["scores"])
    for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"]):
        assert len(tokens) == len(masks) == len(logprobs)
        trained = [i for i, m in enumerate(masks) if m != -100]
        assert trained and all(masks[i] == tokens[i] and logprobs[i] <= 0.0 for i in trained)
