"""On Nomad and Modal a task runs in a sandbox of its own image (checked on the services' test doubles).

The doubles run containers on the real Docker engine; their stand-in registry serves every task's
image reference as the doubles' sandbox image (the task images themselves are built and run on the
docker backend by tests/terminal_tasks/test_docker_*.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from backends.runtime import SandboxRuntime
from backends.modal import ModalBackendConfig, modal_backend
from backends.nomad import NomadBackendConfig, nomad_backend
from tests.support.nomad_modal_doubles import ModalTestDouble, NomadTestDouble
from environments.terminal_tasks import BUNDLED_TASKS, OracleAgent, TerminalTasksEnv, load_harbor_task, load_tasks_dir
from environments.image_sandboxes import ImageSandboxes
from environments.terminal_tasks.sandboxes import SANDBOX_LAYER, task_image, write_build_context
from slots.pool import SlotPoolConfig
from tests.terminal_tasks.conftest import make_env
from tests.terminal_tasks.test_docker_tasks import FIXTURES as TB2_FIXTURES, TASKS as TB2_TASKS
from tests.terminal_tasks.test_docker_tasks import engine, task_images  # noqa: F401  (session fixtures)

ROOT = Path(__file__).resolve().parents[2]


def test_image_tag_follows_the_task_recipe_and_files(tmp_path):
    shutil.copytree(BUNDLED_TASKS / "harbor" / "edit-config", tmp_path / "edit-config")
    task = load_harbor_task(tmp_path / "edit-config")
    tag = task_image(task, "reg.example/tasks")
    assert tag.startswith("reg.example/tasks/edit-config:") and tag == task_image(
        load_harbor_task(tmp_path / "edit-config"), "reg.example/tasks"
    )
    (tmp_path / "edit-config" / "environment" / "service.ini").write_text("[server]\nport = 1\n")
    assert task_image(load_harbor_task(tmp_path / "edit-config"), "reg.example/tasks") != tag


def test_build_context_is_the_task_dockerfile_plus_the_sandbox_layer(tmp_path):
    task = load_harbor_task(BUNDLED_TASKS / "harbor" / "git-recover")
    out = write_build_context(task, tmp_path / "ctx", SandboxRuntime().check())
    dockerfile = (out / "Dockerfile").read_text()
    assert dockerfile.startswith(task.image_recipe.rstrip("\n")) and dockerfile.endswith(SANDBOX_LAYER)
    assert (out / "setup.sh").is_file() and (out / "hermes_runtime" / "sandbox-server").is_file()
    endless = next(t for t in load_tasks_dir(BUNDLED_TASKS) if t.format == "endless" and t.base_image.endswith(".sif"))
    text = (write_build_context(endless, tmp_path / "ctx2", SandboxRuntime().check()) / "Dockerfile").read_text()
    assert text.startswith("FROM ubuntu:22.04\n")  # the local ubuntu SIF is docker://ubuntu:22.04


class OnDouble:
    """Builds the env's per-image sandboxes on a Nomad or Modal test double."""

    def __init__(self, kind: str, root: Path, project_sandbox_image: str) -> None:
        import docker  # noqa: PLC0415 - only these tests need the engine

        from tests.support.sandbox_image import task_standin_image  # noqa: PLC0415

        client = docker.from_env()
        standin = task_standin_image(client, project_sandbox_image)
        client.close()
        self.kind = kind
        images = {task_image(t, "reg.example/tasks"): standin for t in load_tasks_dir(BUNDLED_TASKS)}
        self.double: NomadTestDouble | ModalTestDouble = (
            NomadTestDouble(root / "nomad", images=images)
            if kind == "nomad"
            else ModalTestDouble(root / "modal", images=images)
        )

    def backend_config(self):
        pool = SlotPoolConfig(
            slots_per_sandbox=2, min_sandboxes=1, max_sandboxes=1, acquire_timeout_s=60, health_interval_s=30
        )
        if self.kind == "nomad":
            return NomadBackendConfig(pool=pool, driver="docker", poll_interval_s=0.05, startup_timeout_s=60)
        return ModalBackendConfig(pool=pool, create_rate_per_s=50, startup_timeout_s=60)

    def factory(self, config):
        return nomad_backend(config, self.double) if self.kind == "nomad" else modal_backend(config, self.double)

    def images_requested(self) -> list[str]:
        if self.kind == "nomad":
            return [
                job["TaskGroups"][0]["Tasks"][0]["Config"]["image"]
                for call, job in self.double.calls
                if call == "register_job"
            ]
        return [sb.spec.image for sb in self.double.sandboxes.values()]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nomad", "modal"])
