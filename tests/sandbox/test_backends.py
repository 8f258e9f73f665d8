"""One suite, three backends: local processes, Nomad (test double) and Modal (test double).

Each double runs the job's/sandbox's sandbox_server command line as a local process, so
the path platform -> sandbox -> slot -> bubblewrapped command is real in all three.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from backends import make_backend
from backends.local import LocalBackendConfig, local_backend
from backends.modal import ModalBackendConfig, ModalIsolationError, ModalSDKAdapter, modal_backend
from backends.nomad import NomadBackendConfig, NomadError, NomadHTTP, build_job_spec, nomad_backend
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


def make_harness(kind: str, tmp_path, **pool) -> Harness:
    if kind == "local":
        backend = local_backend(LocalBackendConfig(pool=_pool(**pool), data_root=str(tmp_path / "local")))
        return Harness(
            backend,
            lambda name: backend.provider.pid(next(a for a in backend.sandboxes if a.name == name)),
            str(tmp_path),
        )
    if kind == "nomad":
        double = NomadTestDouble(tmp_path / "nomad")
        config = NomadBackendConfig(pool=_pool(**pool), driver="raw_exec", poll_interval_s=0.05, startup_timeout_s=30)
        return Harness(nomad_backend(config, double), double.pid, str(tmp_path), double)
    double = ModalTestDouble(tmp_path / "modal")
    config = ModalBackendConfig(pool=_pool(**pool), create_rate_per_s=50, startup_timeout_s=30)
    return Harness(modal_backend(config, double), double.pid, str(tmp_path), double)


def count_processes(marker: str) -> int:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return len([p for p in out if int(p) != os.getpid()])


@pytest.fixture(params=["local", "nomad", "modal"])
async def harness(request, tmp_path):
    h = make_harness(request.param, tmp_path)
    await h.pool.start()
    try:
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
async def test_stop_leaves_no_sandbox_server_or_bwrap_process(tmp_path):
    for kind in ("local", "nomad", "modal"):
        h = make_harness(kind, tmp_path / kind)
        await h.pool.start()
        slots = [await h.pool.acquire() for _ in range(3)]
        # a long command is running in a slot while we shut down
        running = asyncio.create_task(
            h.pool.executor(slots[0]).exec("sleep 336.5", timeout=60, max_output_bytes=100_000)
        )
        await asyncio.sleep(0.5)
        assert count_processes(h.marker) >= 2  # 2 servers (+ bwrap of the running command)
        assert count_processes("bwrap.*sleep 336.5") + count_processes("sleep 336.5") >= 1
        await h.pool.stop()
        with pytest.raises((SandboxUnavailable, asyncio.CancelledError)):
            await running
        if h.double is not None:
            await h.double.close()
        await asyncio.sleep(0.2)
        assert count_processes(h.marker) == 0, kind
        assert count_processes("sleep 336.5") == 0, kind


# -- platform specifics -------------------------------------------------------------------------


def test_nomad_job_spec_follows_the_documented_shape():
    for driver in ("docker", "raw_exec", "singularity"):
        job = build_job_spec(NomadBackendConfig(driver=driver, image="reg/img:1"), job_id="p-3", token="t")
        check_job_spec(job)
        group = job["TaskGroups"][0]
        task = group["Tasks"][0]
        assert job["ID"] == "p-3" and job["Type"] == "service" and group["Count"] == 1 and task["Driver"] == driver
        assert group["ReschedulePolicy"] == {"Attempts": 0, "Unlimited": False}  # the pool replaces, not Nomad
        assert "${NOMAD_PORT_http}" in task["Config"]["args"]
        assert task["Env"]["SANDBOX_SERVER_TOKEN"] == "t"
        assert "t" not in task["Config"]["args"]  # the token is not on the command line
    docker = build_job_spec(NomadBackendConfig(driver="docker", image="reg/img:1"), job_id="p-0", token="t")
    assert docker["TaskGroups"][0]["Tasks"][0]["Config"]["ports"] == ["http"]
    broken = build_job_spec(NomadBackendConfig(), job_id="p-0", token="t")
    broken["TaskGroups"][0]["Tasks"][0]["Config"].pop("image")
    with pytest.raises(ValueError, match="needs Config.image"):
        check_job_spec(broken)


async def _wait_running(double: NomadTestDouble, job_id: str, n: int) -> list[dict]:
    for _ in range(300):
        stubs = [a for a in await double.job_allocations(job_id) if a["DesiredStatus"] == "run"]
        if sum(a["ClientStatus"] == "running" for a in stubs) == n:
            return stubs
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job_id}: {stubs}")


async def test_the_nomad_double_makes_the_reconcilers_choices(tmp_path):
    """Why one job per sandbox: on one scaled job, retiring a chosen allocation kills another."""
    double = NomadTestDouble(tmp_path / "nomad")
    job = build_job_spec(NomadBackendConfig(driver="raw_exec"), job_id="shared", token="t")
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
        # A failed allocation is rescheduled under the default policy.
        os.kill(double.allocs[first["shared.sandbox[1]"]].state.proc.pid, signal.SIGKILL)
        await double.allocs[first["shared.sandbox[1]"]].state.proc.wait()
        again = {a["Name"]: a["ID"] for a in await _wait_running(double, "shared", 2)}
        assert again["shared.sandbox[1]"] != first["shared.sandbox[1]"]
    finally:
        await double.close()


@pytest.mark.slow
async def test_nomad_retiring_sandbox_k_leaves_every_other_in_use_sandbox_running(tmp_path):
    n = 3
    for k in range(n):
        h = make_harness("nomad", tmp_path / f"k{k}", min_sandboxes=n, max_sandboxes=n, slots_per_sandbox=1)
        double: NomadTestDouble = h.double
        await h.pool.start()
        try:
            slots = [await h.pool.acquire() for _ in range(n)]  # every sandbox in use
            names = [s.sandbox.name for s in slots]
            assert sorted(names) == [f"hermes-rl-sandboxes-{i}" for i in range(n)]
            pids = {name: h.pid_of(name) for name in names}
            await h.pool.provider.terminate(slots[k].sandbox)
            assert double.jobs.keys() == set(names) - {names[k]}
            others = [s for i, s in enumerate(slots) if i != k]
            for s in others:
                assert h.pid_of(s.sandbox.name) == pids[s.sandbox.name]  # the same process, untouched
                assert (
                    await h.pool.executor(s).exec("echo still here", timeout=30, max_output_bytes=100_000)
                ).output == "still here\n"
            assert double.running() == n - 1  # and nothing untracked was started in its place
            with pytest.raises(KeyError):
                h.pid_of(names[k])
        finally:
            await h.pool.stop()
            await double.close()


async def test_nomad_job_per_sandbox_and_orphans_purged(tmp_path):
    h = make_harness("nomad", tmp_path)
    double: NomadTestDouble = h.double
    crashed = nomad_backend(h.pool.provider.config, double)  # an earlier run that never stopped
    await crashed.provider.launch(1)
    assert list(double.jobs) == ["hermes-rl-sandboxes-0"]
    await h.pool.start()
    try:
        assert h.pool.provider.orphans_removed == 1
        [await h.pool.acquire() for _ in range(3)]
        registered = [c[1]["ID"] for c in double.calls if c[0] == "register_job"]
        assert registered == ["hermes-rl-sandboxes-0", "hermes-rl-sandboxes-0", "hermes-rl-sandboxes-1"]
        assert all(c[1]["TaskGroups"][0]["Count"] == 1 for c in double.calls if c[0] == "register_job")
        assert not [c for c in double.calls if c[0] == "stop_allocation"]
        await h.pool.stop()
        purged = [c[1]["job_id"] for c in double.calls if c[0] == "deregister_job" and c[1]["purge"]]
        assert purged[-2:] == ["hermes-rl-sandboxes-0", "hermes-rl-sandboxes-1"]
        assert double.jobs == {} and double.running() == 0
    finally:
        await double.close()


async def test_nomad_http_uses_the_configured_address_and_token_not_the_environment(tmp_path, monkeypatch):
    double = NomadTestDouble(tmp_path / "nomad", acl_token="acl-secret")
    address = await double.serve()
    # Everything python-nomad or httpx would read from the environment points somewhere wrong.
    monkeypatch.setenv("NOMAD_ADDR", "http://127.0.0.1:9")
    monkeypatch.setenv("NOMAD_NAMESPACE", "elsewhere")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NOMAD_TOKEN", "acl-secret")  # the secret's one place: make_backend reads it
    config = NomadBackendConfig(
        address=address, pool=_pool(), driver="raw_exec", poll_interval_s=0.05, startup_timeout_s=30
    )
    backend = make_backend(config)
    await backend.start()
    try:
        slot = await backend.acquire()
        assert (
            await backend.executor(slot).exec("echo via http", timeout=30, max_output_bytes=100_000)
        ).output == "via http\n"
        name = slot.sandbox.name
        await backend.provider.terminate(slot.sandbox)
        assert name not in double.jobs and ("DELETE", f"/v1/job/{name}", {"purge": "true"}) in double.http_requests
    finally:
        await backend.stop()
        await double.close()
    assert double.running() == 0
    assert all("namespace" not in query for _, _, query in double.http_requests)
    assert {m for m, _, _ in double.http_requests} == {"GET", "POST", "DELETE"}
    # A wrong token is refused in one line that names the status.
    monkeypatch.setenv("NOMAD_TOKEN", "wrong")
    double2 = NomadTestDouble(tmp_path / "n2", acl_token="acl-secret")
    bad = make_backend(NomadBackendConfig(address=await double2.serve(), pool=_pool(), driver="raw_exec"))
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
async def test_modal_removes_orphans_caps_starts_and_uses_documented_arguments(tmp_path):
    double = ModalTestDouble(tmp_path / "modal")
    config = ModalBackendConfig(pool=_pool(min_sandboxes=3, max_sandboxes=3), max_starting=1, create_rate_per_s=50)
    # An earlier run of the same pool crashed and left a sandbox behind.
    crashed = modal_backend(config, double)
    await crashed.provider.start()
    await crashed.provider.launch(1)
    assert double.running() == 1
    backend = modal_backend(config, double)
    await backend.start()
    try:
        assert backend.provider.orphans_removed == 1
        assert double.running() == 3
        assert double.max_starting_seen == 1
        creates = [c[1] for c in double.calls if c[0] == "create_sandbox"]
        for kw in creates:
            assert set(kw) - {"app_id", "args", "image"} <= MODAL_SANDBOX_CREATE_PARAMS
            assert kw["timeout"] == config.lifetime_s and kw["encrypted_ports"] == [8080]
            assert kw["tags"] == {"hermes_rl_pool": "default"}  # tagged in the create call itself
            assert kw["image"] == f"dockerfile:{ROOT / 'Dockerfile'}"  # built from our Dockerfile by default
        assert [kw["name"] for kw in creates] == ["default-0", "default-0", "default-1", "default-2"]
        lookups = [c[1]["name"] for c in double.calls if c[0] == "from_name"]
        assert lookups[-3:] == ["default-0", "default-1", "default-2"]  # the restart looked each name up
        with pytest.raises(ValueError, match="already exists"):  # why orphans must go first
            await double.create_sandbox(creates[-1]["app_id"], backend.provider.spec("default-1"))
        assert set(ModalSDKAdapter.create_kwargs(backend.provider.spec("x"))) <= MODAL_SANDBOX_CREATE_PARAMS
    finally:
        await backend.stop()
        await double.close()
    assert double.running() == 0


async def test_modal_named_registry_image_is_used_as_is(tmp_path):
    double = ModalTestDouble(tmp_path / "modal")
    backend = modal_backend(
        ModalBackendConfig(pool=_pool(), image="reg.example/hermes:1", create_rate_per_s=50), double
    )
    await backend.start()
    try:
        (create,) = [c[1] for c in double.calls if c[0] == "create_sandbox"]
        assert create["image"] == "registry:reg.example/hermes:1" and "runtime" not in create
    finally:
        await backend.stop()
        await double.close()


async def test_modal_moves_to_the_vm_runtime_when_bwrap_cannot_isolate_under_gvisor(tmp_path, caplog):
    double = ModalTestDouble(tmp_path / "modal", gvisor_netns_broken=True)
    backend = modal_backend(ModalBackendConfig(pool=_pool(min_sandboxes=2), create_rate_per_s=50), double)
    await backend.start()
    try:
        creates = [c[1] for c in double.calls if c[0] == "create_sandbox"]
        assert [c.get("runtime") for c in creates] == [None, "vm", "vm"]  # probe on gVisor, then every one on vm
        assert backend.provider.runtime == "vm" and double.running() == 2
        assert "using the vm runtime" in caplog.text and "RTM_NEWADDR" in caplog.text
        slot = await backend.acquire()
        assert (
            await backend.executor(slot).exec("echo isolated", timeout=30, max_output_bytes=100_000)
        ).output == "isolated\n"
    finally:
        await backend.stop()
        await double.close()


async def test_modal_isolation_failure_without_fallback_is_one_clear_line(tmp_path):
    double = ModalTestDouble(tmp_path / "modal", gvisor_netns_broken=True)
    backend = modal_backend(ModalBackendConfig(pool=_pool(), isolation_fallback="fail", create_rate_per_s=50), double)
    with pytest.raises(ModalIsolationError) as failure:
        await backend.start()
    message = str(failure.value)
    assert "default (gVisor) runtime" in message and "RTM_NEWADDR" in message and "runtime: vm" in message
    assert "\n" not in message
    assert double.running() == 0
    await double.close()


async def test_modal_creation_rate_is_limited(tmp_path):
    double = ModalTestDouble(tmp_path / "modal")
    backend = modal_backend(
        ModalBackendConfig(pool=_pool(min_sandboxes=3, max_sandboxes=3), create_rate_per_s=4), double
    )
    await backend.start()
    try:
        times = sorted(s.created_at for s in double.sandboxes.values())
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(g >= 0.2 for g in gaps), gaps  # 4/s -> at least 0.25 s apart (less a little scheduling slack)
    finally:
        await backend.stop()
        await double.close()


async def test_modal_sandbox_past_its_lifetime_is_replaced(tmp_path):
    double = ModalTestDouble(tmp_path / "modal")
    # Long enough for a start (bubblewrap check + health) on a loaded machine, short enough to wait for.
    backend = modal_backend(ModalBackendConfig(pool=_pool(), lifetime_s=6, create_rate_per_s=50), double)
    await backend.start()
    try:
        first = backend.sandboxes[0].name
        sandbox = next(s for s in double.sandboxes.values() if s.spec.name == first)
        for _ in range(300):  # Modal stops it once `timeout` seconds have passed
            if sandbox.terminated:
                break
            await asyncio.sleep(0.1)
        assert sandbox.terminated
        assert await backend.check_now() == 1
        assert backend.sandboxes[0].name != first
    finally:
        await backend.stop()
        await double.close()


async def test_health_loop_replaces_a_dead_sandbox_on_its_own(tmp_path):
    h = make_harness("local", tmp_path, health_interval_s=0.3)
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
    assert count_processes(h.marker) == 0


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
    await backend.start()
    try:
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
