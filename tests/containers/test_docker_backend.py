"""The docker backend on the real engine: confined slots in containers, late servers, dead containers,
concurrent runs, clean stops, missing images."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import aiohttp
import docker
import pytest

from backends import make_backend
from backends.docker import (
    LABEL_POOL,
    LABEL_RUN,
    DockerBackendConfig,
    DockerBackendError,
    DockerSandboxProvider,
)
from backends.runs import PID_LABEL, PIDNS_LABEL, STARTED_LABEL, owner_gone, pid_namespace
from environments.cli_parse import parse_invocation
from slots.client import SandboxAddress, SandboxClient
from slots.pool import SlotPool, SlotPoolConfig
from tests.support.docker_engine import TEST_LABEL, delayed_runtime, docker_config, load_into_podman

pytestmark = pytest.mark.timeout(300)


def _client(engine: str) -> docker.DockerClient:
    return docker.DockerClient(base_url=engine, version="auto", timeout=60)


def _containers(engine: str, label: str) -> list[dict]:
    client = _client(engine)
    try:
        return client.api.containers(all=True, filters={"label": label})
    finally:
        client.close()


async def _run(pool: SlotPool, command: str, **kw) -> tuple[int, str]:
    async with pool.trajectory("t") as ex:
        r = await ex.exec(command, timeout=60, max_output_bytes=100_000, **kw)
    return r.exit_code, r.output


async def test_pool_runs_commands_confined_and_the_token_stays_out_of_sight(
    docker_engine, docker_sandbox_image, docker_test_id
):
    config = docker_config(docker_sandbox_image, docker_test_id, cpus=1.5, memory_mb=1024, pids_limit=3000)
    pool = make_backend(config)
    await pool.start()
    try:
        (address,) = pool.sandboxes
        assert address.url.startswith("http://127.0.0.1:")
        code, out = await _run(
            pool,
            "id -u; echo ws=$PWD; ls -a / | tr '\\n' ' '; echo; cat /.hermes-token; "
            "cat /proc/1/cmdline | tr '\\0' ' '; echo; ls /var/lib/hermes-sandbox; echo net; "
            "(exec 3<>/dev/tcp/1.1.1.1/53) 2>&1 | head -1",
        )
        lines = out.splitlines()
        assert lines[0] != "0", out  # commands run as the slot's uid, not the container's root
        assert lines[1] == "ws=/workspace", out
        assert ".hermes-token" not in lines[2], out
        assert address.token not in out
        assert "sandbox-server" not in out, out  # its own pid namespace: the server is not pid 1 here
        # offline by default: no network namespace route out
        assert "Network is unreachable" in out or "No such" in out or "Connection refused" in out, out

        provider = pool.provider
        assert isinstance(provider, DockerSandboxProvider)
        client = _client(docker_engine)
        try:
            info = client.api.inspect_container(provider.container_id(address))
        finally:
            client.close()
        assert address.token not in json.dumps(info)  # not in argv, env, labels or mounts
        assert info["HostConfig"]["Privileged"] is False
        host = info["HostConfig"]
        assert (host["NanoCpus"], host["Memory"], host["PidsLimit"]) == (1_500_000_000, 1024 * 2**20, 3000)
        assert [m["Destination"] for m in info["Mounts"] if not m["RW"]] == ["/opt/hermes"]
        assert {c.removeprefix("CAP_") for c in info["HostConfig"]["CapAdd"]} == {
            "SYS_ADMIN",
            "NET_ADMIN",
            "SYS_PTRACE",
        }
        bindings = info["HostConfig"]["PortBindings"]["8080/tcp"]
        assert [b["HostIp"] for b in bindings] == ["127.0.0.1"]
        labels = info["Config"]["Labels"]
        assert labels[LABEL_RUN] == provider.run_id and labels[LABEL_POOL] == "hermes-rl"
        assert labels[TEST_LABEL] == docker_test_id
    finally:
        await pool.stop()


async def test_a_server_listening_3s_after_its_container_started_joins_the_pool(
    docker_engine, docker_sandbox_image, docker_test_id, tmp_path
):
    late = delayed_runtime(docker_sandbox_image.runtime_dir, tmp_path / "late-runtime", 3)
    pool = make_backend(docker_config(docker_sandbox_image, docker_test_id, runtime_dir=late))
    provider = pool.provider
    assert isinstance(provider, DockerSandboxProvider)
    await pool.start()
    try:
        assert len(pool.slots()) == 2
        code, out = await _run(pool, "echo ready")
        assert (code, out.strip()) == (0, "ready")
        # The race is real: when launch returns, the engine says running and nothing answers yet.
        (extra,) = await provider.launch(1)
        assert await provider.alive(extra)
        with pytest.raises(aiohttp.ClientError):
            async with aiohttp.ClientSession() as s, s.get(extra.url + "/health") as resp:
                resp.raise_for_status()
        await provider.terminate(extra)
    finally:
        await pool.stop()


async def test_a_killed_container_is_detected_and_replaced(docker_engine, docker_sandbox_image, docker_test_id):
    pool = make_backend(docker_config(docker_sandbox_image, docker_test_id))
    await pool.start()
    try:
        (first,) = pool.sandboxes
        provider = pool.provider
        assert isinstance(provider, DockerSandboxProvider)
        client = _client(docker_engine)
        try:
            client.api.kill(provider.container_id(first))
        finally:
            client.close()
        assert await pool.check_now() == 1
        (second,) = pool.sandboxes
        assert second.name != first.name and pool.replaced == 1
        assert (await _run(pool, "echo again"))[1].strip() == "again"
        # the dead container went with its sandbox: only the replacement is left of this run
        assert [c["Names"][0].lstrip("/") for c in _containers(docker_engine, f"{LABEL_RUN}={provider.run_id}")] == [
            second.name
        ]
    finally:
        await pool.stop()


async def test_two_concurrent_runs_with_default_names_keep_their_sandboxes(
    docker_engine, docker_sandbox_image, docker_test_id
):
    a = make_backend(docker_config(docker_sandbox_image, docker_test_id))
    b = make_backend(docker_config(docker_sandbox_image, docker_test_id))
    await a.start()
    try:
        (a_box,) = a.sandboxes
        await b.start()  # same pool name, same host: its start-up sweep must leave a's container alone
        try:
            assert await a.check_now() == 0 and a.sandboxes == [a_box]
            held = await a.acquire()
            try:
                r = await a.executor(held).exec("echo a-still-here", timeout=60, max_output_bytes=1000)
                assert r.output.strip() == "a-still-here"
            finally:
                await a.release(held)
        finally:
            await b.stop()
        # b's stop removed b's containers only
        assert await a.check_now() == 0 and a.sandboxes == [a_box]
        assert (await _run(a, "echo after"))[1].strip() == "after"
    finally:
        await a.stop()


def test_another_live_process_keeps_its_sandboxes_and_a_killed_ones_are_swept(
    docker_engine, docker_sandbox_image, docker_test_id, tmp_path
):
    config = docker_config(docker_sandbox_image, docker_test_id, pool_name=f"sweep-{docker_test_id}")
    # Another run in its own process, same pool name, later SIGKILLed: nothing of it gets to clean up.
    child = textwrap.dedent(
        """
        import asyncio, json, sys
        from backends import make_backend
        from backends.docker import DockerBackendConfig
        async def main():
            pool = make_backend(DockerBackendConfig.model_validate_json(sys.argv[1]))
            await pool.start()
            (a,) = pool.sandboxes
            print(json.dumps([pool.provider.run_id, a.name, a.url, a.token]), flush=True)
            await asyncio.sleep(600)
        asyncio.run(main())
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child, config.model_dump_json()],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert proc.stdout is not None
        other_run, *address = json.loads(proc.stdout.readline())
        other = SandboxAddress(*address)

        async def beside_it() -> None:
            pool = make_backend(config)
            await pool.start()  # its sweep must leave the live run's sandbox alone
            try:
                assert len(pool.sandboxes) == 1
            finally:
                await pool.stop()
            async with aiohttp.ClientSession() as http:  # still there and answering after our stop
                assert (await SandboxClient(other, http).health())["slots"]

        asyncio.run(beside_it())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(_containers(docker_engine, f"{LABEL_RUN}={other_run}")) == 1

    async def next_run() -> None:
        pool = make_backend(config)
        await pool.start()
        try:
            assert _containers(docker_engine, f"{LABEL_RUN}={other_run}") == []
            assert len(pool.sandboxes) == 1
        finally:
            await pool.stop()

    asyncio.run(next_run())


