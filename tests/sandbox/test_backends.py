"""One suite, three backends: local processes, Nomad (test double) and Modal (test double).

Each double runs the job's/sandbox's image and command line as a container on the real Docker
engine, reporting "running" when the real service does (before the server listens), so the path
platform -> sandbox -> slot -> bubblewrapped command is real in all three.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from backends import make_backend
from backends.local import LocalBackendConfig, local_backend
from backends.modal import (
    DOCKERFILE,
    ModalBackendConfig,
    ModalIsolationError,
    ModalSandboxProvider,
    ModalSDKAdapter,
    modal_backend,
)
from backends.nomad import (
    NomadBackendConfig,
    NomadError,
    NomadHTTP,
    NomadSandboxProvider,
    build_job_spec,
    nomad_backend,
)
from backends.runs import RunOwner
from tests.support.nomad_modal_doubles import (
    MODAL_SANDBOX_CREATE_PARAMS,
    ModalTestDouble,
    NomadTestDouble,
    check_job_spec,
)
from slots.client import SandboxUnavailable
from slots.client import SlotState
from slots.pool import SlotAcquireTimeout, SlotPool, SlotPoolConfig

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Harness:
    pool: SlotPool
    pid_of: Callable[[str], int]
    marker: str  # a path every process of this backend has on its command line
    double: object | None = None


def _pool(**kw) -> SlotPoolConfig:
    base = dict(slots_per_sandbox=2, min_sandboxes=1, max_sandboxes=2, acquire_timeout_s=20, health_interval_s=30)
    return SlotPoolConfig(**(base | kw))


def nomad_config(image: str, **pool) -> NomadBackendConfig:
    return NomadBackendConfig(pool=_pool(**pool), image=image, poll_interval_s=0.05, startup_timeout_s=60)


def modal_config(**kw) -> ModalBackendConfig:
    return ModalBackendConfig(**({"pool": _pool(), "create_rate_per_s": 50, "startup_timeout_s": 60} | kw))


def modal_double(tmp_path, image: str, **kw) -> ModalTestDouble:
    """A Modal double whose build of our Dockerfile gives `image`."""
    return ModalTestDouble(tmp_path / "modal", images={f"dockerfile:{DOCKERFILE}": image}, **kw)


def make_harness(kind: str, tmp_path, image: str, **pool) -> Harness:
    if kind == "local":
        backend = local_backend(LocalBackendConfig(pool=_pool(**pool), data_root=str(tmp_path / "local")))
        return Harness(
            backend,
            lambda name: backend.provider.pid(next(a for a in backend.sandboxes if a.name == name)),
            str(tmp_path),
        )
    if kind == "nomad":
        double = NomadTestDouble(tmp_path / "nomad")
        return Harness(nomad_backend(nomad_config(image, **pool), double), double.pid, str(tmp_path), double)
    mdouble = modal_double(tmp_path, image)
    return Harness(modal_backend(modal_config(pool=_pool(**pool)), mdouble), mdouble.pid, str(tmp_path), mdouble)


def count_processes(marker: str) -> int:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return len([p for p in out if int(p) != os.getpid()])


def processes_left(marker: str, within_s: float = 10.0) -> int:
    """How many processes match `marker` once they had `within_s` to exit: a killed server's slot
    namespaces end through their parent-death signal, asynchronously (a loaded machine takes a moment)."""
    deadline = time.monotonic() + within_s
    while (n := count_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return n


@pytest.fixture(params=["local", "nomad", "modal"])
async def harness(request, tmp_path, project_sandbox_image):
    h = make_harness(request.param, tmp_path, project_sandbox_image)
    try:
        await h.pool.start()
        yield h
    finally:
        await h.pool.stop()
        if h.double is not None:
            await h.double.close()


async def test_execute_in_a_slot_and_release_resets_it(harness):
    backend = harness.pool
    slot = await backend.acquire()
    assert slot.state is SlotState.BUSY and slot.workspace == "/workspace"
    result = await backend.executor(slot).exec(
        "echo data > f.txt && cat f.txt && pwd", timeout=30, max_output_bytes=100_000
    )
    assert result.exit_code == 0 and result.output == "data\n/workspace\n"
    assert [f["path"] for f in await backend.artifacts(slot)] == ["f.txt"]
    await backend.release(slot)
    assert slot.state is SlotState.FREE
    again = [await backend.acquire() for _ in range(2)]
    assert slot in again  # the same slot, handed out again, is empty
    assert (await backend.executor(slot).exec("ls -A", timeout=30, max_output_bytes=100_000)).output == ""


async def test_scales_up_to_max_then_acquire_times_out(harness):
    backend = harness.pool
    assert len(backend.sandboxes) == 1
    slots = [await backend.acquire() for _ in range(4)]
    assert len(backend.sandboxes) == 2
    assert len({s.sandbox.name for s in slots}) == 2
    with pytest.raises(SlotAcquireTimeout, match="max_sandboxes"):
        await backend.acquire(timeout=0.5)
    results = await asyncio.gather(
        *(
            backend.executor(s).exec(f"echo {i}; echo {i} > mine", timeout=30, max_output_bytes=100_000)
            for i, s in enumerate(slots)
        )
    )
    assert [r.output for r in results] == [f"{i}\n" for i in range(4)]
    # each slot saw only its own file
    listing = await asyncio.gather(
        *(backend.executor(s).exec("cat mine; ls -A | wc -l", timeout=30, max_output_bytes=100_000) for s in slots)
    )
    assert [r.output.split() for r in listing] == [[str(i), "1"] for i in range(4)]
    for s in slots:
        await backend.release(s)


async def test_killed_sandbox_is_detected_and_its_slots_replaced(harness):
    backend = harness.pool
    slot = await backend.acquire()
    doomed = slot.sandbox.name
    os.kill(harness.pid_of(doomed), signal.SIGKILL)
    for _ in range(200):  # a container's processes die with its init a moment later: wait for the platform to see it
        if not await backend.provider.alive(slot.sandbox):
            break
        await asyncio.sleep(0.05)
    with pytest.raises(SandboxUnavailable):
        await backend.executor(slot).exec("true", timeout=30, max_output_bytes=100_000)
    assert await backend.check_now() == 1
    assert backend.replaced == 1
    assert doomed not in [a.name for a in backend.sandboxes]
    assert slot.state is SlotState.DEAD
    await backend.release(slot)  # releasing a dead slot drops it quietly
    fresh = await backend.acquire()
    assert fresh.sandbox.name != doomed
    assert (await backend.executor(fresh).exec("echo alive", timeout=30, max_output_bytes=100_000)).output == "alive\n"


@pytest.mark.slow
async def test_stop_leaves_no_sandbox_server_or_bwrap_process(tmp_path, project_sandbox_image):
    for kind in ("local", "nomad", "modal"):
        h = make_harness(kind, tmp_path / kind, project_sandbox_image)
        try:
            await h.pool.start()
            slots = [await h.pool.acquire() for _ in range(3)]
            # a long command is running in a slot while we shut down
            running = asyncio.create_task(
                h.pool.executor(slots[0]).exec("sleep 336.5", timeout=60, max_output_bytes=100_000)
            )
            deadline = time.monotonic() + 60  # started: seen, however slow the machine is
            while not count_processes("sleep 336.5") and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert count_processes("sleep 336.5") >= 1
            if h.double is None:
                assert count_processes(h.marker) >= 2  # 2 servers (+ bwrap of the running command)
            else:
                assert await h.double.running() == 2
            await h.pool.stop()
            with pytest.raises((SandboxUnavailable, asyncio.CancelledError)):
                await running
            if h.double is not None:
                assert await h.double.running() == 0, kind  # before close(): stop() itself removed them
            assert processes_left(h.marker) == 0, kind
            assert processes_left("sleep 336.5") == 0, kind
        finally:
            if h.double is not None:
                await h.double.close()


# -- readiness: running is not listening ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["nomad", "modal"])
async def test_a_server_that_listens_3s_after_its_container_starts_still_makes_a_pool(
    kind, tmp_path, project_sandbox_image
):
    """The platform says running/tunnel-ready while nothing listens yet; the pool waits for /health."""
    import docker

    from tests.support.sandbox_image import slow_start_image

    client = docker.from_env()
    slow = slow_start_image(client, project_sandbox_image, 3)
    client.close()
    if kind == "nomad":
        double: NomadTestDouble | ModalTestDouble = NomadTestDouble(tmp_path / "nomad")
        pool = nomad_backend(nomad_config(slow), double)
    else:
        double = modal_double(tmp_path, slow)
        pool = modal_backend(modal_config(), double)
    seen_running_before_listening = asyncio.Event()

    async def watch() -> None:  # what the platform reports while the server is still asleep
        while True:
            if kind == "nomad":
                for job_id in list(double.jobs):
                    for stub in await double.job_allocations(job_id):
                        addr = f"http://127.0.0.1:{double.allocs[stub['ID']].box.port}"
                        if stub["ClientStatus"] == "running" and not await _answers(addr):
                            seen_running_before_listening.set()
            else:
                for sb in list(double.sandboxes.values()):
                    if sb.box.status == "running" and not await _answers(f"http://127.0.0.1:{sb.box.port}"):
                        seen_running_before_listening.set()
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch())
    try:
        await pool.start()
        assert seen_running_before_listening.is_set()
        slot = await pool.acquire()
        result = await pool.executor(slot).exec("echo late but ready", timeout=30, max_output_bytes=1000)
        assert result.output == "late but ready\n"
    finally:
        watcher.cancel()
        await pool.stop()
        await double.close()


async def _answers(url: str) -> bool:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/health", timeout=1) as response:
            return response.status < 500
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False


@pytest.mark.parametrize("kind", ["nomad", "modal"])
async def test_two_concurrent_runs_with_default_names_keep_their_sandboxes(kind, tmp_path, project_sandbox_image):
    """`evaluate` beside `serve`: the second run's start sweeps nothing of the first, and each stop only its own."""
    if kind == "nomad":
        double: NomadTestDouble | ModalTestDouble = NomadTestDouble(tmp_path / "nomad")
        first, second = (nomad_backend(nomad_config(project_sandbox_image), double) for _ in range(2))
    else:
        double = modal_double(tmp_path, project_sandbox_image)
        first, second = (modal_backend(modal_config(), double) for _ in range(2))
    try:
        await first.start()
        slot = await first.acquire()
        run = first.executor(slot).exec
        assert (await run("echo started > mine", timeout=30, max_output_bytes=1000)).exit_code == 0
        await second.start()
        other = await second.acquire()
        assert first.provider.orphans_removed == second.provider.orphans_removed == 0
        assert await double.running() == 2
        assert {a.name for a in first.sandboxes}.isdisjoint(a.name for a in second.sandboxes)
        await second.stop()
        assert (await run("cat mine", timeout=30, max_output_bytes=1000)).output == "started\n"
        assert await first.check_now() == 0 and first.replaced == 0
        await first.release(slot)
        del other
    finally:
        await second.stop()
        await first.stop()
        await double.close()


