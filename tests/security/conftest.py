"""Attack tests: a scripted model plays the hostile agent through the real agent loop.

Every attack goes through the tool calls an agent can make (terminal, python, read_file,
write_file, search_files), against real sandbox_server processes under real bubblewrap,
or against the local workspace backend.

Attacks on a slot's confinement run on each sandbox backend that hosts slots on this machine:
`sandbox_at` is parametrized over local processes and docker containers (skipped only when no
engine answers). Where the look must differ (a server's data dir, its processes), helpers here look on
this machine or in the container (`sandbox_container`). test_backend_coverage.py checks that every test
starting a sandbox takes a place, but for a short list of one-backend tests with their reasons.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends import BackendConfig, LocalBackendConfig, make_backend
from environments.agent_loop import AgentLoopConfig, HermesAgentLoop
from environments.models.chat_mode import OpenAIChatConfig, OpenAIChatModel
from model_tools import get_tool_definitions
from backends.docker import DATA_DIR, DockerSandboxProvider
from slots.pool import SlotPool, SlotPoolConfig
from tests.support.docker_engine import (
    SandboxPlace,
    container_exec,
    container_listdir,
    container_processes,
    docker_config,
    stop_container,
)
from tests.support.docker_fixtures import (  # noqa: F401 - fixtures
    docker_engine,
    docker_sandbox_image,
    docker_test_id,
    docker_verifier_image,
)
from tests.support.scripted_openai import ScriptedOpenAIServer, tool_call
from tools.context import ToolContext, ToolLimits

TOOLSETS = ("terminal", "python", "file")


async def play(
    executor,
    turns: list[list[tuple[str, dict[str, Any]]]],
    *,
    time_budget_s: float = 120.0,
    limits: ToolLimits | None = None,
) -> list[dict[str, Any]]:
    """Run the agent loop with a model that makes `turns` (each a list of tool calls), then stops.

    Returns the tool messages in order, each with its parsed JSON content under "result".
    """
    script: list[Any] = [{"content": None, "tool_calls": [tool_call(n, a) for n, a in calls]} for calls in turns]
    script.append({"content": "done"})
    async with ScriptedOpenAIServer(script) as server:
        model = OpenAIChatModel(OpenAIChatConfig(base_url=server.base_url, model="scripted", max_retries=0))
        ctx = ToolContext(executor, limits=limits or ToolLimits())
        loop = HermesAgentLoop(
            model,
            get_tool_definitions(list(TOOLSETS)),
            ctx,
            AgentLoopConfig(max_turns=len(turns) + 1, time_budget_s=time_budget_s),
        )
        result = await loop.run([{"role": "user", "content": "do your worst"}])
    tool_msgs = [m for m in result.messages if m["role"] == "tool"]
    for m in tool_msgs:
        try:
            m["result"] = json.loads(m["content"])
        except json.JSONDecodeError:
            m["result"] = {"raw": m["content"]}
    play.last_result = result  # type: ignore[attr-defined]  # tests read the last result off the function
    return tool_msgs


SANDBOX_KINDS = ("local", "docker")
# A container's own outer limits: a regression inside must fill the container, not the machine
# (the cgroup and rlimit tricks below only hold processes this test starts itself).
DOCKER_OUTER = {"pids_limit": 2000, "memory_mb": 4096}


@pytest.fixture(params=SANDBOX_KINDS)
def sandbox_at(request, tmp_path) -> SandboxPlace:
    if request.param == "local":
        return SandboxPlace(tmp_path)
    image = request.getfixturevalue("docker_sandbox_image")
    return SandboxPlace(tmp_path, "docker", image, request.getfixturevalue("docker_test_id"))


@pytest.fixture(params=SANDBOX_KINDS)
def verifier_at(request, tmp_path) -> SandboxPlace:
    """As `sandbox_at`, in an image with git, python3 and pytest on docker (what a verifier runs)."""
    if request.param == "local":
        return SandboxPlace(tmp_path)
    image = request.getfixturevalue("docker_verifier_image")
    return SandboxPlace(tmp_path, "docker", image, request.getfixturevalue("docker_test_id"))


def backend_config(
    where: Path | SandboxPlace, *, slots: int = 2, sandboxes: int = 1, limits: dict | None = None, **pool
) -> BackendConfig:
    """The sandbox backend's config for `where`: local processes, or containers with outer limits."""
    place = where if isinstance(where, SandboxPlace) else SandboxPlace(where)
    config = SlotPoolConfig(
        slots_per_sandbox=slots, min_sandboxes=sandboxes, max_sandboxes=sandboxes, health_interval_s=30, **pool
    )
    given = {"limits": limits} if limits else {}
    if place.kind == "docker":
        assert place.image is not None
        return docker_config(place.image, place.test_id, pool=config, **DOCKER_OUTER, **given)
    return LocalBackendConfig(pool=config, data_root=str(place.tmp_path / "sb"), **given)