async def test_stop_leaves_no_container_of_the_run_even_half_started(
    docker_engine, docker_sandbox_image, docker_test_id
):
    pool = make_backend(
        docker_config(
            docker_sandbox_image,
            docker_test_id,
            pool=SlotPoolConfig(slots_per_sandbox=1, min_sandboxes=2, max_sandboxes=3, health_interval_s=30),
        )
    )
    provider = pool.provider
    assert isinstance(provider, DockerSandboxProvider)
    await pool.start()
    # A launch cancelled part-way (as a stopping run does): whatever it created must still go.
    scale = asyncio.create_task(provider.launch(1))
    await asyncio.sleep(0.2)
    scale.cancel()
    await asyncio.gather(scale, return_exceptions=True)
    # the cancelled launch removed what it had created once its create landed: the pool's two remain
    assert len(_containers(docker_engine, f"{LABEL_RUN}={provider.run_id}")) == 2
    await pool.stop()
    assert _containers(docker_engine, f"{LABEL_RUN}={provider.run_id}") == []


async def test_a_missing_image_with_pull_never_is_one_line_naming_it(
    docker_engine, docker_sandbox_image, docker_test_id
):
    image = f"hermes-rl-test/absent-{docker_test_id}:v1"
    config = docker_config(docker_sandbox_image, docker_test_id).model_copy(update={"image": image})
    pool = make_backend(config)
    with pytest.raises(DockerBackendError) as err:
        await pool.start()
    message = str(err.value)
    assert "\n" not in message and image in message and "pull is never" in message
    assert _containers(docker_engine, f"{TEST_LABEL}={docker_test_id}") == []