# -- platform specifics -------------------------------------------------------------------------


def _meta() -> dict[str, str]:
    return RunOwner.current("r1").labels()


def test_nomad_job_spec_follows_the_documented_shape():
    for driver in ("docker", "raw_exec", "singularity"):
        job = build_job_spec(
            NomadBackendConfig(driver=driver, image="reg/img:1"), job_id="p-3", token="t", meta=_meta()
        )
        check_job_spec(job)
        group = job["TaskGroups"][0]
        task = group["Tasks"][0]
        assert job["ID"] == "p-3" and job["Type"] == "service" and group["Count"] == 1 and task["Driver"] == driver
        assert group["ReschedulePolicy"] == {"Attempts": 0, "Unlimited": False}  # the pool replaces, not Nomad
        assert "${NOMAD_PORT_http}" in task["Config"]["args"]
        assert task["Env"]["SANDBOX_SERVER_TOKEN"] == "t"
        assert "t" not in task["Config"]["args"]  # the token is not on the command line
        assert job["Meta"]["hermes_rl_pool"] == "hermes-rl-sandboxes" and job["Meta"]["hermes_rl_run"] == "r1"
    docker_job = build_job_spec(
        NomadBackendConfig(driver="docker", image="reg/img:1"), job_id="p-0", token="t", meta=_meta()
    )
    config = docker_job["TaskGroups"][0]["Tasks"][0]["Config"]
    assert config["ports"] == ["http"] and config["force_pull"] is False and config["privileged"] is False
    assert config["command"] == "/opt/hermes/sandbox-server" and "SYS_ADMIN" in config["cap_add"]
    broken = build_job_spec(NomadBackendConfig(image="reg/img:1"), job_id="p-0", token="t", meta=_meta())
    broken["TaskGroups"][0]["Tasks"][0]["Config"].pop("image")
    with pytest.raises(ValueError, match="needs Config.image"):
        check_job_spec(broken)


