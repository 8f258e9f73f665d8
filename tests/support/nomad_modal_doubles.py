"""Test doubles of the Nomad and Modal APIs that run sandbox_server as local processes.

They implement `backends.nomad.NomadAPI` and `backends.modal.ModalAPI` following the
services' documented behaviour closely enough that the whole path job/sandbox -> slot
-> command runs for real: Nomad's job JSON is validated and its task's command line is
started (with the interpreter of this machine in place of the image's), allocations go
pending -> running -> failed/complete and are placed, stopped and replaced the way Nomad's
reconciler does it (also over Nomad's HTTP routes); Modal sandboxes get names unique within
their app, tags, a lifetime after which they are stopped, a tunnel URL per port, and on
request gVisor's bubblewrap failure. What they cannot show: scheduling on real nodes,
docker, TLS tunnels, Modal's image builds.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.modal import ModalSandboxSpec

__all__ = ["NomadTestDouble", "ModalTestDouble", "check_job_spec", "MODAL_SANDBOX_CREATE_PARAMS"]

# Keyword parameters of `modal.Sandbox.create` as documented in the Modal SDK reference.
MODAL_SANDBOX_CREATE_PARAMS = frozenset(
    "app name tags image env secrets network_file_systems timeout idle_timeout workdir gpu cloud region cpu "
    "memory runtime block_network outbound_cidr_allowlist outbound_domain_allowlist inbound_cidr_allowlist "
    "volumes pty encrypted_ports h2_ports unencrypted_ports custom_domain proxy readiness_probe verbose "
    "experimental_options client environment_name cidr_allowlist".split()
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class _Proc:
    proc: asyncio.subprocess.Process | None = None
    port: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    failed: str | None = None
    workdir: Path | None = None


async def _spawn(argv: list[str], env: dict[str, str], workdir: Path, state: _Proc) -> None:
    """Start a sandbox_server command line and wait for its 'listening' line."""
    workdir.mkdir(parents=True, exist_ok=True)
    state.workdir = workdir
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1", **env}
    with open(workdir / "task.log", "ab") as log:
        state.proc = await asyncio.create_subprocess_exec(
            *argv,
            env=full_env,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        assert state.proc.stdout is not None  # opened with PIPE just above
        line = await asyncio.wait_for(state.proc.stdout.readline(), 30)
        json.loads(line)
    except (asyncio.TimeoutError, ValueError):
        state.failed = (workdir / "task.log").read_text(errors="replace")[-1000:]
        if state.proc.returncode is None:
            state.proc.kill()
        await state.proc.wait()
    state.ready.set()


async def _kill(state: _Proc) -> None:
    if state.proc is not None and state.proc.returncode is None:
        try:
            state.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(state.proc.wait(), 5)
        except ProcessLookupError:
            pass
        except asyncio.TimeoutError:
            state.proc.kill()
            await state.proc.wait()


def _local_argv(args: list[str], port: int, data_dir: Path) -> list[str]:
    """The task's `-m sandbox_server ...` arguments, run by this interpreter on 127.0.0.1."""
    out = list(args)
    for i in range(len(out)):
        if i and out[i - 1] == "--host":
            out[i] = "127.0.0.1"  # a double listens on loopback only
        elif i and out[i - 1] == "--port":
            out[i] = str(port)
        elif i and out[i - 1] == "--data-dir":
            out[i] = str(data_dir)
    return [sys.executable, *out]


# -- Nomad -------------------------------------------------------------------------------------