async def test_an_image_that_cannot_be_pulled_is_one_line_naming_it(
    docker_engine, docker_sandbox_image, docker_test_id
):
    # A registry on a closed local port: the pull fails at once, with no network beyond 127.0.0.1.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    image = f"127.0.0.1:{port}/hermes-rl-test/absent:v1"
    config = docker_config(docker_sandbox_image, docker_test_id).model_copy(update={"image": image, "pull": "missing"})
    with pytest.raises(DockerBackendError) as err:
        await make_backend(config).start()
    message = str(err.value)
    assert "\n" not in message and image in message and "could not be pulled" in message


async def test_no_engine_at_the_address_is_one_line_naming_it(docker_sandbox_image, tmp_path):
    engine = f"unix://{tmp_path}/no-engine.sock"
    config = docker_config(docker_sandbox_image, "none", engine=engine)
    with pytest.raises(DockerBackendError) as err:
        await make_backend(config).start()
    message = str(err.value)
    assert "\n" not in message and engine in message and "no container engine answers" in message


def test_only_a_provably_dead_owner_is_swept():
    me = os.getpid()
    host, pidns = socket.gethostname(), pid_namespace()
    mine = DockerSandboxProvider(DockerBackendConfig()).labels()
    assert not owner_gone(mine, host, pidns)  # a live run (this process)
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = {**mine, PID_LABEL: str(dead.pid)}
    assert owner_gone(gone, host, pidns)
    assert not owner_gone(gone, "another-host", pidns)  # another machine: cannot tell
    assert not owner_gone({**gone, PIDNS_LABEL: "other-boot:1"}, host, pidns)  # another container
    reused = {**mine, STARTED_LABEL: "1"}  # this pid, but a different process started it
    assert owner_gone(reused, host, pidns) and str(me) == mine[PID_LABEL]


def test_the_cli_selects_the_docker_backend_from_flags_and_yaml(tmp_path):
    from environments.terminal_tasks.env import TerminalTasksEnv

    flags = [
        "--env.runtime.tool_backend",
        "sandbox",
        "--env.runtime.sandbox.backend.kind",
        "docker",
        "--env.runtime.sandbox.backend.image",
        "ubuntu:22.04",
        "--env.runtime.sandbox.backend.pull",
        "never",
        "--env.runtime.sandbox.backend.cpus",
        "1.5",
    ]
    inv = parse_invocation(TerminalTasksEnv, ["process", *flags])
    backend = inv.env_config.runtime.sandbox.backend
    assert (backend.kind, backend.image, backend.pull, backend.cpus) == ("docker", "ubuntu:22.04", "never", 1.5)
    assert backend.engine == "unix:///var/run/docker.sock"

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "env:\n  runtime:\n    tool_backend: sandbox\n    sandbox:\n      backend:\n        kind: docker\n"
        "        memory_mb: 2048\n        engine: unix:///run/podman/podman.sock\n"
    )
    backend = parse_invocation(TerminalTasksEnv, ["process", "--config", str(cfg)]).env_config.runtime.sandbox.backend
    assert (backend.kind, backend.memory_mb, backend.engine) == ("docker", 2048, "unix:///run/podman/podman.sock")


async def test_the_same_backend_runs_a_pool_on_podmans_compatible_api(
    docker_sandbox_image, podman_engine, podman_test_id
):
    await asyncio.to_thread(load_into_podman, docker_sandbox_image.image)
    config = docker_config(
        docker_sandbox_image, podman_test_id, engine=podman_engine.engine, ulimits=podman_engine.ulimits
    )
    pool = make_backend(config)
    await pool.start()
    try:
        (address,) = pool.sandboxes
        assert address.url.startswith("http://127.0.0.1:")
        code, out = await _run(pool, "id -u; ls -a /")
        assert code == 0 and out.splitlines()[0] != "0" and ".hermes-token" not in out, out
        provider = pool.provider
        assert isinstance(provider, DockerSandboxProvider)
        client = _client(podman_engine.engine)
        try:
            client.api.kill(provider.container_id(address))
        finally:
            client.close()
        assert await pool.check_now() == 1 and len(pool.sandboxes) == 1
        assert (await _run(pool, "echo replaced"))[1].strip() == "replaced"
    finally:
        await pool.stop()
    assert _containers(podman_engine.engine, f"{LABEL_RUN}={provider.run_id}") == []
