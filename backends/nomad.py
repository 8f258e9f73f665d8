"""Nomad backend: one service job per sandbox, each job one allocation running sandbox_server.

Why not one job scaled by its group count: Nomad offers no way to pick which allocation a
scale-down stops (its reconciler stops the highest name index), and stopping an allocation
makes it reschedule a replacement. Retiring "sandbox k" that way kills some other, in-use
sandbox and leaves an untracked replacement running. With a job per sandbox, retiring k is
`DELETE /v1/job/<k>?purge=true`, which can only ever stop k.

`NomadHTTP` speaks Nomad's HTTP API (`/v1/jobs`, `/v1/job/:id`, `/v1/job/:id/allocations`,
`/v1/allocation/:id`) with httpx, at the configured address only: no `$NOMAD_ADDR`,
`$NOMAD_NAMESPACE` or proxy variables are read (the ACL token is passed in by `make_backend`).
Nomad's semantics the provider lives with: an allocation is "running" as soon as its task
started, not when sandbox_server listens (service checks do not change ClientStatus), so
`launch` returns on "running" and the pool waits for `/health` (`SlotPoolConfig.ready_timeout_s`).
Job ids are `<job_id>-<run_id>-<n>` and each job's Meta names its pool and owning run
(backends/runs.py): a start sweeps only this run's leftovers and those of runs provably gone,
never a concurrent run's. The docker driver always pulls an untagged or `:latest` image (even
with `force_pull = false`), so such images are refused: pin a tag (a content hash or commit).
`tests/support/nomad_modal_doubles.py` (`NomadTestDouble`) implements the same `NomadAPI` with
containers on a real Docker engine and serves it over HTTP for the adapter's own tests.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
from typing import Any, Literal, Protocol

import httpx
from pydantic import BaseModel, Field, field_validator

from backends.launch import launch_all
from backends.container_seccomp import SECURITY_OPT
from backends.runs import RunOwner
from backends.runtime import RUNTIME_MOUNT, SandboxRuntime
from sandbox_server.isolation import SlotLimits
from slots.client import SandboxAddress
from slots.pool import SlotPool, SlotPoolConfig

__all__ = [
    "NomadBackendConfig",
    "NomadAPI",
    "NomadError",
    "NomadHTTP",
    "NomadSandboxProvider",
    "build_job_spec",
    "allocation_address",
    "nomad_backend",
    "unpinned_image",
]

TOKEN_ENV = "SANDBOX_SERVER_TOKEN"
PORT_LABEL = "http"
POOL_META = "hermes_rl_pool"
# What bubblewrap needs inside a docker container (no --privileged): namespaces (SYS_ADMIN), the
# loopback of its network namespace (NET_ADMIN), a seccomp profile allowing them and pivot_root
# (backends/container_seccomp.py); the slot watchdog reads slot processes' /proc/<pid>/ns (SYS_PTRACE). The Nomad client's docker plugin
# must allow them: `allow_caps` including "sys_admin", "net_admin", "sys_ptrace".
CAP_ADD = ["SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"]


def unpinned_image(image: str) -> bool:
    """An image reference without a tag or with `latest` (and no digest): registries may move it."""
    if "@" in image:
        return False
    last = image.rsplit("/", 1)[-1]
    return ":" not in last or last.rsplit(":", 1)[1] == "latest"


class NomadBackendConfig(BaseModel):
    kind: Literal["nomad"] = "nomad"
    pool: SlotPoolConfig = Field(default_factory=SlotPoolConfig)
    address: str = Field("http://127.0.0.1:4646", description="Nomad HTTP API (used as given; $NOMAD_ADDR is ignored)")
    namespace: str | None = Field(None, description="Nomad namespace (None: the agent's default)")
    region: str | None = Field(None, description="Nomad region (None: the agent's own)")
    datacenters: list[str] = Field(default_factory=lambda: ["dc1"])
    job_id: str = Field(
        "hermes-rl-sandboxes", description="Pool name and job prefix: <job_id>-<run_id>-<n>, one job per sandbox"
    )
    run_id: str | None = Field(
        None, description="Names this run's jobs; None: a fresh id. Set it to restart a crashed run and sweep its jobs"
    )
    driver: Literal["docker", "raw_exec", "singularity"] = "docker"
    image: str | None = Field(
        None,
        description="docker/singularity: an image with the sandbox runtime under /opt/hermes, with a pinned tag "
        "(never untagged or :latest: Nomad's docker driver pulls those on every start)",
    )
    force_pull: bool = Field(
        False, description="docker: pull even when the node has the image (a pinned tag makes False safe)"
    )
    python: str = Field("python3", description="raw_exec: the node's interpreter that runs `-m sandbox_server`")
    privileged: bool = Field(
        False, description="docker: not needed (CAP_ADD and SECURITY_OPT give bwrap its namespaces)"
    )
    cpu_mhz: int = Field(2000, gt=0)
    memory_mb: int = Field(4096, gt=0)
    limits: SlotLimits = Field(default_factory=SlotLimits, description="Per-slot limits the servers enforce")
    workspace_mount: str = Field(
        "/workspace", description="Where a slot's workspace appears inside the sandbox (e.g. /testbed, /app)"
    )
    startup_timeout_s: float = Field(300.0, gt=0)
    poll_interval_s: float = Field(1.0, gt=0)
    request_timeout_s: float = Field(30.0, gt=0)

    @field_validator("image")
    @classmethod
    def _pinned(cls, image: str | None) -> str | None:
        if image is not None and unpinned_image(image):
            raise ValueError(
                f"image {image!r} has no pinned tag: Nomad's docker driver pulls untagged and :latest images on "
                "every start (a locally built one fails); tag it, e.g. with a content hash or commit"
            )
        return image

    @property
    def in_containers(self) -> bool:
        """docker/singularity: a container of its own image; raw_exec runs on the node itself (`in_containers`: backends/__init__.py)."""
        return self.driver != "raw_exec"


def require_image(config: NomadBackendConfig) -> None:
    """The docker and singularity drivers run an image: refuse a config without one, in one line."""
    if config.driver != "raw_exec" and config.image is None:
        raise ValueError(
            f"the Nomad {config.driver} driver needs backend.image: an image with the sandbox runtime under "
            f"{RUNTIME_MOUNT}, with a pinned tag (see docs/sandboxes.md)"
        )


def build_job_spec(config: NomadBackendConfig, *, job_id: str, token: str, meta: dict[str, str]) -> dict[str, Any]:
    """One sandbox's job in Nomad's JSON job specification (what `POST /v1/jobs` takes under "Job")."""
    port = f"${{NOMAD_PORT_{PORT_LABEL}}}"
    data_dir = "${NOMAD_TASK_DIR}/sandbox"
    require_image(config)
    runtime = SandboxRuntime.container_server_argv(config, port=port, data_dir=data_dir)
    if config.driver == "docker":
        task_config: dict[str, Any] = {
            "image": config.image,
            "force_pull": config.force_pull,
            "command": runtime[0],
            "args": runtime[1:],
            "ports": [PORT_LABEL],
            "cap_add": CAP_ADD,
            "security_opt": SECURITY_OPT,
            "privileged": config.privileged,
        }
    elif config.driver == "singularity":
        task_config = {"image": f"docker://{config.image}", "command": runtime[0], "args": runtime[1:]}
    else:  # raw_exec: the node's own python with sandbox_server installed
        args = ["-m", "sandbox_server", "--host", "0.0.0.0", "--port", port]
        args += ["--slots", str(config.pool.slots_per_sandbox), "--data-dir", data_dir, *config.limits.cli_args()]
        args += ["--workspace-mount", config.workspace_mount]  # never --allow-root-commands: root is the node's
        task_config = {"command": config.python, "args": args}
    return {
        "ID": job_id,
        "Name": job_id,
        "Type": "service",
        "Datacenters": config.datacenters,
        "Meta": {POOL_META: config.job_id, **meta},
        **({"Namespace": config.namespace} if config.namespace else {}),
        **({"Region": config.region} if config.region else {}),
        "TaskGroups": [
            {
                "Name": "sandbox",
                "Count": 1,
                "Networks": [{"DynamicPorts": [{"Label": PORT_LABEL}]}],
                # A dead sandbox is replaced by the pool (a new job), never by Nomad behind its back.
                "RestartPolicy": {"Attempts": 0, "Mode": "fail"},
                "ReschedulePolicy": {"Attempts": 0, "Unlimited": False},
                "Tasks": [
                    {
                        "Name": "sandbox-server",
                        "Driver": config.driver,
                        "Config": task_config,
                        "Env": {TOKEN_ENV: token},
                        "Resources": {"CPU": config.cpu_mhz, "MemoryMB": config.memory_mb},
                    }
                ],
            }
        ],
    }


def allocation_address(alloc: dict[str, Any]) -> tuple[str, int] | None:
    """(ip, port) of the http port in an allocation as `GET /v1/allocation/:id` returns it."""
    shared = (alloc.get("AllocatedResources") or {}).get("Shared") or {}
    for port in shared.get("Ports") or []:
        if port.get("Label") == PORT_LABEL:
            return port["HostIP"], int(port["Value"])
    for net in shared.get("Networks") or []:
        for port in net.get("DynamicPorts") or []:
            if port.get("Label") == PORT_LABEL:
                return net["IP"], int(port["Value"])
    return None


def last_task_event(alloc: dict[str, Any]) -> str:
    """The newest task event of an allocation (e.g. "Failed to pull `img:1`: ..."), as Nomad's TaskStates hold them."""
    events = [e for state in (alloc.get("TaskStates") or {}).values() for e in (state or {}).get("Events") or []]
    if not events:
        return "no task event"
    last = max(events, key=lambda e: e.get("Time") or 0)
    return str(last.get("DisplayMessage") or last.get("DriverError") or last.get("Type") or "no message")


