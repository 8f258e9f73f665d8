"""The terminal-tasks env on local sandbox slots: oracle 1.0 and no-op 0.0 on every bundled task."""

from __future__ import annotations

import asyncio
import json

import pytest

from environments.models.base import ModelTurn
from environments.terminal_tasks import BUNDLED_TASKS, NoOpAgent, OracleAgent, load_tasks_dir
from tests.terminal_tasks.conftest import make_env
from tests.support.cli import run_cli
from environments.terminal_tasks import TerminalTasksEnv
from tests.support.embedded import embedded_model_flags, small_group_flags


def test_bundled_tasks_cover_both_formats_and_all_run_locally():
    tasks = load_tasks_dir(BUNDLED_TASKS)
    assert len(tasks) >= 8
    assert {t.format for t in tasks} == {"harbor", "endless"}
    assert all(t.local_skip is None and t.solution_dir is not None for t in tasks)


class SleepingAgent:
    """Runs `sleep 30` in the terminal, turn after turn: only the time budget ends it."""

    async def chat(self, messages, tools, options) -> ModelTurn:
        args = json.dumps({"command": "sleep 30", "timeout": 60})
        call = {"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": args}}
        return ModelTurn(content=None, tool_calls=[call], finish_reason="tool_calls")


async def test_a_harbor_agent_timeout_caps_the_trajectory(scripted_server, tmp_path):
    env = make_env(scripted_server.base_url, tmp_path, loop={"time_budget_s": 120})
    async with env.runtime():
        await env.setup()
        task = next(t for t in env.tasks if t.format == "harbor").model_copy(update={"agent_timeout_s": 2.0})
        assert env.item_loop_config(task, env.loop_config()).time_budget_s == 2.0
        rollout = await env.rollout(task, model=SleepingAgent())
        # a task's longer timeout leaves a shorter --env.runtime.loop.time_budget_s in force
        relaxed = task.model_copy(update={"agent_timeout_s": 900.0})
        assert env.item_loop_config(relaxed, env.loop_config()).time_budget_s == 120
    assert rollout.result is not None and rollout.result.stop_reason == "time_budget"
    assert rollout.result.duration_s < 10
    assert rollout.duration_s < 25, rollout.duration_s  # the cancelled `sleep 30` does not hold the verifier up


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
    # the oracle went through the terminal tool, in the task's own working directory
    tool = json.loads(next(m for m in rollouts[0].result.messages if m["role"] == "tool")["content"])
    assert tool["exit_code"] == 0
    prompt = next(m for m in rollouts[0].result.messages if m["role"] == "user")["content"]
    assert f"Working directory: {env.tasks[0].workdir}" in prompt and "/workspace" not in prompt


@pytest.mark.llm
@pytest.mark.slow
def test_process_cli_runs_end_to_end_against_the_embedded_model(embedded_llm, tmp_path):
    out = tmp_path / "groups.jsonl"
    proc = run_cli(
        TerminalTasksEnv,
        "process",
        *embedded_model_flags(embedded_llm),
        "--env.total_steps",
        "1",
        "--env.ensure_scores_are_not_same",
        "False",
        *small_group_flags(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 1 and len(groups[0]["scores"]) == 2
    assert all(0.0 <= s <= 1.0 for s in groups[0]["scores"])
    first_user = next(m for m in groups[0]["messages"][0] if m["role"] == "user")["content"]
    assert "Working directory: /app" in first_user or "Working directory: /home/user" in first_user


def test_evaluate_cli_with_the_oracle_scores_the_tasks_it_is_given(tmp_path):
    proc = run_cli(
        TerminalTasksEnv,
        "evaluate",
        "--env.agent",
        "oracle",
        "--env.eval_size",  # the oracle on every task is the test above; this one is the command
        "3",
        "--env.data_dir_to_save_evals",
        str(tmp_path / "eval"),
        "--env.data_path_to_save_groups",
        str(tmp_path / "g.jsonl"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'eval/accuracy': 1.0" in proc.stdout and "'eval/n': 3" in proc.stdout
    assert "starting the embedded model server" not in proc.stderr  # a scripted agent needs no model
