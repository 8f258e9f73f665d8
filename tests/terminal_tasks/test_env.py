"""The terminal-tasks env on local sandbox slots: oracle 1.0 and no-op 0.0 on every bundled task."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from environments.terminal_tasks import NoOpAgent, OracleAgent, load_tasks_dir, BUNDLED_TASKS
from tests.terminal_tasks.conftest import make_env


def test_bundled_tasks_cover_both_formats_and_all_run_locally():
    tasks = load_tasks_dir(BUNDLED_TASKS)
    assert len(tasks) >= 8
    assert {t.format for t in tasks} == {"harbor", "endless"}
    assert all(t.local_skip is None and t.solution_dir is not None for t in tasks)


@pytest.mark.slow
async def test_oracle_scores_one_and_noop_zero_on_every_bundled_task(scripted_server, tmp_path):
    env = make_env(scripted_server.base_url, tmp_path)
    async with env.runtime():
        await env.setup()
        assert sum(env.skipped.values()) == 0
        oracle = OracleAgent(env.by_id)
        n = len(env.tasks)
        rollouts = await asyncio.gather(
            *(env.rollout(t, model=oracle) for t in env.tasks), *(env.rollout(t, model=NoOpAgent()) for t in env.tasks)
        )
    ids = [t.id for t in env.tasks]
    assert {i: r.error for i, r in zip(ids * 2, rollouts) if r.error} == {}
    assert dict(zip(ids, (r.score for r in rollouts[:n]))) == dict.fromkeys(ids, 1.0)
    assert dict(zip(ids, (r.score for r in rollouts[n:]))) == dict.fromkeys(ids, 0.0)
    # the oracle went through the terminal tool, and saw the task's paths mapped into the workspace
    tool = json.loads(next(m for m in rollouts[0].result.messages if m["role"] == "tool")["content"])
    assert tool["exit_code"] == 0
    prompt = next(m for m in rollouts[0].result.messages if m["role"] == "user")["content"]
    assert "/workspace" in prompt and "/home/user" not in prompt and "/app" not in prompt