def check_job_spec(job: dict[str, Any]) -> None:
    """Refuse a job the way Nomad's job validation would (the fields we rely on)."""
    problems = []
    for key, typ in (("ID", str), ("Name", str), ("Type", str), ("Datacenters", list), ("TaskGroups", list)):
        if not isinstance(job.get(key), typ):
            problems.append(f"Job.{key} must be a {typ.__name__}")
    if job.get("Type") not in ("service", "batch", "system", "sysbatch"):
        problems.append("Job.Type must be service, batch, system or sysbatch")
    for group in job.get("TaskGroups") or []:
        if not isinstance(group.get("Name"), str) or not isinstance(group.get("Count"), int) or group["Count"] < 0:
            problems.append("TaskGroup needs a Name and a Count >= 0")
        labels = {p.get("Label") for n in group.get("Networks") or [] for p in n.get("DynamicPorts") or []}
        for task in group.get("Tasks") or []:
            if task.get("Driver") not in ("docker", "raw_exec", "exec", "singularity"):
                problems.append(f"Task {task.get('Name')!r}: unknown driver {task.get('Driver')!r}")
            config = task.get("Config") or {}
            if task.get("Driver") in ("docker", "singularity") and not config.get("image"):
                problems.append(f"Task {task.get('Name')!r}: the {task['Driver']} driver needs Config.image")
            if not config.get("command") and task.get("Driver") != "docker":
                problems.append(f"Task {task.get('Name')!r}: Config.command is required")
            for port in config.get("ports") or []:
                if port not in labels:
                    problems.append(f"Task {task.get('Name')!r}: port {port!r} is not declared in the group network")
            res = task.get("Resources") or {}
            if not isinstance(res.get("CPU"), int) or not isinstance(res.get("MemoryMB"), int):
                problems.append(f"Task {task.get('Name')!r}: Resources.CPU and Resources.MemoryMB must be integers")
        if not group.get("Tasks"):
            problems.append(f"TaskGroup {group.get('Name')!r} has no tasks")
    if problems:
        raise ValueError("invalid Nomad job: " + "; ".join(problems))


@dataclass
class _Alloc:
    id: str
    job_id: str
    group: str
    index: int  # the name index: "<job>.<group>[<index>]"
    state: _Proc
    desired: str = "run"
    create_index: int = 0
    reschedules: int = 0  # how many replacements led to this one
    next_allocation: str = ""  # set when Nomad placed a replacement for it

    @property
    def name(self) -> str:
        return f"{self.job_id}.{self.group}[{self.index}]"

    def client_status(self) -> str:
        if self.desired != "run":
            return "complete"
        if self.state.failed or (self.state.proc is not None and self.state.proc.returncode is not None):
            return "failed"
        return "running" if self.state.ready.is_set() else "pending"


def _may_reschedule(group: dict[str, Any], alloc: _Alloc) -> bool:
    """A service group's `reschedule` block; Nomad's default for services is unlimited."""
    policy = group.get("ReschedulePolicy")
    if policy is None:
        return True
    return bool(policy.get("Unlimited")) or alloc.reschedules < int(policy.get("Attempts") or 0)