@pytest.mark.parametrize("image", ["hermes-rl-sandbox", "hermes-rl-sandbox:latest", "reg:5000/x/sandbox:latest"])
def test_nomad_refuses_images_the_docker_driver_would_always_pull(image):
    with pytest.raises(ValueError, match="no pinned tag") as failure:
        NomadBackendConfig(image=image)
    (error,) = failure.value.errors()
    assert "\n" not in error["msg"] and "pulls untagged and :latest images on every start" in error["msg"]
    assert NomadBackendConfig(image="reg:5000/x/sandbox:3f2a").image == "reg:5000/x/sandbox:3f2a"
    assert NomadBackendConfig(image="x/sandbox@sha256:" + "0" * 64).image


async def test_nomad_missing_image_fails_in_one_line_naming_the_pull(tmp_path, project_sandbox_image):
    double = NomadTestDouble(tmp_path / "nomad")
    pool = nomad_backend(nomad_config("reg.example/nowhere:1"), double)
    try:
        with pytest.raises(NomadError) as failure:
            await pool.start()
        message = str(failure.value)
        assert "Failed to pull `reg.example/nowhere:1`" in message and "\n" not in message
        assert double.jobs == {}  # the half-started job was purged
    finally:
        await double.close()
    unset = nomad_backend(NomadBackendConfig(pool=_pool()), double)
    with pytest.raises(ValueError, match="needs backend.image"):
        await unset.start()


