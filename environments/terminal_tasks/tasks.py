"""Terminal tasks in their published formats, loaded into one `TerminalTask` model.

Harbor / Terminal-Bench 2 (read from Harbor's `models/task/config.py` and its docs page
"Task Structure"): a directory with `instruction.md`, `task.toml` (`[metadata]` free-form;
`[verifier] timeout_sec, env`; `[agent] timeout_sec`; `[solution] env`; `[environment]
build_timeout_sec, docker_image, cpus, memory_mb, storage_mb, allow_internet`),
`environment/` (build context, usually a Dockerfile), `solution/solve.sh` and
`tests/test.sh`. The harness copies `tests/` to /tests only at verification time and
`solution/` to /solution for the oracle; test.sh writes /logs/verifier/reward.txt (a number)
or reward.json (numeric metrics), reward.json read first (reward.py).

Endless Terminals (read from kanishkg/endless-terminals `generate_tasks.py`,
`generator/env.py`, `train/prepare_endless.py`): a `task_*` directory with `task.json`
(`description`, `truth`, `name`), `test_initial_state.py`, `test_final_state.py` and an
Apptainer `container.def` whose `%post` builds the initial state under /home/user, the
agent's working directory; the final test is copied in afterwards and run with pytest, a
pass is the reward. The hub dataset rows (`prepare_endless.py`) carry `description` and
`task_dir`, pointing at such directories.

Our sandboxes expose one writable workspace at a fixed path, so a task's own absolute paths
(its working directory, Harbor's /tests, /solution and /logs) are mapped into it
(`PathMap`). The environment is replayed into the workspace where that reproduces it
(files copied, commands run there); what needs an image (system packages) is recorded as
`local_skip` and runs only on a backend given the task's image.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from environments.terminal_tasks.runnability import Problem, scan_script

__all__ = [
    "TerminalTask",
    "SetupStep",
    "PathMap",
    "replay_command",
    "BUNDLED_TASKS",
    "LOCAL_BASE_IMAGES",
    "SANDBOX_ENV",
    "SANDBOX_ENV_WHY",
]

BUNDLED_TASKS = Path(__file__).parent / "data"

# Base images whose userland this machine stands in for (Debian/Ubuntu with python3); packages
# beyond that are checked against this machine itself (runnability.Machine).
LOCAL_BASE_IMAGES = re.compile(r"^(docker://)?(python|ubuntu|debian|buildpack-deps)(:|$)|^\./ubuntu_[\d.]+\.sif$")
# Variables the sandbox owns: its PATH leads to the interpreter the verifier runs, HOME is the verifier's own.
SANDBOX_ENV = frozenset({"PATH", "HOME"})
SANDBOX_ENV_WHY = "kept as the sandbox sets them"


class SetupStep(BaseModel):
    """One step of building the initial state, in the task's own paths."""

    kind: Literal["workdir", "copy", "run", "env"]
    source: str | None = None  # copy: path in the build context
    target: str | None = None  # workdir/copy: task path
    command: str | None = None  # run
    name: str | None = None  # env
    value: str | None = None


