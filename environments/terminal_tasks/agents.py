"""Deterministic agents for checking tasks: the oracle runs the task's solution, no-op does nothing."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from environments.check_agents import NoOpAgent, OneCallOracle
from environments.terminal_tasks.tasks import PathMap, TerminalTask
from environments.terminal_tasks.verify import solution_script

__all__ = ["OracleAgent", "NoOpAgent", "TASK_LINE"]

TASK_LINE = re.compile(r"^Task: (\S+)$", re.M)


class OracleAgent(OneCallOracle):
    """Runs the task's solution/solve.sh with one terminal call, as Harbor's oracle agent does."""

    done = "Ran the reference solution."
    unknown = "I have no solution for this task."

    def __init__(self, tasks: Mapping[str, TerminalTask], workspace: str | None = None) -> None:
        # None: each task's workspace is its own working directory (the local backend mounts it there)
        self.tasks = dict(tasks)
        self.workspace = workspace

    def arguments(self, prompt: str) -> dict[str, Any] | None:
        task_match = TASK_LINE.search(prompt)
        task = self.tasks.get(task_match.group(1)) if task_match else None
        if task is None or not task.has_solution:
            return None
        workspace = self.workspace or task.workdir_root
        command = solution_script(task, workspace) if task.solution_dir else sampled_solution_script(task, workspace)
        # Harbor gives the oracle the task's whole agent timeout (task.toml `[agent] timeout_sec`).
        return {"command": command, "timeout": task.agent_timeout_s}


def sampled_solution_script(task: TerminalTask, workspace: str) -> str:
    """An Endless Terminals solved run's commands, in order, in one shell from the task's home, as its harness
    ran them (generator/env.py: one bash after `set -o pipefail`; a failing command does not stop the next)."""
    assert task.solution_commands
    paths = PathMap.for_task(task, workspace)
    env = "".join(f"export {k}={shlex.quote(paths(v))}\n" for k, v in task.solution_env.items())
    head = f"set -o pipefail\ncd {shlex.quote(paths(task.workdir))}\n{env}"
    return head + "\n".join(paths(c) for c in task.solution_commands)
