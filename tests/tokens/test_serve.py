"""`serve` into a real Atropos rollout API: atroposlib's `run-api` runs as a process, the GSM8k
env serves into it in Phase 2 (exact tokens from the embedded llama.cpp server), and a small
trainer-like client registers, pulls `/batch` and checks the groups it receives."""

from __future__ import annotations

import sys
import time

import httpx
import pytest
import yaml

from tests.support.embedded import embedded_model_flags, small_group_flags
from tests.support.run_api import wait_for_batch, register_trainer, start_process, start_run_api, stop_process

from .test_phase2_env import TOOL_CALL_GRAMMAR, trained_spans


def check_trainer_view(group: dict, *, logprobs_required: bool = True) -> None:
    """What a trainer relies on in one group it pulled from run-api."""
    n = len(group["tokens"])
    assert n == len(group["masks"]) == len(group["scores"]) == len(group["messages"])
    if logprobs_required:
        assert len(group["inference_logprobs"]) == n
        for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"]):
            assert len(tokens) == len(masks) == len(logprobs) < 4096
            # trained positions carry a real logprob; 1.0 marks exactly the untrained ones
            assert all((m != -100) == (lp <= 0.0) for m, lp in zip(masks, logprobs))
            assert all(m == t for m, t in zip(masks, tokens) if m != -100)
            assert any(m != -100 for m in masks)


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(3600)  # on 2 shared cores a default group takes minutes
def test_default_serve_feeds_a_trainer_groups_with_reward_variance(tmp_path):
    """The README's serve command, no other flags: the embedded model, the GSM8k format reward,
    the trainer's step count; run-api hands a trainer >= 2 groups whose scores differ."""
    api, api_url = start_run_api(tmp_path)
    env = None
    batches: list[list[dict]] = []
    try:
        # batch_size 4 = one default group per step; 2 steps: serve stops once the trainer took both.
        register_trainer(api_url, tmp_path / "ckpt", batch_size=4, num_steps=2)
        env = start_process(
            [sys.executable, "-m", "environments.gsm8k_agent_env", "serve", "--env.rollout_server_url", api_url],
            tmp_path / "env.log",
        )
        deadline = time.monotonic() + 3600  # 2 cores shared by many jobs: minutes per group
        while sum(len(b) for b in batches) < 2:
            assert time.monotonic() < deadline, (tmp_path / "env.log").read_text()[-3000:]
            batch = httpx.get(api_url + "/batch", timeout=10).json().get("batch")
            if batch is not None:
                batches.append(batch)
                continue
            if env.poll() is not None:  # serve stopped by itself: what it queued must still arrive
                assert env.returncode == 0, (tmp_path / "env.log").read_text()[-3000:]
            time.sleep(2)
        env.wait(600)  # the trainer's last step is done: serve stops by itself
        log = (tmp_path / "env.log").read_text()
    finally:
        if env is not None:
            stop_process(env)
        stop_process(api)
    assert env.returncode == 0, log[-3000:]
    assert "serve: stopping: the trainer's run is done" in log and "Traceback" not in log
    assert "registered with" in log and "gsm8k_agent_0" in log  # wandb_name defaulted to the env's name
    groups = [g for b in batches for g in b]
    assert len(groups) >= 2
    for group in groups:
        check_trainer_view(group)
        assert len(set(group["scores"])) > 1  # reward variance: the format reward separates answers
        params = group["generation_params"]
        assert params["token_server"] == "llamacpp" and params["temperature"] == 0.7
        assert {"top_k", "top_p", "min_p", "max_tokens"} <= set(params)
        assert params["logprobs"].startswith("log-softmax of the raw logits")
        assert params["missing_logprobs"]["policy"] == "mask"
        assert len(params["missing_logprobs"]["per_sequence"]) == len(group["tokens"])
    sent = [line for line in log.splitlines() if "sent to the trainer" in line]
    assert len(sent) >= 2


@pytest.mark.llm
@pytest.mark.slow
def test_serve_feeds_run_api_and_a_trainer_pulls_exact_token_groups(embedded_llm, tmp_path):
    from transformers import AutoTokenizer

    api, api_url = start_run_api(tmp_path)
    env = None
    try:
        # The trainer registers first; the env waits for it.
        register_trainer(api_url, tmp_path / "ckpt", batch_size=2, num_steps=10)

        config = tmp_path / "config.yaml"
        # The grammar's products rarely answer the question: equal scores must not be dropped here.
        config.write_text(
            yaml.safe_dump(
                {
                    "env": {
                        "runtime": {"extra_body": {"grammar": TOOL_CALL_GRAMMAR}},
                        "ensure_scores_are_not_same": False,
                    }
                }
            )
        )
        env = start_process(
            [
                sys.executable,
                "-m",
                "environments.gsm8k_agent_env",
                "serve",
                "--config",
                str(config),
                "--env.rollout_server_url",
                api_url,
                "--env.wandb_name",
                "gsm8k-phase2-test",
                *embedded_model_flags(embedded_llm),
                "--env.runtime.token_server",
                "llamacpp",
                "--env.max_num_workers",
                "1",
                *small_group_flags(tmp_path / "served.jsonl"),
            ],
            tmp_path / "env.log",
        )
        batch = wait_for_batch(api_url, env, tmp_path / "env.log", exit_ok=False)
    finally:
        if env is not None:
            stop_process(env)
        stop_process(api)

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_llm.tokenizer_dir))
    assert sum(len(g["tokens"]) for g in batch) == 2
    for group in batch:
        assert (
            len(group["tokens"])
            == len(group["masks"])
            == len(group["scores"])
            == len(group["inference_logprobs"])
            == len(group["messages"])
        )
        assert all(0.0 <= s <= 1.0 for s in group["scores"])
        for tokens, masks, logprobs, messages in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], group["messages"]
        ):
            assert len(tokens) == len(masks) == len(logprobs) < 4096
            assert all((lp <= 0.0) == (m != -100) for m, lp in zip(masks, logprobs))
            assistants = [m for m in messages if m["role"] == "assistant"]
            spans = trained_spans(masks)
            assert len(spans) == len(assistants) >= 1
            for (start, end), msg in zip(spans, assistants):
                text = tokenizer.decode(tokens[start:end])
                assert text.startswith("<tool_call>\n") and text.endswith("</tool_call><|im_end|>")
                assert msg["tool_calls"][0]["function"]["name"] == "python"
