"""Tinker through tinker-atropos: the env speaks its SGLang-style `/generate`, and the groups a
tinker-atropos trainer pulls from run-api become its datums. Tinker itself is a cloud service,
so both faces of tinker-atropos are played by `TinkerAtroposDouble` (tests/support)."""

from __future__ import annotations

from tests.support.embedded import embedded_tokenizer
import sys

import pytest
import yaml

from environments.models.token_mode.servers import TokenServerConfig, _REQUESTS, _RESPONSES
from environments.gsm8k.env import GSM8kAgentEnv
from tests.support.cli import run_cli
from tests.support.tinker_atropos_double import tinker_datums

from tests.support.run_api import (
    wait_for_batch,
    free_port,
    register_trainer,
    start_process,
    start_run_api,
    stop_process,
)

from .test_serve import check_trainer_view


def test_tinker_request_and_answer_follow_tinker_atropos_types():
    cfg = TokenServerConfig(kind="tinker", base_url="http://x")
    path, body = _REQUESTS["tinker"](cfg, [1, 2, 3], 16, 0.7, [2], None)
    assert path == "/generate"
    assert body == {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 16, "temperature": 0.7, "n": 1, "stop": [2]},
        "return_logprob": True,
    }
    # GenerateResponse: string finish_reason, (logprob, id, text) triples, no output_ids.
    answer = {
        "text": "hi",
        "meta_info": {
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "finish_reason": "stop",
            "output_token_logprobs": [[-0.5, 7, "h"], [-0.25, 2, "<|im_end|>"]],
        },
    }
    generation = _RESPONSES["tinker"](answer)
    assert generation.token_ids == [7, 2] and generation.logprobs == [-0.5, -0.25]
    assert generation.finish_reason == "stop" and generation.prompt_tokens == 3


def test_trainer_datums_mark_untrained_positions_and_refuse_missing_logprobs():
    group = {
        "tokens": [[5, 6, 7, 8], [5, 6, 9]],
        "scores": [1.0, 0.0],
        "inference_logprobs": [[1.0, 1.0, -0.1, -0.2], [1.0, 1.0, -0.3]],
    }
    datums, skipped = tinker_datums([group])
    assert skipped == 0 and datums[0]["advantages"] == [0.0, 0.5, 0.5] and datums[1]["advantages"] == [0.0, -0.5]
    assert tinker_datums([{**group, "scores": [0.0, 0.0]}]) == ([], 1)
    with pytest.raises(KeyError):  # a chat-mode group has no inference_logprobs: tinker-atropos crashes
        tinker_datums([{k: v for k, v in group.items() if k != "inference_logprobs"}])


def test_chat_mode_with_a_tinker_trainer_is_refused_at_start(tmp_path):
    config = tmp_path / "tinker.yaml"
    config.write_text(yaml.safe_dump({"tinker": {"lora_rank": 32}}))
    proc = run_cli(
        GSM8kAgentEnv,
        "serve",
        "--config",
        str(config),
        "--env.runtime.token_server",
        "off",
        "--openai.base_url",
        "http://127.0.0.1:9/v1",
        "--env.tokenizer_name",
        embedded_tokenizer(),
    )
    assert proc.returncode == 2
    assert "needs inference_logprobs" in proc.stderr and "--env.runtime.token_server" in proc.stderr
    assert "Traceback" not in proc.stderr and "cannot reach" not in proc.stderr  # refused before any connection


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_serve_into_run_api_with_the_tinker_double_end_to_end(embedded_llm, tmp_path):
    api, api_url = start_run_api(tmp_path)
    port = free_port()
    double = start_process(
        [
            sys.executable,
            "-m",
            "tests.support.tinker_atropos_double",
            "--sampler",
            embedded_llm.server_url,
            "--port",
            str(port),
        ],
        tmp_path / "double.log",
    )
    env = None
    batch = None
    try:
        register_trainer(api_url, tmp_path / "ckpt", batch_size=2, num_steps=1)
        config = tmp_path / "tinker.yaml"
        # tinker-atropos's own config layout: env / openai (server_type sglang, as its README asks) / tinker.
        config.write_text(
            yaml.safe_dump(
                {
                    "env": {
                        "group_size": 2,
                        "tokenizer_name": str(embedded_llm.tokenizer_dir),
                        "runtime": {"loop": {"max_turns": 2, "max_tokens": 48}},
                        "ensure_scores_are_not_same": False,
                        "rollout_server_url": api_url,
                    },
                    "openai": [
                        {
                            "base_url": f"http://127.0.0.1:{port}/v1",
                            "model_name": embedded_llm.model_name,
                            "server_type": "sglang",
                            "api_key": "x",
                        }
                    ],
                    "tinker": {"lora_rank": 32, "learning_rate": 4e-5, "max_token_trainer_length": 4096},
                }
            )
        )
        env = start_process(
            [sys.executable, "-m", "environments.gsm8k_agent_env", "serve", "--config", str(config)],
            tmp_path / "env.log",
        )
        batch = wait_for_batch(api_url, env, tmp_path / "env.log", timeout_s=1800)
        log = (tmp_path / "env.log").read_text()
    finally:
        for proc in (env, double, api):
            if proc is not None:
                stop_process(proc)
    assert "exact tokens from tinker token server" in log
    for group in batch:
        check_trainer_view(group)
        assert group["generation_params"]["token_server"] == "tinker"
    datums, skipped = tinker_datums(batch)
    assert len(datums) + 2 * skipped == sum(len(g["tokens"]) for g in batch)
    for datum in datums:
        assert len(datum["input"]) == len(datum["target_tokens"]) == len(datum["logprobs"])
        # every position the trainer pushes on carries the sampler's own logprob
        assert all(lp <= 0.0 for lp, a in zip(datum["logprobs"], datum["advantages"]) if a != 0.0)