class NomadTestDouble:
    """`NomadAPI` whose scheduler places each task group's allocations as local processes.

    It makes the choices Nomad's reconciler makes, which the provider must live with:
    allocations are named `<job>.<group>[i]` for i < Count; lowering Count stops the
    allocations with the highest name indexes (not the ones a caller would like);
    `stop_allocation` stops an allocation and places a replacement with its name
    (Nomad documents alloc stop as "stop and reschedule"); a failed allocation is replaced
    unless the group's ReschedulePolicy forbids it. `serve()` puts the same double behind
    Nomad's HTTP routes for the HTTP adapter.
    """

    def __init__(self, root: Path, acl_token: str | None = None) -> None:
        self.root = Path(root)
        self.acl_token = acl_token
        self.jobs: dict[str, dict[str, Any]] = {}
        self.allocs: dict[str, _Alloc] = {}
        self.calls: list[tuple[str, Any]] = []
        self.http_requests: list[tuple[str, str, dict[str, str]]] = []
        self._index = 0
        self._tasks: set[asyncio.Task] = set()
        self._runner: Any = None

    # -- the scheduler --------------------------------------------------------------------------

    async def _reconcile(self, job_id: str) -> None:
        job = self.jobs[job_id]
        for group in job["TaskGroups"]:
            mine = [a for a in self.allocs.values() if a.job_id == job_id and a.group == group["Name"]]
            for failed in [
                a for a in mine if a.desired == "run" and not a.next_allocation and a.client_status() == "failed"
            ]:
                if _may_reschedule(group, failed):
                    failed.next_allocation = self._start(job, group, failed.index, failed.reschedules + 1).id
            live = [
                a
                for a in self.allocs.values()
                if a.job_id == job_id
                and a.group == group["Name"]
                and a.desired == "run"
                and not a.next_allocation
                and a.client_status() != "failed"
            ]
            for extra in sorted((a for a in live if a.index >= group["Count"]), key=lambda a: -a.index):
                await self._stop(extra)  # scale-down: the highest name indexes go, whoever uses them
            taken = {a.index for a in live}
            taken |= {
                a.index for a in mine if a.desired == "run" and a.client_status() == "failed" and not a.next_allocation
            }
            for index in range(group["Count"]):
                if index not in taken:
                    self._start(job, group, index)

    def _start(self, job: dict, group: dict, index: int, reschedules: int = 0) -> _Alloc:
        task = group["Tasks"][0]
        self._index += 1
        alloc = _Alloc(
            uuid.uuid4().hex,
            job["ID"],
            group["Name"],
            index,
            _Proc(port=_free_port()),
            create_index=self._index,
            reschedules=reschedules,
        )
        task_dir = self.root / alloc.id
        config = task["Config"]
        args = [
            a.replace("${NOMAD_PORT_http}", str(alloc.state.port)).replace("${NOMAD_TASK_DIR}", str(task_dir))
            for a in config["args"]
        ]
        argv = _local_argv(args, alloc.state.port, task_dir / "sandbox")
        self.allocs[alloc.id] = alloc
        t = asyncio.create_task(_spawn(argv, dict(task.get("Env") or {}), task_dir, alloc.state))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return alloc

    async def _stop(self, alloc: _Alloc) -> None:
        alloc.desired = "stop"
        await alloc.state.ready.wait()
        await _kill(alloc.state)

    async def _tick(self) -> None:
        """What the scheduler would have done by now (it reacts to failures on its own)."""
        for job_id in list(self.jobs):
            await self._reconcile(job_id)

    # -- the API ------------------------------------------------------------------------------

    async def register_job(self, job):
        self.calls.append(("register_job", job))
        check_job_spec(job)
        self.jobs[job["ID"]] = job
        await self._reconcile(job["ID"])
        self._index += 1
        return {"EvalID": uuid.uuid4().hex, "JobModifyIndex": self._index}

    async def list_jobs(self, prefix):
        self.calls.append(("list_jobs", prefix))
        return [
            {"ID": j["ID"], "Name": j["Name"], "Type": j["Type"], "Status": "running"}
            for j in self.jobs.values()
            if j["ID"].startswith(prefix)
        ]

    def _stub(self, a: _Alloc) -> dict[str, Any]:
        return {
            "ID": a.id,
            "Name": a.name,
            "JobID": a.job_id,
            "TaskGroup": a.group,
            "ClientStatus": a.client_status(),
            "DesiredStatus": a.desired,
            "CreateIndex": a.create_index,
            "NextAllocation": a.next_allocation,
        }

    async def job_allocations(self, job_id):
        self.calls.append(("job_allocations", job_id))
        await self._tick()
        return [self._stub(a) for a in self.allocs.values() if a.job_id == job_id]

    async def allocation(self, alloc_id):
        await self._tick()
        a = self.allocs[alloc_id]
        port = {"Label": "http", "Value": a.state.port, "To": 0, "HostIP": "127.0.0.1"}
        return {
            **self._stub(a),
            "AllocatedResources": {
                "Shared": {
                    "Ports": [port],
                    "Networks": [{"IP": "127.0.0.1", "DynamicPorts": [{"Label": "http", "Value": a.state.port}]}],
                }
            },
        }

    async def stop_allocation(self, alloc_id):
        self.calls.append(("stop_allocation", alloc_id))
        alloc = self.allocs[alloc_id]
        await self._stop(alloc)
        if alloc.job_id in self.jobs:
            await self._reconcile(alloc.job_id)  # "stop and reschedule": its name index is placed again
        return {"EvalID": uuid.uuid4().hex, "Index": self._index}

    async def deregister_job(self, job_id, *, purge):
        self.calls.append(("deregister_job", {"job_id": job_id, "purge": purge}))
        if job_id not in self.jobs:
            return
        for a in [a for a in self.allocs.values() if a.job_id == job_id]:
            await self._stop(a)
            if purge:
                del self.allocs[a.id]
        if purge:
            self.jobs.pop(job_id, None)

    async def aclose(self) -> None:
        pass  # nothing held per client; close() ends the processes

    # -- Nomad's HTTP routes, for the HTTP adapter ------------------------------------------------

    async def serve(self) -> str:
        """Serve the double at Nomad's HTTP API on 127.0.0.1; returns the address (http://127.0.0.1:PORT)."""
        from aiohttp import web  # noqa: PLC0415 - aiohttp is a dev dependency; only the Nomad double needs it

        def answer(data: Any, status: int = 200) -> web.Response:
            if isinstance(data, str):
                return web.Response(text=data, status=status)
            return web.json_response(data, status=status)

        @web.middleware
        async def acl(request: web.Request, handler):
            self.http_requests.append((request.method, request.path, dict(request.query)))
            if self.acl_token and request.headers.get("X-Nomad-Token") != self.acl_token:
                return answer("Permission denied", 403)
            return await handler(request)

        async def jobs_post(request: web.Request) -> web.Response:
            try:
                return answer(await self.register_job((await request.json())["Job"]))
            except ValueError as exc:
                return answer(str(exc), 400)

        async def jobs_get(request: web.Request) -> web.Response:
            return answer(await self.list_jobs(request.query.get("prefix", "")))

        async def job_allocs(request: web.Request) -> web.Response:
            return answer(await self.job_allocations(request.match_info["job"]))

        async def alloc_get(request: web.Request) -> web.Response:
            if request.match_info["alloc"] not in self.allocs:
                return answer("alloc not found", 404)
            return answer(await self.allocation(request.match_info["alloc"]))

        async def alloc_stop(request: web.Request) -> web.Response:
            if request.match_info["alloc"] not in self.allocs:
                return answer("alloc not found", 404)
            return answer(await self.stop_allocation(request.match_info["alloc"]))

        async def job_delete(request: web.Request) -> web.Response:
            if request.match_info["job"] not in self.jobs:
                return answer("job not found", 404)
            await self.deregister_job(request.match_info["job"], purge=request.query.get("purge") == "true")
            return answer({"EvalID": uuid.uuid4().hex, "JobModifyIndex": self._index})

        app = web.Application(middlewares=[acl])
        app.router.add_post("/v1/jobs", jobs_post)
        app.router.add_put("/v1/jobs", jobs_post)
        app.router.add_get("/v1/jobs", jobs_get)
        app.router.add_get("/v1/job/{job}/allocations", job_allocs)
        app.router.add_delete("/v1/job/{job}", job_delete)
        app.router.add_get("/v1/allocation/{alloc}", alloc_get)
        app.router.add_post("/v1/allocation/{alloc}/stop", alloc_stop)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]  # started just above, so it has a server

    # -- test helpers -------------------------------------------------------------------------

    def pid(self, job_id: str) -> int:
        """pid of the running allocation of job `job_id` (a sandbox's name is its job id)."""
        for a in self.allocs.values():
            if a.job_id == job_id and a.desired == "run" and a.state.proc is not None:
                return a.state.proc.pid
        raise KeyError(job_id)

    def running(self) -> int:
        return sum(a.state.proc is not None and a.state.proc.returncode is None for a in self.allocs.values())

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        for a in list(self.allocs.values()):
            await _kill(a.state)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        shutil.rmtree(self.root, ignore_errors=True)


