"""Terminal tasks (Terminal-Bench 2 / Harbor format, Endless Terminals) in sandbox slots.

python -m environments.terminal_tasks_env evaluate --env.agent oracle     # every bundled task scores 1.0
python -m environments.terminal_tasks_env process --env.tasks_dir PATH --env.total_steps 4
python -m environments.terminal_tasks_env serve --env.dataset obiwan96/endless-terminals-train --env.tasks_dir TASKS
"""

from environments.terminal_tasks.env import TerminalTasksEnv, TerminalTasksEnvConfig

__all__ = ["TerminalTasksEnv", "TerminalTasksEnvConfig"]

if __name__ == "__main__":
    TerminalTasksEnv.cli()