class TerminalTask(BaseModel):
    id: str
    format: Literal["harbor", "endless"]
    instruction: str
    path: Path = Field(..., description="The task's directory")
    workdir: str = Field(..., description="Working directory in the task's own filesystem")
    setup: list[SetupStep] = Field(default_factory=list)
    context_dir: Path | None = Field(None, description="Where COPY sources live (Harbor: environment/)")
    tests_dir: Path | None = Field(None, description="Harbor: tests/ (test.sh inside)")
    final_test: Path | None = Field(None, description="Endless Terminals: test_final_state.py")
    initial_test: Path | None = Field(None, description="Endless Terminals: test_initial_state.py")
    solution_dir: Path | None = None
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    verifier_env: dict[str, str] = Field(default_factory=dict)
    solution_env: dict[str, str] = Field(default_factory=dict)
    allow_internet: bool = Field(
        False, description="The task asks for network (Harbor's default; Endless Terminals tasks do not)"
    )
    docker_image: str | None = Field(None, description="Prebuilt image named by the task")
    base_image: str | None = Field(None, description="FROM of its Dockerfile / Apptainer def")
    image_recipe: str | None = Field(None, description="Dockerfile or container.def text")
    build_timeout_s: float = Field(600.0, gt=0, description="Harbor [environment] build_timeout_sec")
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    local_problems: list[Problem] = Field(
        default_factory=list, description="Every reason the local sandbox cannot reproduce this task"
    )
    local_skip: str | None = Field(None, description="Why the local sandbox cannot reproduce this task (None: it can)")
    unsupported: list[str] = Field(
        default_factory=list, description="Task fields the local backend does not honour, one line each"
    )
    image_skip: str | None = Field(
        None, description="Why its image cannot be built as its publisher builds it (None: it can)"
    )
    solution_commands: list[str] | None = Field(
        None, description="Endless Terminals: the commands of a solved sampled solution (solutions/*summary.json)"
    )
    sandbox_pytest_test_script: str | None = Field(
        None, description="test.sh with its test-tool bootstrap replaced by the sandbox's pytest (opt-in)"
    )
    test_script: str | None = Field(None, description="Run instead of tests/test.sh when set (the opt-in)")

    @property
    def has_solution(self) -> bool:
        return self.solution_dir is not None or bool(self.solution_commands)

    @property
    def environment(self) -> dict[str, str]:
        """The image's environment ([environment.env], %environment; PATH and HOME left out), in the task's paths."""
        return {s.name: s.value or "" for s in self.setup if s.kind == "env" and s.name}

    @property
    def only_bootstrap_blocks(self) -> bool:
        """Runs locally once test.sh uses the sandbox's pytest instead of fetching its own."""
        return bool(self.local_problems) and all(p.bootstrap for p in self.local_problems)

    @property
    def workdir_root(self) -> str:
        """The directory mapped onto the workspace: the first WORKDIR (later ones nest inside it)."""
        return next((s.target for s in self.setup if s.kind == "workdir" and s.target), self.workdir)


# -- path mapping -------------------------------------------------------------------------------


class PathMap:
    """Rewrites a task's absolute paths to where they live in the sandbox workspace."""

    def __init__(self, mapping: dict[str, str]) -> None:
        # Longest prefix first, so /app/project wins over /app.
        clean = {k.rstrip("/"): v for k, v in mapping.items()}
        if "" in clean:
            raise ValueError("the filesystem root cannot be mapped onto the workspace")
        self.mapping = dict(sorted(clean.items(), key=lambda kv: -len(kv[0])))
        alternatives = "|".join(re.escape(p) for p in self.mapping)
        # A prefix counts only as a whole path: not inside a longer word or path (/application, /x/app).
        self._re = re.compile(rf"(?<![\w.\-/~$])({alternatives})(?=/|(?![\w.\-]))") if self.mapping else None

    @classmethod
    def for_task(
        cls, task: TerminalTask, workspace: str, *, verify_dir: str | None = None, solution_dir: str | None = None
    ) -> "PathMap":
        mapping = {task.workdir_root: workspace}
        if verify_dir:
            mapping["/tests"] = f"{verify_dir}/tests"
            mapping["/logs"] = f"{verify_dir}/logs"
        if solution_dir:
            mapping["/solution"] = f"{solution_dir}/solution"
        return cls(mapping)

    def __call__(self, text: str) -> str:
        if self._re is None:
            return text
        return self._re.sub(lambda m: self.mapping[m.group(1)], text)


def replay_command(step: SetupStep, *, image_has_packages: bool) -> str:
    """A RUN step as the workspace replays it: installs, downloads and account changes dropped.

    Locally those are satisfied by this machine or the task was skipped; on an image backend the image did them.
    """
    assert step.kind == "run" and step.command is not None
    kept, _ = scan_script(step.command, where="", machine=None, roots=("/",), ownership_checked=False)
    return "\n".join(kept)