# -- Modal ---------------------------------------------------------------------------------------


@dataclass
class _ModalSandbox:
    id: str
    app_id: str
    spec: ModalSandboxSpec
    state: _Proc
    created_at: float
    terminated: bool = False
    lifetime: asyncio.TimerHandle | None = None


# What bubblewrap says under gVisor when it sets up the loopback of a new network namespace
# (google/gvisor#13438, containers/bubblewrap#745).
_GVISOR_BWRAP = """#!/bin/sh
for arg in "$@"; do
  case "$arg" in --unshare-net|--unshare-all) echo "bwrap: loopback: Failed RTM_NEWADDR: File exists" >&2; exit 1;; esac
done
exec bwrap "$@"
"""


class ModalTestDouble:
    """`ModalAPI` whose sandboxes are local sandbox_server processes.

    With `gvisor_netns_broken`, sandboxes on the default (gVisor) runtime get a bubblewrap that
    fails to unshare the network the way it does under gVisor; `runtime="vm"` ones get the real one.
    """

    def __init__(self, root: Path, *, gvisor_netns_broken: bool = False) -> None:
        self.root = Path(root)
        self.gvisor_netns_broken = gvisor_netns_broken
        self.apps: dict[str, str] = {}  # name -> app id
        self.sandboxes: dict[str, _ModalSandbox] = {}
        self.calls: list[tuple[str, Any]] = []
        self.starting = 0
        self.max_starting_seen = 0
        self._tasks: set[asyncio.Task] = set()

    async def lookup_app(self, name):
        self.calls.append(("lookup_app", name))
        return self.apps.setdefault(name, f"ap-{uuid.uuid4().hex[:12]}")

    async def create_sandbox(self, app_id, spec):
        from backends.modal import ModalSDKAdapter  # noqa: PLC0415 - the kwargs the real adapter would send

        kwargs = ModalSDKAdapter.create_kwargs(spec)
        unknown = set(kwargs) - MODAL_SANDBOX_CREATE_PARAMS
        if unknown:
            raise TypeError(f"Sandbox.create() got unexpected keyword arguments {sorted(unknown)}")
        if any(s.spec.name == spec.name and s.app_id == app_id and not s.terminated for s in self.sandboxes.values()):
            raise ValueError(
                f"a running sandbox named {spec.name!r} already exists in this app"
            )  # Modal: names are unique
        image = f"registry:{spec.image}" if spec.image else f"dockerfile:{spec.dockerfile}"
        if not spec.image and not Path(spec.dockerfile).is_file():
            raise FileNotFoundError(f"Image.from_dockerfile: {spec.dockerfile} does not exist")
        self.calls.append(("create_sandbox", {"app_id": app_id, **kwargs, "args": spec.args, "image": image}))
        sb = _ModalSandbox(f"sb-{uuid.uuid4().hex[:12]}", app_id, spec, _Proc(port=_free_port()), time.monotonic())
        self.sandboxes[sb.id] = sb
        workdir = self.root / sb.id
        argv = _local_argv(list(spec.args[1:]), sb.state.port, workdir / "data")
        if self.gvisor_netns_broken and spec.runtime != "vm":
            wrapper = self.root / "gvisor-bwrap"
            wrapper.parent.mkdir(parents=True, exist_ok=True)
            wrapper.write_text(_GVISOR_BWRAP)
            wrapper.chmod(0o755)
            argv += ["--bwrap", str(wrapper)]
        self.starting += 1
        self.max_starting_seen = max(self.max_starting_seen, self.starting)

        async def boot() -> None:
            try:
                await asyncio.sleep(0.05)  # containers take a moment to be scheduled
                await _spawn(argv, dict(spec.secrets), workdir, sb.state)
            finally:
                self.starting -= 1

        t = asyncio.create_task(boot())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        # `timeout` is the sandbox's maximum lifetime.
        sb.lifetime = asyncio.get_running_loop().call_later(
            spec.timeout, lambda: self._spawn_task(self.terminate(sb.id))
        )
        return sb.id

    def _spawn_task(self, coro) -> None:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def tunnel_url(self, sandbox_id, port, timeout):
        sb = self.sandboxes[sandbox_id]
        if port not in sb.spec.encrypted_ports:
            raise KeyError(f"port {port} was not given in encrypted_ports")
        await asyncio.wait_for(sb.state.ready.wait(), timeout)
        if sb.state.failed:
            raise RuntimeError(f"sandbox {sandbox_id} exited while starting: {sb.state.failed}")
        return f"http://127.0.0.1:{sb.state.port}"

    async def poll(self, sandbox_id):
        sb = self.sandboxes[sandbox_id]
        if sb.terminated:
            return -1
        proc = sb.state.proc
        return None if proc is None or proc.returncode is None else proc.returncode

    async def terminate(self, sandbox_id):
        self.calls.append(("terminate", sandbox_id))
        sb = self.sandboxes[sandbox_id]
        sb.terminated = True
        if sb.lifetime is not None:
            sb.lifetime.cancel()
        await sb.state.ready.wait()
        await _kill(sb.state)

    async def list_sandboxes(self, app_id, tags):
        self.calls.append(("list_sandboxes", {"app_id": app_id, "tags": tags}))
        return [
            s.id
            for s in self.sandboxes.values()
            if s.app_id == app_id and not s.terminated and all(s.spec.tags.get(k) == v for k, v in tags.items())
        ]

    async def from_name(self, app_name, name):
        self.calls.append(("from_name", {"app_name": app_name, "name": name}))
        app_id = self.apps.get(app_name)
        for s in self.sandboxes.values():
            if s.app_id == app_id and s.spec.name == name and not s.terminated:
                return s.id
        return None  # the SDK raises NotFoundError; the adapter turns it into None

    def pid(self, name: str) -> int:
        for s in self.sandboxes.values():
            if s.spec.name == name and not s.terminated and s.state.proc is not None:
                return s.state.proc.pid
        raise KeyError(name)

    def running(self) -> int:
        return sum(s.state.proc is not None and s.state.proc.returncode is None for s in self.sandboxes.values())

    async def close(self) -> None:
        for s in list(self.sandboxes.values()):
            if s.lifetime is not None:
                s.lifetime.cancel()
            await _kill(s.state)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        shutil.rmtree(self.root, ignore_errors=True)
