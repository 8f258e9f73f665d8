"""Terminal tasks (Terminal-Bench 2 / Harbor, Endless Terminals) in sandbox slots.

Each trajectory gets a slot with the task's initial state built in its workspace; the
instruction is the prompt; the tools are terminal and file. Afterwards the task's own
tests run on a pristine copy (verify.py) and their verdict is the reward: Harbor's
reward.txt / reward.json (partial credit as the task writes it), Endless Terminals'
pytest exit status.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from environments.agent_loop import AgentLoopConfig, AgentResult
from environments.hermes_base_env import (
    HermesAgentBaseEnv,
    HermesAgentEnvConfig,
    HermesEnvError,
    Rollout,
)
from environments.models.base import ChatModel
from environments.runtime import RuntimeConfig
from environments.terminal_tasks.agents import NoOpAgent, OracleAgent
from backends.docker import DockerBackendConfig
from backends.task_container import TaskContainerError
from environments.image_sandboxes import ImageRecipe, ImageSandboxes, ImageUnavailable
from environments.terminal_tasks.container_run import (
    EndlessUser,
    TaskContainerExecutor,
    command_prefix,
    endless_pytest,
    initial_state_from_build,
    task_container,
    task_spec,
    unresolved_hosts,
    verify_in_container,
)
from environments.terminal_tasks.genuine import GenuineCheck
from environments.terminal_tasks.sandboxes import endless_recipe, task_recipe
from environments.terminal_tasks.loaders import load_endless_rows, load_tasks_dir
from environments.terminal_tasks.tasks import BUNDLED_TASKS, PathMap, TerminalTask
from environments.terminal_tasks.verify import parse_verdict, setup_script, verify_script
from slots.executor import ExecPolicy
from tools.context import ToolContext, ToolLimits

__all__ = ["TerminalTasksEnvConfig", "TerminalTasksEnv", "load_dataset_tasks"]

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are an expert at the Linux command line. Complete the task with the terminal and file tools. "
    "Work in the given working directory. When the task is done, reply with a short summary and no tool call."
)


class VerifierError(RuntimeError):
    """The task's verifier produced no reward (Harbor: a trial error); the rollout is an infrastructure failure."""


class TerminalTasksEnvConfig(HermesAgentEnvConfig):
    max_token_length: int = Field(8192, gt=0, description="Longest token sequence a group may hold")
    runtime: RuntimeConfig = Field(
        # A command may ask for up to an hour: a task's [agent] timeout_sec ends its trajectory anyway.
        default_factory=lambda: RuntimeConfig(tool_limits=ToolLimits(max_timeout_s=3600.0)),
        description="How rollouts run (environments/runtime.py); terminal tasks run in sandbox slots",
    )

    @field_validator("runtime", mode="before")
    @classmethod
    def _hour_long_commands(cls, value: Any) -> Any:
        """A runtime given as a mapping keeps this env's longest command timeout unless it names one."""
        if not isinstance(value, dict):
            return value
        limits = dict(value.get("tool_limits") or {})
        limits.setdefault("max_timeout_s", 3600.0)
        return {**value, "tool_limits": limits}

    tasks_dir: str | None = Field(
        None, description="Directory of Harbor and/or Endless Terminals tasks (default: the bundled ones)"
    )
    dataset: str | None = Field(
        None,
        description="Endless Terminals rows (description, task_dir) from the hub "
        "(e.g. obiwan96/endless-terminals-train) "
        "or a local .parquet/.jsonl/save_to_disk directory; task_dir is looked up in --env.tasks_dir",
    )
    split: str = Field("train", description="Split of --env.dataset")
    limit: int | None = Field(None, ge=1, description="Use at most this many tasks")
    agent: Literal["model", "oracle", "noop"] = Field("model", description="model, or a scripted check agent")
    image_registry: str = Field(
        "hermes-rl-tasks",
        description="Registry prefix of the task images Nomad/Modal run, and of the images the docker backend "
        "builds from tasks' Dockerfiles (content tags)",
    )
    setup_timeout_s: float = Field(300.0, gt=0, description="Building a task's initial state in its slot")
    bootstrap_tests_with_sandbox_pytest: bool = Field(
        False,
        description="Local backend and docker task containers: run a task's test.sh without its fetching of test "
        "tools (curl, uv, uvx pytest), with the sandbox's (the image's) own pytest instead; stated in each result",
    )
    task_network: Literal["auto", "allow", "forbid"] = Field(
        "auto",
        description="Whether a task's allow_internet (Harbor's default: true) gives its commands network: allow | "
        "forbid | auto = allow where network is the container's own (docker/Nomad/Modal), forbid on the local backend, "
        "where it is this machine's, loopback included (run-api, the model server)",
    )
    harbor_runtime: Literal["task-container", "slots"] = Field(
        "task-container",
        description="Harbor tasks on the docker backend: a container of the task's image per trajectory, as Harbor "
        "runs them (root, writable, tests copied in afterwards), or the shared slots (the older path); Nomad and "
        "Modal run slots (their adapters give no task container yet)",
    )
    check_initial_state: bool = Field(
        True,
        description="Run an Endless Terminals task's test_initial_state.py once built (failing it voids the rollout)",
    )
    endless_user: EndlessUser = Field(
        "invoking",
        description="Endless Terminals tasks in docker task containers: who the agent, the oracle and the final test "
        "run as. invoking = as the publisher's Apptainer ran them (uid/gid 1000 owning every file of the image, "
        "test_initial_state.py checked as root at build); root = as root on the owners %post set",
    )


