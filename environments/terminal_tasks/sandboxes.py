"""The images terminal tasks run in (their pools: environments/image_sandboxes.py).

On Nomad and Modal a task runs in a sandbox started from its own image: Harbor's
`[environment] docker_image`, or the image built from its `environment/Dockerfile` (or an
Endless Terminals `container.def`'s base), each with the project's sandbox layer on top
(see the project Dockerfile), built and pushed beforehand (`main` prints the commands).
On the docker backend the task's own recipe is resolved on the engine: `docker_image` when
present, else its Dockerfile built as written under a content tag (`task_recipe`); the runtime
is mounted, not layered. The local backend has no images: tasks run on this machine's base
environment (those it cannot reproduce are skipped at load time), in one pool per working
directory: the slot's workspace is mounted where the task expects it (/app, /home/user).
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

from backends.runtime import SandboxRuntime
from environments.image_sandboxes import ImageRecipe, content_tag
from environments.terminal_tasks.apptainer import EndlessUser, write_def_context
from environments.terminal_tasks.loaders import load_tasks_dir
from environments.terminal_tasks.tasks import BUNDLED_TASKS, TerminalTask

__all__ = ["task_image", "task_recipe", "own_dockerfile", "write_build_context", "endless_recipe", "SANDBOX_LAYER"]

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
    """Content-addressed tag of the task's sandbox image (Nomad, Modal): same recipe and files, same tag."""
    context = task.context_dir if task.format == "harbor" else None
    return content_tag(
        f"{registry.rstrip('/')}/{_slug(task.id)}", base_dockerfile(task), context, SANDBOX_LAYER.encode()
    )


def own_dockerfile(task: TerminalTask) -> str:
    """The task's recipe as written (Harbor's Dockerfile; an Endless base with its packages), no sandbox layer."""
    if task.format == "harbor" and task.image_recipe is not None:
        return task.image_recipe
    return base_dockerfile(task)


def task_recipe(task: TerminalTask, registry: str) -> ImageRecipe:
    """Where the task's image comes from: `docker_image` if the engine has it, else its own recipe built."""
    dockerfile = own_dockerfile(task)
    context = task.context_dir if task.format == "harbor" else None
    return ImageRecipe(
        owner=task.id,
        name=task.docker_image if task.format == "harbor" else None,
        dockerfile=dockerfile,
        context_dir=context,
        tag=content_tag(f"{registry.rstrip('/')}/{_slug(task.id)}", dockerfile, context),
        build_timeout_s=task.build_timeout_s,
        registry_image=task_image(task, registry),
    )


def endless_recipe(
    task: TerminalTask,
    registry: str,
    context_dir: Path,
    *,
    ca_bundle: bytes | None = None,
    endless_user: EndlessUser = "invoking",
) -> ImageRecipe:
    """An Endless Terminals task's image as Apptainer builds its container.def (apptainer.py): `%post` as root at
    build, `%environment` in the image; its build context written to `context_dir`. `ca_bundle`: the host's CA
    bundle for `%post`'s downloads behind a TLS-intercepting network (removed from the image afterwards).
    `endless_user` "invoking": test_initial_state.py checked as root in the build, then every file owned by the user
    the publisher's runs had (apptainer.py); "root": the image as %post left it. Raises `apptainer.Unreproducible` (the task and the reason) for a definition
    a Docker build cannot reproduce."""
    if task.format != "endless" or task.image_recipe is None:
        raise ValueError(f"{task.id}: not an Endless Terminals task with a container.def")
    context = write_def_context(
        task.id,
        task.image_recipe,
        task.path,
        context_dir,
        ca_bundle=ca_bundle,
        invoking_user=endless_user == "invoking",
        initial_test=task.initial_test,
    )
    dockerfile = (context / "Dockerfile").read_text()
    return ImageRecipe(
        owner=task.id,
        dockerfile=dockerfile,
        context_dir=context,
        tag=content_tag(f"{registry.rstrip('/')}/{_slug(task.id)}", dockerfile, context),
        build_timeout_s=task.build_timeout_s,
        carries_ca=ca_bundle is not None,
    )


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
