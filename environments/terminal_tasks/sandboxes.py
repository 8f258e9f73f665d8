"""Sandbox slots per task image, and the images themselves.

On Nomad and Modal a task runs in a sandbox started from its own image: Harbor's
`[environment] docker_image`, or the image built from its `environment/Dockerfile` (or an
Endless Terminals `container.def`'s base), each with the project's sandbox layer on top
(sandbox_server + bubblewrap, see the project Dockerfile). One slot pool per image, made
on first use. The local backend has no images: tasks run on this machine's base environment
(those it cannot reproduce are skipped at load time), in one pool per working directory: the
slot's workspace is mounted where the task expects it (/app, /home/user), as in its image.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from backends import BackendConfig, LocalBackendConfig, make_backend
from backends.runtime import SandboxRuntime
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.terminal_tasks.loaders import load_tasks_dir
from environments.terminal_tasks.tasks import BUNDLED_TASKS, TerminalTask
from slots.executor import ExecPolicy, SlotExecutor
from slots.pool import SlotPool

__all__ = ["TaskSandboxes", "task_image", "write_build_context", "SANDBOX_LAYER"]

# Appended to a task's image recipe: the self-contained sandbox runtime (backends/runtime.py), copied
# where the docker backend mounts it. Nothing is installed into the image: the agent and the tests
# see the task's own toolchain only.
SANDBOX_LAYER = """
# --- hermes-rl sandbox runtime: sandbox_server + bubblewrap with their own Python and libraries ---
COPY hermes_runtime /opt/hermes
"""

_APPTAINER_LOCAL_UBUNTU = re.compile(r"^\./ubuntu_([\d.]+)\.sif$")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:60] or "task"


def base_dockerfile(task: TerminalTask) -> str:
    """The task's own image recipe as a Dockerfile (before the sandbox layer)."""
    if task.format == "harbor":
        if task.docker_image:  # the task's prebuilt image, as Harbor uses it, rather than a rebuild
            return f"FROM {task.docker_image}\n"
        if task.image_recipe is not None:
            return task.image_recipe
        return f"FROM {task.docker_image}\n"
    base = task.base_image or "ubuntu:22.04"
    local = _APPTAINER_LOCAL_UBUNTU.match(base)
    # Endless Terminals builds from a local ubuntu SIF pulled from docker://ubuntu:22.04 (scripts/get_ubuntu_sif.sh).
    base = f"ubuntu:{local.group(1)}" if local else base.removeprefix("docker://")
    # Packages of %post go into the image; the files it creates are replayed into the workspace.
    install = "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3 python3-pytest git"
    return f"FROM {base}\nRUN {install}\n"


def task_image(task: TerminalTask, registry: str) -> str:
    """Content-addressed tag of the task's sandbox image: same recipe and files, same tag."""
    h = hashlib.sha256(base_dockerfile(task).encode() + SANDBOX_LAYER.encode())
    if task.format == "harbor" and task.context_dir is not None and task.context_dir.is_dir():
        for p in sorted(task.context_dir.rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(task.context_dir)).encode() + b"\0" + p.read_bytes())
    return f"{registry.rstrip('/')}/{_slug(task.id)}:{h.hexdigest()[:12]}"


def write_build_context(task: TerminalTask, out_dir: Path, runtime_dir: Path) -> Path:
    """A docker build context for `task_image(task)`: the task's files, its recipe + the sandbox layer
    (`runtime_dir`: the built runtime, scripts/build_sandbox_runtime.sh)."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    if task.format == "harbor" and task.context_dir is not None and task.context_dir.is_dir():
        shutil.copytree(task.context_dir, out_dir)
    else:
        out_dir.mkdir(parents=True)
    shutil.copytree(runtime_dir, out_dir / "hermes_runtime")
    (out_dir / "Dockerfile").write_text(base_dockerfile(task).rstrip("\n") + "\n" + SANDBOX_LAYER)
    return out_dir


class TaskSandboxes:
    """A `ToolBackend` whose trajectories run in a slot of the pool for their task's image."""

    def __init__(
        self,
        config: SandboxToolBackendConfig,
        factory: Callable[[BackendConfig], SlotPool] = make_backend,
    ) -> None:
        self.config = config
        self.factory = factory
        self.pools: dict[str, SlotPool] = {}
        self._lock = asyncio.Lock()

    @property
    def per_image(self) -> bool:
        return not isinstance(self.config.backend, LocalBackendConfig)

    async def start(self) -> None:
        pass  # pools start on first use: one per image (Nomad, Modal) or working directory (local)

    async def stop(self) -> None:
        pools, self.pools = list(self.pools.values()), {}
        await asyncio.gather(*(p.stop() for p in pools), return_exceptions=True)

    def _config_for(self, image: str) -> BackendConfig:
        backend = self.config.resolved_backend()
        suffix = hashlib.sha1(image.encode()).hexdigest()[:8]
        update: dict[str, object] = {"image": image}
        if hasattr(backend, "job_id"):
            update["job_id"] = f"{backend.job_id}-{suffix}"  # Nomad: one service job per image
        if hasattr(backend, "pool_name"):
            update["pool_name"] = f"{backend.pool_name}-{suffix}"  # Modal: names and tags per pool
        return backend.model_copy(update=update)

    async def _pool(self, key: str) -> SlotPool:
        async with self._lock:
            pool = self.pools.get(key)
            if pool is None:
                backend = self.config.resolved_backend()
                if self.per_image:
                    config = self._config_for(key)
                else:
                    config = backend.model_copy(update={"workspace_mount": key})
                pool = self.factory(config)
                await pool.start()
                self.pools[key] = pool
        return pool

    @asynccontextmanager
    async def trajectory(
        self, task_id: str, image: str | None = None, workspace: str | None = None, policy: ExecPolicy | None = None
    ) -> AsyncIterator[SlotExecutor]:
        """A slot for the task's image (Nomad, Modal) or with its workspace at `workspace` (local).

        `policy`: the task's network and environment, for every command of the trajectory (agent and verifier).
        """
        if self.per_image and image is None:
            raise ValueError("a task on Nomad or Modal needs its image")
        local = self.config.resolved_backend()
        default_mount = getattr(local, "workspace_mount", "/workspace")
        pool = await self._pool(image if self.per_image and image else (workspace or default_mount))
        async with pool.trajectory(task_id, policy) as executor:
            yield executor


def main(argv: list[str] | None = None) -> None:
    """Write a docker build context per task and print the `docker build` commands for Nomad/Modal."""
    parser = argparse.ArgumentParser(prog="python -m environments.terminal_tasks.sandboxes", description=main.__doc__)
    parser.add_argument("--tasks_dir", type=Path, default=BUNDLED_TASKS, help="Harbor / Endless Terminals tasks")
    parser.add_argument("--out", type=Path, required=True, help="Directory for the build contexts")
    parser.add_argument("--image_registry", default="hermes-rl-tasks", help="Same as --env.image_registry")
    args = parser.parse_args(argv)
    runtime = SandboxRuntime().check()
    for task in load_tasks_dir(args.tasks_dir):
        image = task_image(task, args.image_registry)
        context = write_build_context(task, args.out / _slug(task.id), runtime)
        print(f"docker build -t {image} {context} && docker push {image}")


if __name__ == "__main__":
    main()