async def _wait_running(double: NomadTestDouble, job_id: str, n: int) -> list[dict]:
    for _ in range(600):
        stubs = [a for a in await double.job_allocations(job_id) if a["DesiredStatus"] == "run"]
        if sum(a["ClientStatus"] == "running" for a in stubs) == n:
            return stubs
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job_id}: {stubs}")


async def test_the_nomad_double_makes_the_reconcilers_choices(tmp_path, project_sandbox_image):
    """Why one job per sandbox: on one scaled job, retiring a chosen allocation kills another."""
    double = NomadTestDouble(tmp_path / "nomad")
    job = build_job_spec(NomadBackendConfig(image=project_sandbox_image), job_id="shared", token="t", meta=_meta())
    job["TaskGroups"][0].pop("ReschedulePolicy")
    try:
        job["TaskGroups"][0]["Count"] = 3
        await double.register_job(job)
        first = {a["Name"]: a["ID"] for a in await _wait_running(double, "shared", 3)}
        assert sorted(first) == ["shared.sandbox[0]", "shared.sandbox[1]", "shared.sandbox[2]"]
        # Stop the allocation we want gone: Nomad stops it and places a replacement with its name.
        await double.stop_allocation(first["shared.sandbox[0]"])
        after_stop = {a["Name"]: a["ID"] for a in await _wait_running(double, "shared", 3)}
        assert after_stop["shared.sandbox[0]"] != first["shared.sandbox[0]"]
        # Then Count-1: the highest name index is stopped, though nobody asked for it.
        job["TaskGroups"][0]["Count"] = 2
        await double.register_job(job)
        left = {a["Name"]: a["ID"] for a in await _wait_running(double, "shared", 2)}
        assert left == {
            "shared.sandbox[0]": after_stop["shared.sandbox[0]"],
            "shared.sandbox[1]": first["shared.sandbox[1]"],
        }
        assert double.allocs[first["shared.sandbox[2]"]].client_status() == "complete"
        # A failed allocation (its container's process killed) is rescheduled under the default policy.
        os.kill(double.allocs[first["shared.sandbox[1]"]].box.pid, signal.SIGKILL)
        for _ in range(100):
            await double.job_allocations("shared")
            if double.allocs[first["shared.sandbox[1]"]].client_status() == "failed":
                break
            await asyncio.sleep(0.05)
        again = {a["Name"]: a["ID"] for a in await _wait_running(double, "shared", 2)}
        assert again["shared.sandbox[1]"] != first["shared.sandbox[1]"]
    finally:
        await double.close()