class NomadError(RuntimeError):
    """Nomad refused a request or could not be reached."""


class NomadAPI(Protocol):
    """The Nomad calls the provider makes, with Nomad's documented JSON shapes."""

    async def register_job(self, job: dict[str, Any]) -> dict[str, Any]: ...

    async def list_jobs(self, prefix: str) -> list[dict[str, Any]]: ...

    async def job(self, job_id: str) -> dict[str, Any] | None:
        """`GET /v1/job/:id` (with its Meta); None if there is no such job."""
        ...

    async def job_allocations(self, job_id: str) -> list[dict[str, Any]]: ...

    async def allocation(self, alloc_id: str) -> dict[str, Any]: ...

    async def deregister_job(self, job_id: str, *, purge: bool) -> None:
        """Stop the job's allocations (and with purge, forget it); a job that does not exist is fine."""
        ...

    async def aclose(self) -> None:
        """Release the connection (the provider's stop() calls it last)."""
        ...


class NomadHTTP:
    """`NomadAPI` over Nomad's HTTP API at `config.address`."""

    def __init__(self, config: NomadBackendConfig, acl_token: str | None = None) -> None:
        self.address = config.address.rstrip("/")
        params = {k: v for k, v in (("namespace", config.namespace), ("region", config.region)) if v}
        self._client = httpx.AsyncClient(
            base_url=self.address,
            params=params,
            timeout=config.request_timeout_s,
            headers={"X-Nomad-Token": acl_token} if acl_token else {},
            trust_env=False,  # the configured address, never a proxy or address from the environment
        )

    async def _request(self, method: str, path: str, *, ok_404: bool = False, **kw: Any) -> Any:
        try:
            response = await self._client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise NomadError(
                f"cannot reach Nomad at {self.address} ({type(exc).__name__}: {exc}); check the backend's address"
            ) from exc
        if response.status_code == 404 and ok_404:
            return None
        if response.status_code >= 400:
            detail = response.text.strip()[:200]
            raise NomadError(f"Nomad answered {method} {path} with HTTP {response.status_code}: {detail}")
        return response.json() if response.content else None

    async def register_job(self, job):
        return await self._request("POST", "/v1/jobs", json={"Job": job})

    async def list_jobs(self, prefix):
        return await self._request("GET", "/v1/jobs", params={"prefix": prefix})

    async def job(self, job_id):
        return await self._request("GET", f"/v1/job/{job_id}", ok_404=True)

    async def job_allocations(self, job_id):
        return await self._request("GET", f"/v1/job/{job_id}/allocations")

    async def allocation(self, alloc_id):
        return await self._request("GET", f"/v1/allocation/{alloc_id}")

    async def deregister_job(self, job_id, *, purge):
        await self._request("DELETE", f"/v1/job/{job_id}", params={"purge": str(purge).lower()}, ok_404=True)

    async def aclose(self) -> None:
        await self._client.aclose()


