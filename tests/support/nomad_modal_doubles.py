"""Test doubles of the Nomad and Modal APIs whose allocations and sandboxes are real containers.

They implement `backends.nomad.NomadAPI` and `backends.modal.ModalAPI` following the services'
documented behaviour, timing included, on the Docker engine of this machine (the `docker` SDK):
a Nomad docker-driver task or a Modal sandbox is a container started from its image with its
command line, published on 127.0.0.1. They report what the real service reports when it does:
an allocation is "running" and a Modal tunnel exists as soon as the container runs, before
sandbox_server listens (Nomad's ClientStatus ignores service checks; Modal's `tunnels()` does not
wait for the port); Modal's TCP readiness probe looks inside the container for a listening
socket. Images: what a node has locally is used for a pinned tag; an untagged/`:latest` image or
`force_pull` is always pulled (Nomad's docker driver), and "pulls" and Modal's registry images
and Dockerfile builds resolve through `images` (reference -> local image), a stand-in for a
registry; anything else fails the way a failed pull does. Nomad's reconciler choices (names,
scale-down, "stop and reschedule", rescheduling failed allocations), the ACL token, Modal's
unique names, tags, lifetime and gVisor's bubblewrap failure are reproduced as before. What they
cannot show: scheduling on real nodes, TLS tunnels, real registries, Modal's image builds.
Every container carries the label `hermes-rl.test=<the double's id>`; `close()` removes them.
"""

from __future__ import annotations

import asyncio
import functools
import io
import shutil
import socket
import tarfile
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from backends.modal import ModalSandboxSpec
from backends.container_seccomp import SECURITY_OPT
from backends.nomad import CAP_ADD, unpinned_image
from tests.support.sandbox_image import with_runtime_layer

__all__ = ["NomadTestDouble", "ModalTestDouble", "check_job_spec", "MODAL_SANDBOX_CREATE_PARAMS", "TEST_LABEL"]

TEST_LABEL = "hermes-rl.test"

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


class PullError(RuntimeError):
    """The image is not on the node and the stand-in registry does not have it."""


@dataclass
class _Box:
    """One container: what the platform knows about it."""

    port: int  # published on 127.0.0.1 (host side)
    container_id: str | None = None
    pid: int = 0
    status: str = "pending"  # pending -> running -> exited
    exit_code: int | None = None
    failed: str | None = None  # why it never ran (a failed pull or create)
    booted: asyncio.Event = field(default_factory=asyncio.Event)  # the start attempt is over, either way