@pytest.mark.slow
async def test_nomad_retiring_sandbox_k_leaves_every_other_in_use_sandbox_running(tmp_path, project_sandbox_image):
    n = 3
    for k in range(n):
        h = make_harness(
            "nomad", tmp_path / f"k{k}", project_sandbox_image, min_sandboxes=n, max_sandboxes=n, slots_per_sandbox=1
        )
        double: NomadTestDouble = h.double
        try:
            await h.pool.start()
            slots = [await h.pool.acquire() for _ in range(n)]  # every sandbox in use
            names = [s.sandbox.name for s in slots]
            run_id = h.pool.provider.owner.run_id
            assert sorted(names) == [f"hermes-rl-sandboxes-{run_id}-{i}" for i in range(n)]
            pids = {name: h.pid_of(name) for name in names}
            await h.pool.provider.terminate(slots[k].sandbox)
            assert double.jobs.keys() == set(names) - {names[k]}
            others = [s for i, s in enumerate(slots) if i != k]
            for s in others:
                assert h.pid_of(s.sandbox.name) == pids[s.sandbox.name]  # the same process, untouched
                assert (
                    await h.pool.executor(s).exec("echo still here", timeout=30, max_output_bytes=100_000)
                ).output == "still here\n"
            assert await double.running() == n - 1  # and nothing untracked was started in its place
            with pytest.raises(KeyError):
                h.pid_of(names[k])
        finally:
            await h.pool.stop()
            await double.close()


def _gone_owner(run_id: str) -> RunOwner:
    """A run on this host whose process has exited."""
    child = subprocess.Popen(["true"])
    child.wait()
    me = RunOwner.current()
    return RunOwner(run_id, me.host, me.pidns, child.pid, "1")


async def test_nomad_sweeps_its_own_and_gone_runs_jobs_only(tmp_path, project_sandbox_image):
    double = NomadTestDouble(tmp_path / "nomad")
    config = nomad_config(project_sandbox_image).model_copy(update={"run_id": "crashed"})
    crashed = nomad_backend(config, double)  # this run before a restart: it never stopped
    gone = SlotPool(NomadSandboxProvider(config, double, owner=_gone_owner("gone")), config.pool)
    alive = nomad_backend(nomad_config(project_sandbox_image), double)  # a concurrent run, alive
    other_pool = nomad_backend(nomad_config(project_sandbox_image).model_copy(update={"job_id": "other"}), double)
    restarted = nomad_backend(config, double)  # the same run_id: its leftovers are its to sweep
    try:
        for pool in (crashed, gone, alive, other_pool):
            await pool.provider.launch(1)
        survivors = {alive.provider._prefix + "0", "other-" + other_pool.provider.owner.run_id + "-0"}
        await restarted.start()
        assert restarted.provider.orphans_removed == 2
        assert set(double.jobs) == survivors | {"hermes-rl-sandboxes-crashed-0"}  # its own new job
        registered = [c[1] for c in double.calls if c[0] == "register_job"]
        assert all(job["TaskGroups"][0]["Count"] == 1 for job in registered)
        assert not [c for c in double.calls if c[0] == "stop_allocation"]
        await restarted.stop()
        assert set(double.jobs) == survivors
    finally:
        for pool in (alive, other_pool):
            await pool.provider.stop()
        await double.close()