class NomadSandboxProvider:
    def __init__(self, config: NomadBackendConfig, api: NomadAPI, owner: RunOwner | None = None) -> None:
        self.config = config
        self.api = api
        self._token = secrets.token_urlsafe(24)
        self._serial = itertools.count()
        self._allocs: dict[str, str] = {}  # sandbox name (= its job id) -> allocation id
        self.owner = owner or RunOwner.current(config.run_id)
        self._prefix = f"{config.job_id}-{self.owner.run_id}-"
        self._ours = re.compile(re.escape(config.job_id) + r"-[A-Za-z0-9_.]+-\d+")
        self.orphans_removed = 0

    def job(self, job_id: str) -> dict[str, Any]:
        return build_job_spec(self.config, job_id=job_id, token=self._token, meta=self.owner.labels())

    async def _remove_orphans(self) -> None:
        """Purge this pool's jobs that this run left (a restart with the same run_id) or whose run is gone."""
        for stub in await self.api.list_jobs(self.config.job_id + "-"):
            if not self._ours.fullmatch(stub["ID"]) or stub["ID"] in self._allocs:
                continue
            job = await self.api.job(stub["ID"])
            meta = (job or {}).get("Meta") or {}
            if meta.get(POOL_META) == self.config.job_id and self.owner.sweeps(meta):
                await self.api.deregister_job(stub["ID"], purge=True)
                self.orphans_removed += 1

    async def start(self) -> None:
        require_image(self.config)
        await self._remove_orphans()

    async def _one(self) -> SandboxAddress:
        job_id = f"{self._prefix}{next(self._serial)}"
        await self.api.register_job(self.job(job_id))
        try:
            async with asyncio.timeout(self.config.startup_timeout_s):
                while True:
                    for stub in await self.api.job_allocations(job_id):
                        if stub.get("ClientStatus") == "failed":
                            why = last_task_event(await self.api.allocation(stub["ID"]))
                            raise NomadError(
                                f"the allocation of sandbox job {job_id} failed while starting ({why}); "
                                f"see `nomad alloc status {stub['ID'][:8]}`"
                            )
                        # "running" = the task started, not that the server listens: the pool waits for /health.
                        if stub.get("ClientStatus") != "running" or stub.get("DesiredStatus") != "run":
                            continue
                        where = allocation_address(await self.api.allocation(stub["ID"]))
                        if where is not None:
                            self._allocs[job_id] = stub["ID"]
                            return SandboxAddress(job_id, f"http://{where[0]}:{where[1]}", self._token)
                    await asyncio.sleep(self.config.poll_interval_s)
        except BaseException:
            await asyncio.shield(self.api.deregister_job(job_id, purge=True))  # never leave a half-started job
            raise

    async def launch(self, count: int) -> list[SandboxAddress]:
        return await launch_all(count, self._one, self.terminate)

    async def alive(self, address: SandboxAddress) -> bool:
        alloc_id = self._allocs.get(address.name)
        if alloc_id is None:
            return False
        alloc = await self.api.allocation(alloc_id)
        return alloc.get("ClientStatus") == "running" and alloc.get("DesiredStatus") == "run"

    async def terminate(self, address: SandboxAddress) -> None:
        if self._allocs.pop(address.name, None) is not None:
            await self.api.deregister_job(address.name, purge=True)

    async def stop(self) -> None:
        names, self._allocs = list(self._allocs), {}
        await asyncio.gather(*(self.api.deregister_job(n, purge=True) for n in names), return_exceptions=True)
        try:
            await self._remove_orphans()  # anything a cancelled launch left behind
        finally:
            await self.api.aclose()


def nomad_backend(config: NomadBackendConfig, api: NomadAPI | None = None) -> SlotPool:
    return SlotPool(NomadSandboxProvider(config, api or NomadHTTP(config)), config.pool)