class _Engine:
    """The double's containers on the local Docker engine; blocking SDK calls go to a small executor."""

    def __init__(self, images: Mapping[str, str]) -> None:
        self.client = docker.from_env()
        self.images = dict(images)
        self.label = f"cluster-double-{uuid.uuid4().hex[:10]}"
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="docker-double")

    async def call(self, fn, *args, **kw):
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args, **kw))

    def _local(self, ref: str) -> bool:
        try:
            self.client.images.get(ref)
            return True
        except docker.errors.ImageNotFound:
            return False

    async def resolve(self, ref: str, *, pull: bool) -> str:
        """The local image that runs for `ref`; `pull`: the platform fetches it from its registry."""
        if not pull and await self.call(self._local, ref):
            return ref
        if ref in self.images:
            return self.images[ref]
        raise PullError(f"Failed to pull `{ref}`: manifest unknown (not in the registry)")

    async def boot(
        self,
        box: _Box,
        image: str,
        argv: list[str],
        env: dict[str, str],
        container_port: int,
        *,
        files: dict[str, str] | None = None,
        **options: Any,
    ) -> None:
        """Create and start the container; `box` says "running" once the engine started its process."""
        try:
            container = await self.call(
                self.client.containers.create,
                image,
                argv,
                environment=env,
                labels={TEST_LABEL: self.label},
                ports={f"{container_port}/tcp": ("127.0.0.1", box.port)},
                detach=True,
                **options,
            )
            box.container_id = container.id
            if files:
                await self.call(container.put_archive, "/", _tar(files))
            await self.call(container.start)
            await self.call(container.reload)
            box.pid = int(container.attrs["State"]["Pid"])
            box.status = "running" if container.attrs["State"]["Running"] else "exited"
        except docker.errors.APIError as exc:
            box.failed = f"Driver Failure: {exc.explanation or exc}"
        finally:
            box.booted.set()

    async def refresh(self, boxes: list[_Box]) -> None:
        """Read the state of every container of this double at once."""
        known = {b.container_id: b for b in boxes if b.container_id and b.status == "running"}  # boot() set it
        if not known:
            return
        # One listing (GET /containers/json), no per-container inspect that races a concurrent removal.
        found = await self.call(self.client.api.containers, all=True, filters={"label": f"{TEST_LABEL}={self.label}"})
        states = {c["Id"]: c for c in found}
        for cid, box in known.items():
            summary = states.get(cid)
            if summary is None or summary.get("State") != "running":
                box.status = "exited"
                box.exit_code = _exit_code(summary.get("Status", "")) if summary else None

    async def listening(self, box: _Box, port: int) -> bool:
        """Whether a socket inside the container listens on `port` (what a TCP probe run in the sandbox sees)."""
        if box.container_id is None or box.status != "running":
            return False
        container = await self.call(self.client.containers.get, box.container_id)
        code, out = await self.call(container.exec_run, ["cat", "/proc/net/tcp", "/proc/net/tcp6"])
        rows = [line.split() for line in out.decode(errors="replace").splitlines()]
        # /proc/net/tcp: sl, local_address (hex ip:port), rem_address, st (0A = LISTEN), ...
        return any(len(r) > 3 and r[1].endswith(f":{port:04X}") and r[3] == "0A" for r in rows)

    async def stop(self, box: _Box, *, remove: bool) -> None:
        await box.booted.wait()
        if box.container_id is None:
            return
        try:
            container = await self.call(self.client.containers.get, box.container_id)
            await self.call(container.stop, timeout=5)  # SIGTERM, then SIGKILL after 5 s
            if remove:
                await self.call(container.remove, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: another stop/remove of it is under way (e.g. Modal's lifetime end)
                raise
        box.status = "exited"

    async def running(self) -> int:
        found = await self.call(
            self.client.api.containers, filters={"label": f"{TEST_LABEL}={self.label}", "status": "running"}
        )
        return len(found)

    async def close(self) -> None:
        def remove_all() -> None:
            for c in self.client.api.containers(all=True, filters={"label": f"{TEST_LABEL}={self.label}"}):
                try:
                    self.client.api.remove_container(c["Id"], force=True)
                except docker.errors.NotFound:
                    pass

        await self.call(remove_all)
        self._executor.shutdown(wait=True)
        self.client.close()


def _exit_code(status: str) -> int | None:
    """The code in a container listing's Status ("Exited (137) 2 seconds ago")."""
    if status.startswith("Exited (") and ")" in status:
        return int(status[len("Exited (") : status.index(")")])
    return None


def _tar(files: dict[str, str]) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode = len(text.encode()), 0o755
            tar.addfile(info, io.BytesIO(text.encode()))
    return data.getvalue()


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
    box: _Box
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
        if self.box.failed or self.box.status == "exited":
            return "failed"  # RestartPolicy mode "fail": a task that ended fails its allocation
        return "running" if self.box.status == "running" else "pending"


def _may_reschedule(group: dict[str, Any], alloc: _Alloc) -> bool:
    """A service group's `reschedule` block; Nomad's default for services is unlimited."""
    policy = group.get("ReschedulePolicy")
    if policy is None:
        return True
    return bool(policy.get("Unlimited")) or alloc.reschedules < int(policy.get("Attempts") or 0)


class NomadTestDouble:
    """`NomadAPI` whose scheduler places each task group's allocations as docker containers.

    It makes the choices Nomad's reconciler makes, which the provider must live with:
    allocations are named `<job>.<group>[i]` for i < Count; lowering Count stops the
    allocations with the highest name indexes (not the ones a caller would like);
    `stop_allocation` stops an allocation and places a replacement with its name
    (Nomad documents alloc stop as "stop and reschedule"); a failed allocation is replaced
    unless the group's ReschedulePolicy forbids it. `serve()` puts the same double behind
    Nomad's HTTP routes for the HTTP adapter.
    """

    def __init__(self, root: Path, acl_token: str | None = None, *, images: Mapping[str, str] | None = None) -> None:
        self.root = Path(root)
        self.acl_token = acl_token
        self.engine = _Engine(images or {})
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
        self._index += 1
        alloc = _Alloc(
            uuid.uuid4().hex,
            job["ID"],
            group["Name"],
            index,
            _Box(port=_free_port()),
            create_index=self._index,
            reschedules=reschedules,
        )
        self.allocs[alloc.id] = alloc
        t = asyncio.create_task(self._run_task(alloc, group["Tasks"][0]))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return alloc

    async def _run_task(self, alloc: _Alloc, task: dict[str, Any]) -> None:
        """The docker driver: pull per its rules, then run the image with the task's command, ports and caps."""
        config = task["Config"]
        port = alloc.box.port  # a dynamic port without `to`: the same number inside the container
        env = {**(task.get("Env") or {}), "NOMAD_PORT_http": str(port), "NOMAD_TASK_DIR": "/local"}
        env["NOMAD_ALLOC_ID"] = alloc.id
        argv = [
            a.replace("${NOMAD_PORT_http}", str(port)).replace("${NOMAD_TASK_DIR}", "/local")
            for a in [config["command"], *(config.get("args") or [])]
        ]
        try:
            # The docker driver pulls untagged/:latest images always, others only if missing or force_pull.
            pull = bool(config.get("force_pull")) or unpinned_image(config["image"])
            image = await self.engine.resolve(config["image"], pull=pull)
        except PullError as exc:
            alloc.box.failed = str(exc)
            alloc.box.booted.set()
            return
        await self.engine.boot(
            alloc.box,
            image,
            argv,
            env,
            port,
            cap_add=config.get("cap_add") or None,
            security_opt=config.get("security_opt") or None,
            privileged=bool(config.get("privileged")),
        )

    async def _stop(self, alloc: _Alloc, *, remove: bool = False) -> None:
        alloc.desired = "stop"
        await self.engine.stop(alloc.box, remove=remove)

    async def _tick(self) -> None:
        """What the scheduler would have done by now (it reacts to failures on its own)."""
        await self.engine.refresh([a.box for a in self.allocs.values()])
        for job_id in list(self.jobs):
            await self._reconcile(job_id)

    # -- the API ------------------------------------------------------------------------------

    async def register_job(self, job):
        self.calls.append(("register_job", job))
        check_job_spec(job)
        drivers = {t["Driver"] for g in job["TaskGroups"] for t in g["Tasks"]}
        if drivers != {"docker"}:
            raise ValueError(f"NomadTestDouble runs docker-driver tasks only, not {sorted(drivers - {'docker'})}")
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

    async def job(self, job_id):
        self.calls.append(("job", job_id))
        return self.jobs.get(job_id)

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
        port = {"Label": "http", "Value": a.box.port, "To": 0, "HostIP": "127.0.0.1"}
        events = [{"Type": "Received", "Time": 1, "DisplayMessage": "Task received by client"}]
        if a.box.failed:
            events.append({"Type": "Driver Failure", "Time": 2, "DisplayMessage": a.box.failed})
        elif a.box.status != "pending":
            events.append({"Type": "Started", "Time": 2, "DisplayMessage": "Task started by client"})
        if a.box.status == "exited":
            events.append({"Type": "Terminated", "Time": 3, "DisplayMessage": f"Exit Code: {a.box.exit_code}"})
        return {
            **self._stub(a),
            "TaskStates": {"sandbox-server": {"State": a.client_status(), "Events": events}},
            "AllocatedResources": {
                "Shared": {
                    "Ports": [port],
                    "Networks": [{"IP": "127.0.0.1", "DynamicPorts": [{"Label": "http", "Value": a.box.port}]}],
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
            await self._stop(a, remove=purge)
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

        async def job_get(request: web.Request) -> web.Response:
            job = await self.job(request.match_info["job"])
            return answer("job not found", 404) if job is None else answer(job)

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
        app.router.add_get("/v1/job/{job}", job_get)
        app.router.add_get("/v1/allocation/{alloc}", alloc_get)
        app.router.add_post("/v1/allocation/{alloc}/stop", alloc_stop)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]  # started just above, so it has a server

    # -- test helpers -------------------------------------------------------------------------

    def pid(self, job_id: str) -> int:
        """Host pid of the container process of job `job_id`'s running allocation (a sandbox's name is its job id)."""
        for a in self.allocs.values():
            if a.job_id == job_id and a.desired == "run" and a.box.pid:
                return a.box.pid
        raise KeyError(job_id)

    async def running(self) -> int:
        """Containers of this double that run."""
        return await self.engine.running()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.engine.close()
        shutil.rmtree(self.root, ignore_errors=True)


# -- Modal ---------------------------------------------------------------------------------------


@dataclass
class _ModalSandbox:
    id: str
    app_id: str
    spec: ModalSandboxSpec
    box: _Box
    created_at: float
    terminated: bool = False
    lifetime: asyncio.TimerHandle | None = None


# What bubblewrap says under gVisor when it sets up the loopback of a new network namespace
# (google/gvisor#13438, containers/bubblewrap#745).
_GVISOR_BWRAP = """#!/bin/sh
for arg in "$@"; do
  case "$arg" in --unshare-net|--unshare-all) echo "bwrap: loopback: Failed RTM_NEWADDR: File exists" >&2; exit 1;; esac
done
exec /opt/hermes/bwrap "$@"
"""


class ModalTestDouble:
    """`ModalAPI` whose sandboxes are docker containers of the sandbox's image.

    `images` maps what Modal would pull (`Image.from_registry(ref)`: the ref) or build
    (`Image.from_dockerfile(path)`: "dockerfile:<path>") to a local image; a spec's `runtime_dir`
    becomes the sandbox layer on top of it (what `add_local_dir(..., copy=True)` builds). With
    `gvisor_netns_broken`, sandboxes on the default (gVisor) runtime get a bubblewrap that fails
    to unshare the network the way it does under gVisor; `runtime="vm"` ones get the real one.
    """

    def __init__(
        self, root: Path, *, images: Mapping[str, str] | None = None, gvisor_netns_broken: bool = False
    ) -> None:
        self.root = Path(root)
        self.engine = _Engine(images or {})
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
        from backends.modal import MAX_LIFETIME_S, ModalSDKAdapter  # noqa: PLC0415 - the kwargs the real adapter would send

        kwargs = ModalSDKAdapter.create_kwargs(spec)
        unknown = set(kwargs) - MODAL_SANDBOX_CREATE_PARAMS
        if unknown:
            raise TypeError(f"Sandbox.create() got unexpected keyword arguments {sorted(unknown)}")
        if not 0 < spec.timeout <= MAX_LIFETIME_S:
            raise ValueError(f"timeout must be between 1 and {MAX_LIFETIME_S} seconds")  # Modal's own limit
        if any(s.spec.name == spec.name and s.app_id == app_id and not s.terminated for s in self.sandboxes.values()):
            raise ValueError(
                f"a running sandbox named {spec.name!r} already exists in this app"
            )  # Modal: names are unique
        if not spec.image and not Path(spec.dockerfile).is_file():
            raise FileNotFoundError(f"Image.from_dockerfile: {spec.dockerfile} does not exist")
        ref = spec.image or f"dockerfile:{spec.dockerfile}"
        image = await self.engine.resolve(ref, pull=True)  # Modal never sees this machine's images
        if spec.runtime_dir is not None:  # Image.add_local_dir(runtime, /opt/hermes, copy=True): a layer on top
            image = await self.engine.call(with_runtime_layer, self.engine.client, image, Path(spec.runtime_dir))
        self.calls.append(("create_sandbox", {"app_id": app_id, **kwargs, "args": spec.args, "image": ref}))
        sb = _ModalSandbox(f"sb-{uuid.uuid4().hex[:12]}", app_id, spec, _Box(port=_free_port()), time.monotonic())
        self.sandboxes[sb.id] = sb
        argv, files = list(spec.args), {}
        if self.gvisor_netns_broken and spec.runtime != "vm":
            files["/gvisor-bwrap"] = _GVISOR_BWRAP
            argv += ["--bwrap", "/gvisor-bwrap"]
        self.starting += 1
        self.max_starting_seen = max(self.max_starting_seen, self.starting)
        (port,) = spec.encrypted_ports

        async def boot() -> None:
            try:
                await self.engine.boot(
                    sb.box,
                    image,
                    argv,
                    dict(spec.secrets),
                    port,
                    files=files,
                    cap_add=CAP_ADD,  # Modal's runtime lets bubblewrap make namespaces (but see gVisor above)
                    security_opt=SECURITY_OPT,
                )
            finally:
                self.starting -= 1

        self._spawn_task(boot())
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
        """Available once the container runs; whether anything listens behind it is not checked (as on Modal)."""
        sb = self.sandboxes[sandbox_id]
        if port not in sb.spec.encrypted_ports:
            raise KeyError(f"port {port} was not given in encrypted_ports")
        await asyncio.wait_for(sb.box.booted.wait(), timeout)
        if sb.box.failed:
            raise RuntimeError(f"sandbox {sandbox_id} could not start: {sb.box.failed}")
        return f"http://127.0.0.1:{sb.box.port}"

    async def wait_until_ready(self, sandbox_id, timeout):
        """The TCP readiness probe, run inside the sandbox every 100 ms (Probe.with_tcp's default interval)."""
        sb = self.sandboxes[sandbox_id]
        if sb.spec.readiness_tcp_port is None:
            raise ValueError("wait_until_ready needs a sandbox created with a readiness_probe")
        async with asyncio.timeout(timeout):
            await sb.box.booted.wait()
            while not await self.engine.listening(sb.box, sb.spec.readiness_tcp_port):
                if await self.poll(sandbox_id) is not None:
                    raise RuntimeError(f"sandbox {sandbox_id} ended before it was ready")
                await asyncio.sleep(0.1)

    async def poll(self, sandbox_id):
        sb = self.sandboxes[sandbox_id]
        if sb.terminated:
            return -1
        if sb.box.failed:
            return 1
        await self.engine.refresh([sb.box])
        return sb.box.exit_code if sb.box.status == "exited" else None

    async def pass_lifetime(self, sandbox_id) -> None:
        """Test clock: the sandbox's `timeout` seconds have passed now, so Modal ends it (what the
        lifetime timer does), without a test racing a wall-clock lifetime against a loaded start."""
        sb = self.sandboxes[sandbox_id]
        if sb.lifetime is not None:
            sb.lifetime.cancel()
        await self.terminate(sandbox_id)

    async def terminate(self, sandbox_id):
        self.calls.append(("terminate", sandbox_id))
        sb = self.sandboxes[sandbox_id]
        sb.terminated = True
        if sb.lifetime is not None:
            sb.lifetime.cancel()
        await self.engine.stop(sb.box, remove=True)

    async def list_sandboxes(self, app_id, tags):
        self.calls.append(("list_sandboxes", {"app_id": app_id, "tags": tags}))
        return [
            s.id
            for s in self.sandboxes.values()
            if s.app_id == app_id and not s.terminated and all(s.spec.tags.get(k) == v for k, v in tags.items())
        ]

    async def sandbox_tags(self, sandbox_id):
        self.calls.append(("sandbox_tags", sandbox_id))
        return dict(self.sandboxes[sandbox_id].spec.tags)

    def pid(self, name: str) -> int:
        """Host pid of the container process of the running sandbox `name`."""
        for s in self.sandboxes.values():
            if s.spec.name == name and not s.terminated and s.box.pid:
                return s.box.pid
        raise KeyError(name)

    async def running(self) -> int:
        """Containers of this double that run."""
        return await self.engine.running()

    async def close(self) -> None:
        for s in list(self.sandboxes.values()):
            if s.lifetime is not None:
                s.lifetime.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.engine.close()
        shutil.rmtree(self.root, ignore_errors=True)