async def test_nomad_http_uses_the_configured_address_and_token_not_the_environment(
    tmp_path, monkeypatch, project_sandbox_image
):
    double = NomadTestDouble(tmp_path / "nomad", acl_token="acl-secret")
    address = await double.serve()
    # Everything python-nomad or httpx would read from the environment points somewhere wrong.
    monkeypatch.setenv("NOMAD_ADDR", "http://127.0.0.1:9")
    monkeypatch.setenv("NOMAD_NAMESPACE", "elsewhere")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NOMAD_TOKEN", "acl-secret")  # the secret's one place: make_backend reads it
    config = nomad_config(project_sandbox_image).model_copy(update={"address": address})
    backend = make_backend(config)
    try:
        await backend.start()
        slot = await backend.acquire()
        assert (
            await backend.executor(slot).exec("echo via http", timeout=30, max_output_bytes=100_000)
        ).output == "via http\n"
        name = slot.sandbox.name
        await backend.provider.terminate(slot.sandbox)
        assert name not in double.jobs and ("DELETE", f"/v1/job/{name}", {"purge": "true"}) in double.http_requests
    finally:
        await backend.stop()
    assert await double.running() == 0
    await double.close()
    assert all("namespace" not in query for _, _, query in double.http_requests)
    assert {m for m, _, _ in double.http_requests} == {"GET", "POST", "DELETE"}
    # A wrong token is refused in one line that names the status.
    monkeypatch.setenv("NOMAD_TOKEN", "wrong")
    double2 = NomadTestDouble(tmp_path / "n2", acl_token="acl-secret")
    bad = make_backend(nomad_config(project_sandbox_image).model_copy(update={"address": await double2.serve()}))
    try:
        with pytest.raises(NomadError, match="HTTP 403"):
            await bad.start()
    finally:
        await double2.close()


async def test_nomad_unreachable_address_is_named(tmp_path):
    api = NomadHTTP(NomadBackendConfig(address="http://127.0.0.1:9"))
    with pytest.raises(NomadError, match="cannot reach Nomad at http://127.0.0.1:9"):
        await api.list_jobs("x")
    await api.aclose()


@pytest.mark.slow
async def test_modal_sweeps_its_own_and_gone_runs_caps_starts_and_uses_documented_arguments(
    tmp_path, project_sandbox_image
):
    double = modal_double(tmp_path, project_sandbox_image)
    config = modal_config(pool=_pool(min_sandboxes=3, max_sandboxes=3), max_starting=1, run_id="crashed")
    # This run crashed and left a sandbox behind; a run on this host whose process is gone left another;
    # a live concurrent run holds a third.
    crashed = modal_backend(config, double)
    gone = SlotPool(ModalSandboxProvider(config, double, owner=_gone_owner("gone")), config.pool)
    alive = modal_backend(modal_config(), double)
    backend = modal_backend(config, double)
    try:
        for pool in (alive, crashed, gone):  # (a start sweeps gone runs: `gone` launches last)
            await pool.provider.start()
            await pool.provider.launch(1)
        assert await double.running() == 3
        await backend.start()
        assert backend.provider.orphans_removed == 2
        assert await double.running() == 4  # its 3 and the live run's
        assert double.max_starting_seen == 1
        creates = [c[1] for c in double.calls if c[0] == "create_sandbox"]
        for kw in creates:
            assert set(kw) - {"app_id", "args", "image"} <= MODAL_SANDBOX_CREATE_PARAMS
            assert kw["timeout"] == config.lifetime_s and kw["encrypted_ports"] == [8080]
            assert kw["tags"]["hermes_rl_pool"] == "default"  # tagged in the create call itself
            assert kw["image"] == f"dockerfile:{ROOT / 'Dockerfile'}"  # built from our Dockerfile by default
            assert kw["args"][0] == "/opt/hermes/sandbox-server"
        names = [kw["name"] for kw in creates]
        assert names[-3:] == ["default-crashed-0", "default-crashed-1", "default-crashed-2"]  # swept first, then reused
        with pytest.raises(ValueError, match="already exists"):  # Modal's names are unique in an app
            await double.create_sandbox(creates[-1]["app_id"], backend.provider.spec("default-crashed-1"))
        assert set(ModalSDKAdapter.create_kwargs(backend.provider.spec("x"))) <= MODAL_SANDBOX_CREATE_PARAMS
    finally:
        await backend.stop()
        await alive.provider.stop()
        await double.close()