def load_dataset_tasks(
    name: str, split: str, tasks_dir: Path | None, errors: list[str] | None = None
) -> list[TerminalTask]:
    from datasets import load_dataset, load_from_disk  # noqa: PLC0415 - only for --env.dataset

    path = Path(name)
    if path.is_dir():
        rows = load_from_disk(str(path))
        rows = rows[split] if hasattr(rows, "keys") else rows
    elif path.suffix in (".parquet", ".json", ".jsonl"):
        rows = load_dataset("parquet" if path.suffix == ".parquet" else "json", data_files=str(path), split="train")
    else:
        rows = load_dataset(name, split=split)
    return load_endless_rows(rows, tasks_dir, errors=errors)


class TerminalTasksEnv(HermesAgentBaseEnv):
    config: TerminalTasksEnvConfig  # this env's own settings class
    name = "terminal_tasks"
    env_config_cls = TerminalTasksEnvConfig
    default_toolsets = ["terminal", "file"]
    default_system_prompt = SYSTEM_PROMPT

    async def items(self) -> list[TerminalTask]:
        cfg: TerminalTasksEnvConfig = self.config
        if cfg.runtime.tool_backend != "sandbox":
            raise HermesEnvError("terminal tasks run in sandbox slots: use --env.runtime.tool_backend sandbox")
        tasks_dir = Path(cfg.tasks_dir) if cfg.tasks_dir else None
        errors: list[str] = []
        try:
            if cfg.dataset:
                tasks = await asyncio.to_thread(load_dataset_tasks, cfg.dataset, cfg.split, tasks_dir, errors)
            else:
                tasks = await asyncio.to_thread(load_tasks_dir, tasks_dir or BUNDLED_TASKS, errors=errors)
        except (ValueError, OSError) as exc:
            raise HermesEnvError(f"cannot load terminal tasks: {exc}") from exc
        self.skipped: Counter[str] = Counter()
        for error in errors:
            self._report(f"cannot load task {error}")
            self.skipped["cannot be loaded"] += 1
        if not self._sandboxes_per_image():
            tasks = [self._local(t) for t in tasks]
            self._report_unsupported(tasks)
            tasks = [t for t in tasks if not t.local_skip]
        else:
            for t in tasks:
                if t.image_skip:  # e.g. an Apptainer %setup, a non-Docker bootstrap, an empty container.def
                    self._report(f"skipped {t.id}: {t.image_skip}")
                    self.skipped["its image cannot be built as published"] += 1
            tasks = [t for t in tasks if not t.image_skip]
            if cfg.bootstrap_tests_with_sandbox_pytest and self._in_task_containers_backend():
                tasks = [self._bootstrapped(t) for t in tasks]
        if cfg.agent == "oracle":
            for t in tasks:
                if not t.has_solution:
                    self._report(f"skipped {t.id}: no solution for the oracle")
                    self.skipped["no solution for the oracle"] += 1
            tasks = [t for t in tasks if t.has_solution]
        tasks = tasks[: cfg.limit]
        harbor = [t.id for t in tasks if t.format == "harbor"]
        if harbor and cfg.bootstrap_tests_with_sandbox_pytest and not self._in_task_containers_backend():
            if self._sandboxes_per_image():
                self._report(
                    "--env.bootstrap_tests_with_sandbox_pytest is for the local backend and docker task containers: "
                    f"on {cfg.runtime.sandbox.backend.kind} slots each task's test.sh fetches its own test tools, as published"
                )
        if harbor and self._sandboxes_per_image() and not self._in_task_containers_backend():
            self._report(
                f"Harbor tasks on {cfg.runtime.sandbox.backend.kind} run in slots (unprivileged, read-only image, setup replayed): "
                "a task container per trajectory is given on the docker backend only"
            )
        if self._in_task_containers_backend():
            for t in tasks:
                if t.format == "harbor":
                    missing = await asyncio.to_thread(unresolved_hosts, t.path)
                    if missing:
                        self._report(
                            f"{t.id}: hosts its files name do not resolve here: {', '.join(missing)} (a step that "
                            "downloads from one fails for this machine's sake: infrastructure, not the agent)"
                        )
        self._report_network(tasks)
        for reason, n in sorted(self.skipped.items()):
            self._report(f"skipped {n} task(s): {reason}")
        if not tasks:
            raise HermesEnvError(f"no runnable terminal tasks ({sum(self.skipped.values())} skipped; see above)")
        self.tasks = tasks
        self.by_id = {t.id: t for t in tasks}
        return tasks

    @staticmethod
    def _report(line: str) -> None:
        print(f"[hermes-rl] {line}", file=sys.stderr)

    def _bootstrapped(self, task: TerminalTask) -> TerminalTask:
        """In a task container: test.sh with its test-tool fetching replaced by the image's own pytest (opt-in)."""
        if task.format != "harbor" or task.sandbox_pytest_test_script is None:
            return task
        self._report(f"{task.id}: tests/test.sh runs with the image's pytest instead of fetching its test tools")
        return task.model_copy(update={"test_script": task.sandbox_pytest_test_script})

    def _local(self, task: TerminalTask) -> TerminalTask:
        """The task as the local backend runs it: every reason it cannot, printed with its name."""
        if task.only_bootstrap_blocks and self.config.bootstrap_tests_with_sandbox_pytest:
            self._report(f"{task.id}: tests/test.sh runs with the sandbox's pytest instead of fetching its test tools")
            return task.model_copy(
                update={"test_script": task.sandbox_pytest_test_script, "local_skip": None, "local_problems": []}
            )
        if task.local_skip:
            hint = (
                " (only its test-tool bootstrap: --env.bootstrap_tests_with_sandbox_pytest true runs it)"
                if task.only_bootstrap_blocks
                else ""
            )
            self._report(f"skipped {task.id}: {'; '.join(p.text for p in task.local_problems)}{hint}")
            self.skipped["test-tool bootstrap only" if task.only_bootstrap_blocks else "needs its image"] += 1
        return task

    def _report_unsupported(self, tasks: list[TerminalTask]) -> None:
        """One line per task field the local backend does not honour and why, naming the tasks (with their values)."""
        by_field: dict[tuple[str, str], list[str]] = {}
        for t in tasks:
            for line in t.unsupported:
                m = re.match(r"^(\S+)(?: = (.*?))? \((.*)\)$", line)
                field, value, why = m.groups() if m else (line, None, "not supported")
                by_field.setdefault((field, why), []).append(f"{t.id} = {value}" if value else t.id)
        for (field, why), where in sorted(by_field.items()):
            self._report(f"{field} not honoured by the local backend ({why}): {', '.join(where)}")

    def _task_network(self) -> bool:
        if self.config.task_network == "auto":
            return self._sandboxes_per_image()
        return self.config.task_network == "allow"

    def _report_network(self, tasks: list[TerminalTask]) -> None:
        asking = [t.id for t in tasks if t.allow_internet]
        if not asking:
            return
        if not self._task_network():
            self._report(
                f"allow_internet not honoured (--env.task_network {self.config.task_network}; on the local backend "
                f"network is this machine's, loopback included; --env.task_network allow gives it): {', '.join(asking)}"
            )
        else:
            where = "this machine's network, loopback included" if not self._sandboxes_per_image() else "network"
            self._report(f"with {where} (allow_internet; --env.task_network forbid forbids): {', '.join(asking)}")

    def exec_policy(self, item: TerminalTask) -> ExecPolicy:
        """The task's network and image environment, for every command of its trajectory (agent and verifier)."""
        paths = PathMap.for_task(item, self.workspace_for(item))
        in_containers = self._sandboxes_per_image()
        return ExecPolicy(
            network=item.allow_internet and self._task_network(),
            env={k: paths(v) for k, v in item.environment.items()},
            # As Harbor runs tests/test.sh: as the image's root, with network unless allow_internet = false. Only
            # container backends start their servers with --allow-root-commands (root there is the container's).
            verifier_network=item.allow_internet if in_containers else None,
            verifier_as_root=in_containers and item.format == "harbor",
        )

    async def eval_items(self) -> list[TerminalTask]:
        return self.tasks  # evaluate runs every loaded task once

    def _sandboxes_per_image(self) -> bool:
        return self.config.runtime.sandbox.backend.in_containers

    def item_loop_config(self, item: TerminalTask, loop: AgentLoopConfig) -> AgentLoopConfig:
        # Harbor's `[agent] timeout_sec` caps the trajectory; a shorter --env.runtime.loop.time_budget_s still wins,
        # except for the oracle/no-op check agents, which get the task's own timeout as Harbor gives them.
        if self.config.agent != "model":
            return loop.model_copy(update={"time_budget_s": item.agent_timeout_s})
        if item.agent_timeout_s >= loop.time_budget_s:
            return loop
        return loop.model_copy(update={"time_budget_s": item.agent_timeout_s})

    def workspace_for(self, item: TerminalTask) -> str:
        """Where the task's workspace is: its own working directory (/app, /home/user), where every backend's
        pool mounts its slots' workspaces (`workspace_mount`)."""
        return item.workdir_root

    def scripted_agent(self) -> Callable[[], ChatModel] | None:
        if self.config.agent == "oracle":
            return lambda: OracleAgent(self.by_id)
        return NoOpAgent if self.config.agent == "noop" else None

    def make_tool_backend(self) -> ImageSandboxes:
        return ImageSandboxes(self.config.runtime.sandbox)

    def _in_task_containers_backend(self) -> bool:
        return self.config.runtime.sandbox.backend.kind == "docker" and self.config.harbor_runtime == "task-container"

    def in_task_container(self, item: TerminalTask) -> bool:
        """Whether `item` runs in a task container of its own image (Harbor's semantics; an Endless task's
        container.def built as Apptainer builds it), not a slot."""
        own_image = item.format == "harbor" or (item.format == "endless" and item.image_recipe is not None)
        return own_image and self._in_task_containers_backend()

    def open_workspace(self, item: TerminalTask, task_id: str):
        image = task_recipe(item, self.config.image_registry) if self._sandboxes_per_image() else None
        backend = self.agent_runtime.tool_backend
        if not isinstance(backend, ImageSandboxes):
            raise RuntimeError(
                "rollout() outside the env's runtime; use process/serve/evaluate or `async with env.runtime()`"
            )
        if image is not None and self.in_task_container(item):
            return self._task_container(backend, item, image, task_id)
        return backend.trajectory(
            task_id, image=image, workspace=self.workspace_for(item), policy=self.exec_policy(item)
        )

    @asynccontextmanager
    async def _task_container(
        self, backend: ImageSandboxes, item: TerminalTask, recipe: ImageRecipe, task_id: str
    ) -> AsyncIterator[TaskContainerExecutor]:
        if item.format == "endless":
            image = await self._endless_image(backend, item)
        else:
            image = await backend.image_for(recipe)
        engines = await backend.task_containers()
        spec = task_spec(
            item, image, network=item.allow_internet and self._task_network(), endless_user=self.config.endless_user
        )
        try:
            async with task_container(engines, spec, item.id, command_prefix(item)) as executor:
                yield executor
        except TaskContainerError as exc:
            raise ImageUnavailable(str(exc)) from None  # refused for this engine: lost, not scored

    async def _endless_image(self, backend: ImageSandboxes, item: TerminalTask) -> str:
        """The image of an Endless task's container.def (%post as root at build; the host CA for its downloads;
        then the invoking user's unless --env.endless_user root)."""
        ca = backend.images.ca_bundle if backend.images is not None else None
        with tempfile.TemporaryDirectory(prefix="hermes-endless-") as context:
            recipe = await asyncio.to_thread(
                endless_recipe,
                item,
                self.config.image_registry,
                Path(context),
                ca_bundle=ca,
                endless_user=self.config.endless_user,
            )
            return await backend.image_for(recipe)

    def format_prompt(self, item: TerminalTask) -> str:
        ws = self.workspace_for(item)
        instruction = PathMap.for_task(item, ws)(item.instruction).strip()
        workdir = PathMap.for_task(item, ws)(item.workdir)
        return f"{instruction}\n\nTask: {item.id}\nWorking directory: {workdir}"

    async def setup_trajectory_workspace(self, item: TerminalTask, ctx: ToolContext) -> None:
        if isinstance(ctx.executor, TaskContainerExecutor):
            # The image is the task's initial state, as its Dockerfile (container.def) built it.
            built = await initial_state_from_build(ctx.executor) if item.format == "endless" else None  # then removed
            if item.format == "endless" and self.config.check_initial_state and item.initial_test is not None:
                # As the generator checks it: as root on the owners %post set (at build for an `invoking` image).
                checked = built or await endless_pytest(ctx.executor, item, item.initial_test, user="root")
                if checked.reward != 1.0:
                    raise RuntimeError(f"{item.id}: its built image fails test_initial_state.py: {checked.log[-1500:]}")
            return
        ws = self.workspace_for(item)
        where = await ctx.executor.exec("pwd", timeout=30, max_output_bytes=1000)
        if where.output.strip() != ws:
            raise RuntimeError(
                f"the slot's workspace is {where.output.strip()!r}, not {ws!r}; is bubblewrap isolation available?"
            )
        script, payload = setup_script(item, ws, image_has_packages=self._sandboxes_per_image())
        result = await ctx.executor.exec(
            script, timeout=self.config.setup_timeout_s, max_output_bytes=20_000, stdin=payload
        )
        if result.exit_code != 0:
            raise RuntimeError(f"building {item.id} failed (exit {result.exit_code}): {result.output[-2000:]}")
        if self.config.check_initial_state and item.initial_test is not None:
            # The replayed state must be the one the task was written against, or its verdict means nothing.
            script, payload, nonce = verify_script(item, ws, initial=True)
            run = await ctx.executor.exec(
                script, timeout=item.verifier_timeout_s, max_output_bytes=50_000, stdin=payload
            )
            verdict = parse_verdict(item, run.output, nonce, run.exit_code)
            if verdict.reward != 1.0:
                raise RuntimeError(
                    f"{item.id}: the built initial state fails test_initial_state.py: {verdict.log[-1500:]}"
                )

    async def compute_reward(self, item: TerminalTask, result: AgentResult, ctx: ToolContext) -> float:
        if isinstance(ctx.executor, TaskContainerExecutor):
            backend = self.config.runtime.sandbox.backend  # PyPI from the host through the CA its builds use
            ca = backend.ca_bundle_bytes() if isinstance(backend, DockerBackendConfig) else None
            checked = await verify_in_container(ctx.executor, item, GenuineCheck(ca_bundle=ca))
            if checked.flags:
                self._report(f"FLAGGED {item.id}: {checked.reason}")
            if checked.reward is None:
                raise VerifierError(
                    f"{item.id}: the verifier gave no reward: {checked.reason}; log: {checked.log[-1500:]}"
                )
            logger.info("task %s: reward %.3f (%s)", item.id, checked.reward, checked.reason)
            return checked.reward
        script, payload, nonce = verify_script(item, self.workspace_for(item))
        run = await self._verifier_exec(ctx)(
            script, timeout=item.verifier_timeout_s + 30, max_output_bytes=200_000, stdin=payload
        )
        verdict = parse_verdict(item, run.output, nonce, run.exit_code)
        if verdict.reward is None:
            # Harbor's trial error (no/empty/unreadable reward file): the rollout is lost to the verifier, not a 0.
            raise VerifierError(f"{item.id}: the verifier gave no reward: {verdict.reason}; log: {verdict.log[-1500:]}")
        logger.info("task %s: reward %.3f metrics %s (%s)", item.id, verdict.reward, verdict.metrics, verdict.reason)
        return verdict.reward

    @staticmethod
    def _verifier_exec(ctx: ToolContext):
        """The executor's verifier entry (its policy's verifier network and user) where it has one."""
        return getattr(ctx.executor, "verify_exec", ctx.executor.exec)

    def eval_metrics(self, rollouts: list[Rollout]) -> dict[str, float]:
        # How many verdicts came from the sandbox's pytest instead of the task's own test tools (the opt-in).
        bootstrapped = sum(r.item.test_script is not None for r in rollouts)
        return {**super().eval_metrics(rollouts), "eval/tests_bootstrapped_with_sandbox_pytest": float(bootstrapped)}

    def eval_sample(self, rollout: Rollout) -> dict[str, Any]:
        item = {"id": rollout.item.id, "format": rollout.item.format}
        if rollout.item.test_script is not None:
            item["tests_bootstrapped_with_sandbox_pytest"] = True  # not the task's own test.sh
        return {**super().eval_sample(rollout), "item": item}
