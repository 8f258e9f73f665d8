"""`serve` of the τ² env into atroposlib's real `run-api`: agent and simulated user on scripted chat
servers; a trainer registers and pulls a group whose scores differ (one conversation cancels the order
and names the refund, the other only looks)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer
from tests.support.run_api import wait_for_batch, register_trainer, start_process, start_run_api, stop_process
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread
from tests.tau.scripts import OPENING, call, scripted_user


@pytest.mark.slow
def test_serve_hands_a_trainer_a_scored_group(tmp_path: Path) -> None:
    cfg = EmbeddedLLMConfig()
    tokenizer_dir = ensure_gguf_tokenizer(cfg.model_path, chat_template=cfg.resolved_chat_template())
    cancel = itertools.cycle([True, False])

    def agent(body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        if last["role"] == "user" and last["content"] == OPENING:
            if next(cancel):
                args = {"order_id": "#W1000001", "reason": "no longer needed"}
                return {"content": None, "tool_calls": [call("cancel_pending_order", args)]}
            return {"content": None, "tool_calls": [call("get_order_details", {"order_id": "#W1000001"})]}
        if last["role"] == "tool":
            if '"cancelled"' in last["content"]:
                return {"content": "Cancelled: 44.49 goes back to your gift card."}
            return {"content": "Your order is pending."}
        return {"content": "Done."}

    api, api_url = start_run_api(tmp_path)
    env = None
    try:
        register_trainer(api_url, tmp_path / "ckpt", batch_size=2, num_steps=1)
        with (
            serving_in_a_thread(ScriptedOpenAIServer([agent] * 100)) as agent_server,
            serving_in_a_thread(ScriptedOpenAIServer([scripted_user] * 100)) as user_server,
        ):
            env = start_process(
                [
                    sys.executable,
                    "-m",
                    "environments.tau_env",
                    "serve",
                    "--env.rollout_server_url",
                    api_url,
                    "--openai.base_url",
                    agent_server.base_url,
                    "--openai.model_name",
                    "scripted",
                    "--env.tokenizer_name",
                    str(tokenizer_dir),
                    "--env.user_model.base_url",
                    user_server.base_url,
                    "--env.task_split",
                    "train",
                    "--env.max_num_workers",
                    "1",
                    "--env.group_size",
                    "2",
                ],
                tmp_path / "env.log",
            )
            batch = wait_for_batch(api_url, env, tmp_path / "env.log")
    finally:
        if env is not None:
            stop_process(env)
        stop_process(api)
    (group,) = batch
    assert sorted(group["scores"]) == [0.0, 1.0]
    assert len(group["tokens"]) == len(group["masks"]) == 2
    assert "registered with" in (tmp_path / "env.log").read_text()