def test_modal_lifetime_is_at_most_24_hours():
    assert ModalBackendConfig(lifetime_s=86400).lifetime_s == 86400
    with pytest.raises(ValueError, match="less than or equal to 86400"):
        ModalBackendConfig(lifetime_s=86401)


async def test_modal_named_registry_image_is_used_as_is(tmp_path, project_sandbox_image):
    double = ModalTestDouble(tmp_path / "modal", images={"reg.example/hermes:1": project_sandbox_image})
    backend = modal_backend(modal_config(image="reg.example/hermes:1"), double)
    try:
        await backend.start()
        (create,) = [c[1] for c in double.calls if c[0] == "create_sandbox"]
        assert create["image"] == "reg.example/hermes:1" and "runtime" not in create
    finally:
        await backend.stop()
        await double.close()


async def test_modal_moves_to_the_vm_runtime_when_bwrap_cannot_isolate_under_gvisor(
    tmp_path, caplog, project_sandbox_image
):
    double = modal_double(tmp_path, project_sandbox_image, gvisor_netns_broken=True)
    backend = modal_backend(modal_config(pool=_pool(min_sandboxes=2)), double)
    try:
        await backend.start()
        creates = [c[1] for c in double.calls if c[0] == "create_sandbox"]
        assert [c.get("runtime") for c in creates] == [None, "vm", "vm"]  # probe on gVisor, then every one on vm
        assert backend.provider.runtime == "vm" and await double.running() == 2
        assert "using the vm runtime" in caplog.text and "RTM_NEWADDR" in caplog.text
        slot = await backend.acquire()
        assert (
            await backend.executor(slot).exec("echo isolated", timeout=30, max_output_bytes=100_000)
        ).output == "isolated\n"
    finally:
        await backend.stop()
        await double.close()


async def test_modal_isolation_failure_without_fallback_is_one_clear_line(tmp_path, project_sandbox_image):
    double = modal_double(tmp_path, project_sandbox_image, gvisor_netns_broken=True)
    backend = modal_backend(modal_config(isolation_fallback="fail"), double)
    try:
        with pytest.raises(ModalIsolationError) as failure:
            await backend.start()
        message = str(failure.value)
        assert "default (gVisor) runtime" in message and "RTM_NEWADDR" in message and "runtime: vm" in message
        assert "\n" not in message
        assert await double.running() == 0
    finally:
        await double.close()


async def test_modal_creation_rate_is_limited(tmp_path, project_sandbox_image):
    double = modal_double(tmp_path, project_sandbox_image)
    backend = modal_backend(modal_config(pool=_pool(min_sandboxes=3, max_sandboxes=3), create_rate_per_s=4), double)
    try:
        await backend.start()
        times = sorted(s.created_at for s in double.sandboxes.values())
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(g >= 0.2 for g in gaps), gaps  # 4/s -> at least 0.25 s apart (less a little scheduling slack)
    finally:
        await backend.stop()
        await double.close()


async def test_modal_sandbox_past_its_lifetime_is_replaced(tmp_path, project_sandbox_image):
    double = modal_double(tmp_path, project_sandbox_image)
    # No drain (drain_before_expiry_s=0): Modal ends it, and the health check replaces it. The
    # double's clock passes the lifetime once the start is done (a wall-clock lifetime raced the
    # start on a loaded machine: "ended before it was ready").
    backend = modal_backend(modal_config(pool=_pool(drain_before_expiry_s=0), lifetime_s=600), double)
    try:
        await backend.start()
        first = backend.sandboxes[0].name
        sandbox = next(s for s in double.sandboxes.values() if s.spec.name == first)
        assert not sandbox.terminated
        await double.pass_lifetime(sandbox.id)
        assert sandbox.terminated
        assert await backend.check_now() == 1
        assert backend.sandboxes[0].name != first
    finally:
        await backend.stop()
        await double.close()


