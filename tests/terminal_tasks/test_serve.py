"""`serve` into atroposlib's real run-api: the oracle's terminal-task groups reach a trainer scored 1.0."""

from __future__ import annotations

import sys

import pytest

from tests.support.run_api import wait_for_batch, register_trainer, start_process, start_run_api, stop_process


@pytest.mark.slow
def test_serve_with_the_oracle_feeds_run_api(tmp_path):
    api, api_url = start_run_api(tmp_path)
    env = None
    try:
        register_trainer(api_url, tmp_path / "ckpt", batch_size=2, num_steps=10, max_token_len=8192)
        env = start_process(
            [
                sys.executable,
                "-m",
                "environments.terminal_tasks_env",
                "serve",
                "--env.rollout_server_url",
                api_url,
                "--env.wandb_name",
                "terminal-tasks-test",
                "--env.agent",
                "oracle",
                "--env.group_size",
                "2",
                "--env.max_num_workers",
                "1",
                "--env.ensure_scores_are_not_same",
                "False",
                "--env.data_path_to_save_groups",
                str(tmp_path / "served.jsonl"),
            ],
            tmp_path / "env.log",
        )
        batch = wait_for_batch(api_url, env, tmp_path / "env.log", exit_ok=False)
    finally:
        if env is not None:
            stop_process(env)
        stop_process(api)
    assert sum(len(g["tokens"]) for g in batch) == 2
    for group in batch:
        assert group["scores"] == [1.0] * len(group["tokens"])
        assert all(len(t) == len(m) for t, m in zip(group["tokens"], group["masks"]))
        user = next(m for m in group["messages"][0] if m["role"] == "user")["content"]
        assert "Working directory: /app" in user or "Working directory: /home/user" in user
