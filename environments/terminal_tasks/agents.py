"""Deterministic agents for checking tasks: the oracle runs the task's solution, no-op does nothing."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping

from environments.models.base import ModelTurn
from environments.terminal_tasks.tasks import PathMap, TerminalTask
from environments.terminal_tasks.verify import solution_script

__all__ = ["OracleAgent", "NoOpAgent", "TASK_LINE"]

TASK_LINE = re.compile(r"^Task: (\S+)$", re.M)


class OracleAgent:
    """Runs the task's solution/solve.sh with one terminal call, as Harbor's oracle agent does."""

    def __init__(self, tasks: Mapping[str, TerminalTask], workspace: str = "/workspace") -> None:
        self.tasks = dict(tasks)
        self.workspace = workspace

    async def chat(self, messages, tools, *, temperature, max_tokens) -> ModelTurn:
        if any(m.get("role") == "tool" for m in messages):
            return ModelTurn(content="Ran the reference solution.", finish_reason="stop")
        prompt = next(m["content"] for m in messages if m.get("role") == "user")
        task_match = TASK_LINE.search(prompt)
        task = self.tasks.get(task_match.group(1)) if task_match else None
        if task is None or not task.has_solution:
            return ModelTurn(content="I have no solution for this task.", finish_reason="stop")
        command = (
            solution_script(task, self.workspace)
            if task.solution_dir
            else sampled_solution_script(task, self.workspace)
        )
        args = {"command": command, "timeout": 120}
        call = {"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": json.dumps(args)}}
        return ModelTurn(content=None, tool_calls=[call], finish_reason="tool_calls")


def sampled_solution_script(task: TerminalTask, workspace: str) -> str:
    """An Endless Terminals solved run's commands, in order, in one shell from the task's home (as it ran them)."""
    assert task.solution_commands
    paths = PathMap.for_task(task, workspace)
    env = "".join(f"export {k}={shlex.quote(paths(v))}\n" for k, v in task.solution_env.items())
    return f"cd {shlex.quote(paths(task.workdir))}\n{env}" + "\n".join(paths(c) for c in task.solution_commands)


class NoOpAgent:
    """Answers at once without touching anything."""

    async def chat(self, messages, tools, *, temperature, max_tokens) -> ModelTurn:
        return ModelTurn(content="Nothing to do.", finish_reason="stop")