async def test_modal_sandbox_near_its_end_is_drained_and_replaced_without_voiding_a_trajectory(
    tmp_path, project_sandbox_image
):
    """A trajectory in a sandbox that nears Modal's `timeout` finishes there; new ones go to the replacement."""
    double = modal_double(tmp_path, project_sandbox_image)
    # A drain window as long as the lifetime: the first health round drains it (Modal would end it after 60 s).
    backend = modal_backend(modal_config(pool=_pool(drain_before_expiry_s=60), lifetime_s=60), double)
    try:
        await backend.start()
        old = backend.sandboxes[0].name
        async with backend.trajectory("t-old") as tools:
            busy = tools.slot
            assert busy.sandbox.name == old
            await backend.check_now()  # the health loop's round: drains `old`, starts a replacement
            assert [a.name for a in backend.sandboxes] != [old] and len(backend.sandboxes) == 1
            new = backend.sandboxes[0].name
            assert old in double_names(double, running=True)  # still there: a trajectory runs in it
            other = await backend.acquire(timeout=10)
            assert other.sandbox.name == new  # new work goes to the replacement only
            result = await tools.exec("echo finished where it started", timeout=30, max_output_bytes=1000)
            assert result.output == "finished where it started\n"
            await backend.release(other)
        # leaving the trajectory did not raise (not void), and the drained sandbox was terminated
        assert backend.drained == 1 and backend.replaced == 0
        assert old not in double_names(double, running=True) and new in double_names(double, running=True)
    finally:
        await backend.stop()
        await double.close()


def double_names(double: ModalTestDouble, *, running: bool) -> set[str]:
    return {s.spec.name for s in double.sandboxes.values() if not (running and s.terminated)}


async def test_health_loop_replaces_a_dead_sandbox_on_its_own(tmp_path):
    h = make_harness("local", tmp_path, "", health_interval_s=0.3)
    await h.pool.start()
    try:
        doomed = h.pool.sandboxes[0].name
        os.kill(h.pid_of(doomed), signal.SIGKILL)
        for _ in range(100):
            if h.pool.replaced:
                break
            await asyncio.sleep(0.1)
        assert h.pool.replaced == 1
        slot = await h.pool.acquire(timeout=10)
        assert slot.sandbox.name != doomed
        assert (await h.pool.executor(slot).exec("echo up", timeout=30, max_output_bytes=100_000)).output == "up\n"
    finally:
        await h.pool.stop()
    assert processes_left(h.marker) == 0


async def test_local_extra_ro_paths_are_readable_and_never_writable(tmp_path):
    """A prepared environment (here a directory under /tmp, like the default SWE-smith cache) is shown to
    slots at the same path, read-only, and stays there after a command renews the slot's private /tmp."""
    shared = tmp_path / "envs" / "repo-env"
    shared.mkdir(parents=True)
    (shared / "lib.py").write_text("VALUE = 42\n")
    config = LocalBackendConfig(
        pool=_pool(), data_root=str(tmp_path / "local"), extra_ro_paths=[str(tmp_path / "envs")]
    )
    backend = local_backend(config)
    try:
        await backend.start()
        slot = await backend.acquire()
        run = backend.executor(slot).exec
        read = await run(f"cat {shared}/lib.py", timeout=30, max_output_bytes=10_000)
        assert (read.exit_code, read.output) == (0, "VALUE = 42\n")
        for attempt in (f"echo x > {shared}/lib.py", f"touch {shared}/new.py", f"rm -f {shared}/lib.py"):
            assert (await run(attempt, timeout=30, max_output_bytes=10_000)).exit_code != 0, attempt
        await run("echo scratch > /tmp/scratch", timeout=30, max_output_bytes=10_000)  # /tmp gets a fresh tmpfs
        again = await run(f"cat {shared}/lib.py; ls /tmp", timeout=30, max_output_bytes=10_000)
        assert again.output.startswith("VALUE = 42\n")
        assert (shared / "lib.py").read_text() == "VALUE = 42\n" and sorted(os.listdir(shared)) == ["lib.py"]
    finally:
        await backend.stop()
