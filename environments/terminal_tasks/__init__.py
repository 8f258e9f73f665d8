"""Terminal-Bench 2 (Harbor) and Endless Terminals tasks in sandbox slots; entry: environments/terminal_tasks_env.py."""

from environments.terminal_tasks.agents import NoOpAgent, OracleAgent
from environments.terminal_tasks.env import TerminalTasksEnv, TerminalTasksEnvConfig
from environments.terminal_tasks.endless import load_endless_task
from environments.terminal_tasks.harbor import load_harbor_task
from environments.terminal_tasks.loaders import load_tasks_dir
from environments.terminal_tasks.tasks import BUNDLED_TASKS, TerminalTask

__all__ = [
    "TerminalTasksEnv",
    "TerminalTasksEnvConfig",
    "TerminalTask",
    "OracleAgent",
    "NoOpAgent",
    "load_tasks_dir",
    "load_harbor_task",
    "load_endless_task",
    "BUNDLED_TASKS",
]
