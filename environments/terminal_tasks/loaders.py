"""Every task under a directory (Harbor's and Endless Terminals' formats side by side), and the rows of the
Endless Terminals hub dataset resolved to their task directories."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from environments.terminal_tasks.endless import load_endless_task
from environments.terminal_tasks.harbor import load_harbor_task
from environments.terminal_tasks.runnability import Machine
from environments.terminal_tasks.tasks import TerminalTask

__all__ = ["load_tasks_dir", "load_endless_rows"]


def _is_task(d: Path) -> bool:
    return ((d / "task.toml").is_file() and (d / "instruction.md").is_file()) or (d / "task.json").is_file()


def load_tasks_dir(root: Path, *, errors: list[str] | None = None) -> list[TerminalTask]:
    """Every Harbor (task.toml) and Endless Terminals (task.json) task at or under `root` (two levels).

    With `errors`, a task that cannot be read is reported there ("name: why") and the rest still load.
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"--env.tasks_dir {root} is not a directory")
    # A task's own folders are not tasks (a Harbor export of an Endless task keeps task.json in environment/).
    candidates = [root] + ([] if _is_task(root) else sorted(p for p in root.iterdir() if p.is_dir()))
    candidates += sorted(q for p in candidates[1:] if not _is_task(p) for q in p.iterdir() if q.is_dir())
    machine = Machine()
    tasks = []
    for d in candidates:
        try:
            if (d / "task.toml").is_file() and (d / "instruction.md").is_file():
                tasks.append(load_harbor_task(d, machine=machine))
            elif (d / "task.json").is_file():
                tasks.append(load_endless_task(d, machine=machine))
        except (ValueError, OSError, KeyError, TypeError, tomllib.TOMLDecodeError) as exc:
            if errors is None:
                raise
            errors.append(f"{d.name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return tasks


def load_endless_rows(rows: Any, tasks_dir: Path | None, *, errors: list[str] | None = None) -> list[TerminalTask]:
    """Rows of the Endless Terminals hub dataset (`description`, `task_dir` or `extra_info.task_dir`).

    `task_dir` names the generated task directory; its last component is looked up under
    `tasks_dir` when given (the dataset's paths are those of the machine that built it).
    With `errors`, a row whose task cannot be read is reported there and the rest still load.
    """
    machine = Machine()
    tasks = []
    for row in rows:
        ref = (
            row.get("task_dir")
            or (row.get("extra_info") or {}).get("task_dir")
            or (row.get("reward_spec") or {}).get("ground_truth")
        )
        if not ref:
            raise ValueError(f"dataset row without task_dir: {sorted(row)}")
        path = Path(ref)
        if tasks_dir is not None:
            path = Path(tasks_dir) / path.name
        try:
            if not (path / "task.json").is_file():
                raise ValueError(
                    f"task directory {path} not found; pass --env.tasks_dir holding the generated task_* folders"
                )
            tasks.append(load_endless_task(path, description=row.get("description"), machine=machine))
        except (ValueError, OSError, KeyError, TypeError) as exc:
            if errors is None:
                raise
            errors.append(f"{path.name}: {type(exc).__name__}: {exc}")
    return tasks
