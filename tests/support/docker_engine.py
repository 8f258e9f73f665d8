"""A real container engine for tests: the engine check, a sandbox runtime and image the docker backend runs.

Everything created here carries `hermes-rl.test=<TEST_LABEL>` (images) or the per-test labels the
callers pass (containers), so tests remove only their own: other runs use the same engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.docker import DockerBackendConfig
from backends.runtime import SandboxRuntime
from slots.pool import SlotPoolConfig

__all__ = [
    "ENGINE",
    "TEST_LABEL",
    "engine_problem",
    "SandboxImage",
    "SandboxPlace",
    "sandbox_image",
    "verifier_image",
    "docker_config",
    "PodmanService",
    "podman_problem",
    "podman_service",
    "remove_labelled",
    "stop_container",
    "container_exec",
    "container_spawn",
    "container_listdir",
    "ContainerProcess",
    "container_processes",
    "container_state",
    "kill_container",
    "load_into_podman",
]

ENGINE = "unix:///var/run/docker.sock"
TEST_LABEL = "hermes-rl.test"
REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "debian:bookworm"  # made offline by scripts/base_images.sh

# The image the tests' slots run in: the tests' commands use python3 (the python tool) and procps
# (pgrep), which a task's image would bring. Nothing of the sandbox is in it: the runtime is mounted.
TEST_IMAGE_DOCKERFILE = f"""FROM {BASE_IMAGE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
    python3 procps && rm -rf /var/lib/apt/lists/*
"""


# The image the verifier's tests run in (tests/security/test_reward_*.py on docker): a repository's
# checkout and tests need git, python3 (also as `python`, as in SWE-smith's images) and pytest.
VERIFIER_IMAGE_DOCKERFILE = f"""FROM {BASE_IMAGE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
    git python3 python-is-python3 python3-pytest procps && rm -rf /var/lib/apt/lists/*
"""


def engine_problem(engine: str = ENGINE) -> str | None:
    """Why no engine answers at `engine` (None: it does)."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install 'hermes-rl[docker]')"
    try:
        client = docker.DockerClient(base_url=engine, version="auto", timeout=10)
    except docker.errors.DockerException as exc:
        return f"no container engine answers at {engine}: {exc}"
    try:
        client.ping()
    finally:
        client.close()
    return None


@dataclass(frozen=True)
class SandboxImage:
    image: str
    runtime_dir: Path


def _build(client: Any, dockerfile: str, name: str) -> str:
    tag = f"{name}:{hashlib.sha256(dockerfile.encode()).hexdigest()[:12]}"
    try:
        client.images.get(tag)
        return tag
    except Exception:  # noqa: BLE001 - not built yet
        pass
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    client.images.build(fileobj=buf, custom_context=True, tag=tag, labels={TEST_LABEL: "docker-backend"}, rm=True)
    return tag


def sandbox_image() -> SandboxImage:
    """The image the docker backend's tests run and the runtime it mounts (built or brought up to date here)."""
    import docker

    runtime = SandboxRuntime()
    # Always through the script: it rebuilds only when sandbox_server changed, so no stale runtime runs.
    subprocess.run(["bash", str(REPO / "scripts" / "build_sandbox_runtime.sh"), str(runtime.dir)], check=True)
    runtime.check()
    client = docker.DockerClient(base_url=ENGINE, version="auto", timeout=600)
    try:
        image = _build(client, TEST_IMAGE_DOCKERFILE, "hermes-rl-test/slot-image")
    finally:
        client.close()
    return SandboxImage(image, runtime.dir)


def verifier_image(slot_image: SandboxImage) -> SandboxImage:
    """`slot_image`'s runtime in an image with git, python3 and pytest (built once, reused by its tag)."""
    import docker

    client = docker.DockerClient(base_url=ENGINE, version="auto", timeout=600)
    try:
        image = _build(client, VERIFIER_IMAGE_DOCKERFILE, "hermes-rl-test/verifier-image")
    finally:
        client.close()
    return SandboxImage(image, slot_image.runtime_dir)


@dataclass(frozen=True)
class SandboxPlace:
    """Where a test's sandbox runs: local processes with data under `tmp_path`, or docker containers.

    Defined here, not in a conftest: test modules import conftests under a second name, and
    `sandbox_backend` tells the kinds apart by this class.
    """

    tmp_path: Path
    kind: str = "local"
    image: SandboxImage | None = None
    test_id: str = ""


def delayed_runtime(runtime_dir: Path, dest: Path, delay_s: float) -> Path:
    """A copy of `runtime_dir` whose server starts listening only `delay_s` after its container starts."""
    shutil.copytree(runtime_dir, dest, symlinks=True)
    (dest / "sandbox-server").rename(dest / "sandbox-server.real")
    (dest / "sandbox-server").write_text(f'#!/bin/sh\nsleep {delay_s}\nexec "$0.real" "$@"\n')
    (dest / "sandbox-server").chmod(0o755)
    return dest


def docker_config(
    image: SandboxImage, test_id: str, *, slots: int = 2, sandboxes: int = 1, engine: str = ENGINE, **fields: Any
) -> DockerBackendConfig:
    pool = fields.pop("pool", None) or SlotPoolConfig(
        slots_per_sandbox=slots, min_sandboxes=sandboxes, max_sandboxes=sandboxes, health_interval_s=30
    )
    return DockerBackendConfig(
        engine=engine,
        image=image.image,
        runtime_dir=str(fields.pop("runtime_dir", image.runtime_dir)),
        pull="never",
        labels={TEST_LABEL: test_id},
        pool=pool,
        **fields,
    )


def remove_labelled(engine: str, label: str) -> None:
    """Remove every container on `engine` carrying `label` (key=value): a test's own, never others'."""
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=60)
    try:
        for c in client.containers.list(all=True, filters={"label": label}):
            c.remove(force=True)
    finally:
        client.close()


@contextlib.asynccontextmanager
async def labelled_task_containers(prefix: str, **config: Any) -> AsyncIterator[Any]:
    """Task containers labelled for this test alone; every one is removed afterwards, also when the test fails."""
    from backends.task_container import TaskContainerConfig, TaskContainers  # noqa: PLC0415

    label = f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        async with TaskContainers(TaskContainerConfig(engine=ENGINE, labels={TEST_LABEL: label}, **config)) as e:
            yield e
    finally:
        remove_labelled(ENGINE, f"{TEST_LABEL}={label}")


def built_task_image(owner: str, dockerfile: str, context_dir: Path, ca_bundle: bytes | None = None) -> str:
    """The image of a test task's Dockerfile, built once (content-tagged) and labelled as the tests' own."""
    import asyncio  # noqa: PLC0415

    from environments.image_sandboxes import DockerImages, ImageRecipe, content_tag  # noqa: PLC0415

    recipe = ImageRecipe(
        owner=owner,
        dockerfile=dockerfile,
        context_dir=context_dir,
        tag=content_tag(f"hermes-rl-test/{owner}", dockerfile, context_dir),
        build_timeout_s=900,
    )
    images = DockerImages(ENGINE, labels={TEST_LABEL: "task-container"}, ca_bundle=ca_bundle)
    try:
        return asyncio.run(images.resolve(recipe))
    finally:
        images.close()


def stop_container(engine: str, cid: str, timeout_s: int = 10) -> dict[str, Any]:
    """`docker stop` (SIGTERM, SIGKILL after `timeout_s`); returns the container's State afterwards."""
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=60)
    try:
        client.api.stop(cid, timeout=timeout_s)
        return client.api.inspect_container(cid)["State"]
    finally:
        client.close()


def container_exec(engine: str, cid: str, argv: list[str]) -> tuple[int, str]:
    """Run `argv` as root inside a running container: (exit code, output)."""
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=60)
    try:
        exec_id = client.api.exec_create(cid, argv)["Id"]
        out = client.api.exec_start(exec_id).decode()
        return client.api.exec_inspect(exec_id)["ExitCode"], out
    finally:
        client.close()


def container_spawn(engine: str, cid: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    """Start `argv` as root inside a running container and return at once (it runs on, detached)."""
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=60)
    try:
        exec_id = client.api.exec_create(cid, argv, environment=env or None)["Id"]
        client.api.exec_start(exec_id, detach=True)
    finally:
        client.close()


def kill_container(engine: str, cid: str, signal: int) -> None:
    """`docker kill --signal`: send `signal` to the container's PID 1."""
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=60)
    try:
        client.api.kill(cid, signal=signal)
    finally:
        client.close()


def container_state(engine: str, cid: str) -> dict[str, Any]:
    """The container's State (`docker inspect`): Running, ExitCode, Pid..."""
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=60)
    try:
        return client.api.inspect_container(cid)["State"]
    finally:
        client.close()


@dataclass(frozen=True)
class ContainerProcess:
    pid: int  # in the container's pid namespace
    ppid: int
    stat: str  # ps's STAT: "Z..." is a zombie
    args: str


def container_processes(engine: str, cid: str) -> list[ContainerProcess]:
    """Every process in a running container's pid namespace, as its own `ps` sees it (the image needs procps)."""
    code, out = container_exec(engine, cid, ["ps", "-e", "-o", "pid=,ppid=,stat=,args="])
    if code != 0:
        raise RuntimeError(f"ps in container {cid[:12]} failed ({code}): {out.strip()}")
    rows = []
    for line in out.splitlines():
        pid, ppid, stat, *args = line.split(None, 3)
        rows.append(ContainerProcess(int(pid), int(ppid), stat, args[0] if args else ""))
    return rows


def container_listdir(engine: str, cid: str, path: str) -> list[str]:
    """The entries of `path` inside a running container (`ls -A` there)."""
    code, out = container_exec(engine, cid, ["ls", "-A", path])
    if code != 0:
        raise FileNotFoundError(f"ls -A {path} in container {cid[:12]} failed ({code}): {out.strip()}")
    return out.split()


@dataclass(frozen=True)
class PodmanService:
    engine: str
    # Without CAP_SYS_RESOURCE podman cannot raise a container's rlimits to its defaults: ask for its own.
    ulimits: dict[str, int]


def podman_problem() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/setup.sh installs it)"
    return None


def _own_limits(pid: int) -> dict[str, int]:
    wanted = {"Max open files": "nofile", "Max processes": "nproc"}
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        for title, name in wanted.items():
            if line.startswith(title):
                hard = line[len(title) :].split()[1]
                if hard.isdigit():
                    out[name] = int(hard)
    return out


@contextlib.contextmanager
def podman_service(scratch: Path) -> Iterator[PodmanService]:
    """`podman system service` on a socket in `scratch`, stopped (by its own pid) on the way out."""
    sock = scratch / "podman.sock"
    engine = f"unix://{sock}"
    proc = subprocess.Popen(
        ["podman", "system", "service", "--time=0", engine],
        stdout=subprocess.DEVNULL,
        stderr=open(scratch / "service.log", "wb"),  # noqa: SIM115 - the child keeps it
    )
    try:
        deadline = time.monotonic() + 30
        while engine_problem(engine) is not None:
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (scratch / "service.log").read_text(errors="replace")[-1000:]
                raise RuntimeError(f"podman system service did not answer at {engine}: {log}")
            time.sleep(0.2)
        yield PodmanService(engine, _own_limits(proc.pid))
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def load_into_podman(image: str) -> None:
    """Copy `image` from the Docker engine into podman's storage (no registry here)."""
    if subprocess.run(["podman", "image", "exists", image], check=False).returncode == 0:
        return
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    try:
        subprocess.run(["podman", "load", "-q"], stdin=save.stdout, check=True, stdout=subprocess.DEVNULL)
    finally:
        assert save.stdout is not None
        save.stdout.close()
        save.wait()
