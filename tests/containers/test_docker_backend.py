"""The docker backend on the real engine: confined slots in containers, late servers, dead containers,
concurrent runs, clean stops, missing images."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

import aiohttp
import docker
import pytest

from backends import make_backend
from backends.docker import LABEL_POOL, LABEL_RUN, DockerBackendError, DockerSandboxProvider
from environments.cli_parse import parse_invocation
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
    pool = make_backend(docker_config(docker_sandbox_image, docker_test_id))
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


def test_containers_of_a_killed_run_are_swept_at_the_next_start(
    docker_engine, docker_sandbox_image, docker_test_id, tmp_path
):
    config = docker_config(docker_sandbox_image, docker_test_id, pool_name=f"sweep-{docker_test_id}")
    # A run that is SIGKILLed with its sandboxes up: nothing of it gets to clean up.
    child = textwrap.dedent(
        """
        import asyncio, sys, time
        from backends import make_backend
        from backends.docker import DockerBackendConfig
        async def main():
            pool = make_backend(DockerBackendConfig.model_validate_json(sys.argv[1]))
            await pool.start()
            print(pool.provider.run_id, flush=True)
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
        dead_run = proc.stdout.readline().strip()
        assert dead_run, "the child run did not start its pool"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(_containers(docker_engine, f"{LABEL_RUN}={dead_run}")) == 1

    async def next_run() -> None:
        pool = make_backend(config)
        await pool.start()
        try:
            assert _containers(docker_engine, f"{LABEL_RUN}={dead_run}") == []
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
    assert len(_containers(docker_engine, f"{LABEL_RUN}={provider.run_id}")) >= 2
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


def test_the_cli_selects_the_docker_backend_from_flags_and_yaml(tmp_path):
    from environments.terminal_tasks.env import TerminalTasksEnv

    flags = [
        "--env.tool_backend",
        "sandbox",
        "--env.sandbox.backend.kind",
        "docker",
        "--env.sandbox.backend.image",
        "ubuntu:22.04",
        "--env.sandbox.backend.pull",
        "never",
        "--env.sandbox.backend.cpus",
        "1.5",
    ]
    inv = parse_invocation(TerminalTasksEnv, ["process", *flags])
    backend = inv.env_config.sandbox.backend
    assert (backend.kind, backend.image, backend.pull, backend.cpus) == ("docker", "ubuntu:22.04", "never", 1.5)
    assert backend.engine == "unix:///var/run/docker.sock"

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "env:\n  tool_backend: sandbox\n  sandbox:\n    backend:\n      kind: docker\n      memory_mb: 2048\n"
        "      engine: unix:///run/podman/podman.sock\n"
    )
    backend = parse_invocation(TerminalTasksEnv, ["process", "--config", str(cfg)]).env_config.sandbox.backend
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