async def test_a_harbor_task_with_its_dockerfile_requests_its_image(
    scripted_server, tmp_path, kind, project_sandbox_image
):
    on = OnDouble(kind, tmp_path, project_sandbox_image)

    class OnDoubleEnv(TerminalTasksEnv):
        def make_tool_backend(self) -> ImageSandboxes:
            return ImageSandboxes(self.config.runtime.sandbox, factory=on.factory)  # the double in place of the SDK

    env = make_env(
        scripted_server.base_url,
        tmp_path,
        backend=on.backend_config(),
        env_cls=OnDoubleEnv,
        image_registry="reg.example/tasks",
    )
    try:
        async with env.runtime():
            await env.setup()
            task = env.by_id["fix-script"]
            assert task.image_recipe.startswith("FROM ubuntu:22.04")
            rollout = await env.rollout(task, model=OracleAgent(env.by_id))
            other = await env.rollout(env.by_id["parse-log"], model=OracleAgent(env.by_id))
            endless = await env.rollout(env.by_id["task_000001_b2d4f6a8"], model=OracleAgent(env.by_id))
    finally:
        await on.double.close()
    assert [(r.error, r.score) for r in (rollout, other, endless)] == [(None, 1.0)] * 3
    requested = on.images_requested()
    for name in ("fix-script", "parse-log", "task_000001_b2d4f6a8"):
        assert task_image(env.by_id[name], "reg.example/tasks") in requested
    assert len(set(requested)) == 3  # one pool per image


def test_build_contexts_cli_prints_one_build_per_task(tmp_path):
    import subprocess
    import sys

    argv = [sys.executable, "-m", "environments.terminal_tasks.sandboxes", "--out", str(tmp_path)]
    proc = subprocess.run(
        [*argv, "--image_registry", "r.io/t"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    images = [task_image(t, "r.io/t") for t in load_tasks_dir(BUNDLED_TASKS)]
    dirs = [tmp_path / image.split("/")[-1].split(":")[0] for image in images]
    expected = [f"docker build -t {image} {d} && docker push {image}" for image, d in zip(images, dirs)]
    assert sorted(proc.stdout.splitlines()) == sorted(expected)
    assert all((d / "Dockerfile").is_file() and (d / "hermes_runtime").is_dir() for d in dirs)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("agent,expected", [("oracle", 1.0), ("noop", 0.0)])
async def test_tb2_tasks_score_in_their_own_images_on_nomad_with_the_verifier_as_root(
    task_images,  # noqa: F811  (the session fixture imported above)
    scripted_server,
    tmp_path,
    agent,
    expected,
):
    """TB2-shaped tasks on the Nomad double, each in its own image plus the sandbox layer (what a user pushes):
    the verifier runs as the image's root with network (allow_internet's default), as Harbor runs test.sh."""
    import docker  # noqa: PLC0415 - only these tests need the engine

    from tests.support.sandbox_image import with_runtime_layer  # noqa: PLC0415

    registry = "reg.example/tb2"
    tasks = {name: load_harbor_task(TB2_FIXTURES / name) for name in TB2_TASKS}
    client = docker.from_env()
    try:
        runtime = SandboxRuntime().check()
        # The stand-in registry holds each task's image tag as pushed: its own image plus the sandbox layer.
        images = {
            task_image(t, registry): with_runtime_layer(client, task_images[n], runtime) for n, t in tasks.items()
        }
    finally:
        client.close()
    double = NomadTestDouble(tmp_path / "nomad", images=images)

    class OnNomad(TerminalTasksEnv):
        def make_tool_backend(self) -> ImageSandboxes:
            return ImageSandboxes(self.config.runtime.sandbox, factory=lambda c: nomad_backend(c, double))

    pool = SlotPoolConfig(slots_per_sandbox=2, min_sandboxes=1, max_sandboxes=1, acquire_timeout_s=120)
    backend = NomadBackendConfig(pool=pool, driver="docker", poll_interval_s=0.05, startup_timeout_s=120)
    env = make_env(
        scripted_server.base_url,
        tmp_path,
        backend=backend,
        env_cls=OnNomad,
        image_registry=registry,
        tasks_dir=str(TB2_FIXTURES),
        agent=agent,
    )
    try:
        async with env.runtime():
            await env.setup()
            scores = {}
            for name in TB2_TASKS:
                rollout = await env.rollout(env.by_id[name], model=env.scripted_agent()())
                scores[name] = (rollout.error, rollout.score)
            item = env.by_id["expect-login"]
            async with env.open_workspace(item, "probe") as executor:
                probe = await executor.verify_exec(
                    "id -u; pwd; tail -n +3 /proc/net/dev | cut -d: -f1", timeout=60, max_output_bytes=10_000
                )
    finally:
        await double.close()
    assert scores == dict.fromkeys(TB2_TASKS, (None, expected))
    lines = probe.output.split()
    assert lines[:2] == ["0", "/app"] and len(lines) > 3, probe.output  # root, at the task's WORKDIR, with network
    requested = [job["TaskGroups"][0]["Tasks"][0]["Config"] for call, job in double.calls if call == "register_job"]
    assert {c["image"] for c in requested} == set(images)  # one pool per task image
    assert all("--allow-root-commands" in c["args"] for c in requested)