def sandbox_backend(where: Path | SandboxPlace, **kwargs: Any) -> SlotPool:
    return make_backend(backend_config(where, **kwargs))


def server_data_dir(backend: SlotPool) -> Path:
    (proc,) = backend.provider._procs.values()
    return proc.data_dir


@contextlib.asynccontextmanager
async def running_sandbox(where: Path | SandboxPlace, **kwargs: Any) -> AsyncIterator[SlotPool]:
    """`sandbox_backend(where, **kwargs)`, started, and stopped on the way out."""
    backend = sandbox_backend(where, **kwargs)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


@pytest.fixture
async def sandbox(sandbox_at):
    async with running_sandbox(sandbox_at) as backend:
        yield backend


def sandbox_container(backend: SlotPool) -> tuple[str, str] | None:
    """(engine, container id) of the (only) sandbox of a docker pool; None on the local backend."""
    provider = backend.provider
    if not isinstance(provider, DockerSandboxProvider):
        return None
    (sb,) = backend._sandboxes.values()
    return provider.config.engine, provider.container_id(sb.address)


async def server_listdir(backend: SlotPool, rel: str) -> list[str]:
    """The entries of `rel` in the (only) server's data directory, on this machine or in its container."""
    where = sandbox_container(backend)
    if where is not None:
        return await asyncio.to_thread(container_listdir, *where, f"{DATA_DIR}/{rel}")
    return os.listdir(server_data_dir(backend) / rel)


async def server_makedirs(backend: SlotPool, rel: str) -> None:
    """Make `rel` (and its parents) in the (only) server's data directory, on this machine or in its container."""
    where = sandbox_container(backend)
    if where is not None:
        code, out = await asyncio.to_thread(container_exec, *where, ["mkdir", "-p", f"{DATA_DIR}/{rel}"])
        assert code == 0, out
        return
    os.makedirs(server_data_dir(backend) / rel, exist_ok=True)


async def sandbox_processes(backend: SlotPool, text: str) -> list[str]:
    """Command lines holding `text` among the (only) sandbox's processes: this machine's on the local
    backend (`pgrep -af`), the container's own on docker (its `ps`: wherever its engine runs)."""
    where = sandbox_container(backend)
    if where is not None:
        procs = await asyncio.to_thread(container_processes, *where)
        return [f"{p.pid} {p.args}" for p in procs if text in p.args]
    return host_processes(text)


def host_processes(text: str) -> list[str]:
    """This machine's processes whose command line holds `text` (`pgrep -af`, itself left out)."""
    out = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def server_token(backend: SlotPool) -> str:
    (sb,) = backend._sandboxes.values()
    return sb.address.token


async def sigterm_server(backend: SlotPool) -> None:
    """Send the (only) server SIGTERM and check it stops on it within 10 s, process or container."""
    (sb,) = backend._sandboxes.values()
    provider = backend.provider
    if isinstance(provider, DockerSandboxProvider):
        # `stop` sends SIGTERM, then SIGKILL after the timeout: exit code 137 means SIGTERM was not enough.
        state = await asyncio.to_thread(stop_container, provider.config.engine, provider.container_id(sb.address))
        assert not state["Running"] and state["ExitCode"] != 137, state
        return
    proc = provider._procs[sb.address.name].proc
    proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(proc.wait(), 10)


def all_text(msgs: list[dict[str, Any]]) -> str:
    return "\n".join(m["content"] for m in msgs)


@contextlib.contextmanager
def outer_process_limit(max_pids: int):
    """Put this test process (and so every process it starts) in a cgroup v1 pids group of `max_pids`.

    A fork bomb that got past the sandbox's own limits then fills this group, not the machine.
    """
    base = Path("/sys/fs/cgroup/pids")
    if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
        pytest.skip("needs a writable cgroup v1 pids hierarchy to contain the fork bomb safely")
    group = base / f"hermes-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    group.mkdir()
    try:
        (group / "pids.max").write_text(str(max_pids))
        (group / "cgroup.procs").write_text(str(os.getpid()))
        yield group
    finally:
        (base / "cgroup.procs").write_text(str(os.getpid()))
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        for _ in range(100):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@contextlib.contextmanager
def outer_memory_limit(max_bytes: int):
    """Cap the address space of processes started inside (a regression cannot eat the machine's memory)."""
    old = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(
        resource.RLIMIT_AS, (max_bytes, old[1])
    )  # soft only: raising a hard limit back needs a capability
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)
