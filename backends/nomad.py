"""Nomad backend: a service job whose tasks run sandbox_server, scaled by its group count.

The SDK (python-nomad, extra `nomad`) stays inside `PythonNomadAdapter`; the provider
speaks only the small `NomadAPI` protocol whose payloads are Nomad's documented HTTP
API shapes (`/v1/jobs`, `/v1/job/:id/allocations`, `/v1/allocation/:id`, ...).
`backends.testing.NomadTestDouble` implements the same protocol with local processes.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from backends.base import SlotBackend
from slots.client import SandboxAddress
from slots.pool import SlotPoolConfig

__all__ = [
    "NomadBackendConfig", "NomadAPI", "PythonNomadAdapter", "NomadSandboxProvider",
    "build_job_spec", "allocation_address", "nomad_backend",
]  # fmt: skip

TOKEN_ENV = "SANDBOX_SERVER_TOKEN"
PORT_LABEL = "http"


class NomadBackendConfig(BaseModel):
    kind: Literal["nomad"] = "nomad"
    pool: SlotPoolConfig = Field(default_factory=SlotPoolConfig)
    address: str = Field("http://127.0.0.1:4646", description="Nomad HTTP API")
    namespace: str | None = None
    region: str | None = None
    datacenters: list[str] = Field(default_factory=lambda: ["dc1"])
    job_id: str = Field("hermes-rl-sandboxes", description="Service job holding the sandboxes")
    driver: Literal["docker", "raw_exec", "singularity"] = "docker"
    image: str = Field("hermes-rl-sandbox:latest", description="The project's sandbox image (see Dockerfile)")
    python: str = Field("python3", description="Interpreter inside the task that runs sandbox_server")
    privileged: bool = Field(True, description="docker: bubblewrap needs namespaces inside the container")
    cpu_mhz: int = Field(2000, gt=0)
    memory_mb: int = Field(4096, gt=0)
    startup_timeout_s: float = Field(300.0, gt=0)
    poll_interval_s: float = Field(1.0, gt=0)


def build_job_spec(config: NomadBackendConfig, *, count: int, token: str) -> dict[str, Any]:
    """The job in Nomad's JSON job specification (what `POST /v1/jobs` takes under "Job")."""
    args = [
        "-m", "sandbox_server", "--host", "0.0.0.0", "--port", f"${{NOMAD_PORT_{PORT_LABEL}}}",
        "--slots", str(config.pool.slots_per_sandbox), "--data-dir", "${NOMAD_TASK_DIR}/sandbox",
    ]  # fmt: skip
    if config.driver == "docker":
        task_config: dict[str, Any] = {
            "image": config.image,
            "command": config.python,
            "args": args,
            "ports": [PORT_LABEL],
            "privileged": config.privileged,
        }
    elif config.driver == "singularity":
        task_config = {"image": f"docker://{config.image}", "command": config.python, "args": args}
    else:
        task_config = {"command": config.python, "args": args}
    return {
        "ID": config.job_id,
        "Name": config.job_id,
        "Type": "service",
        "Datacenters": config.datacenters,
        **({"Namespace": config.namespace} if config.namespace else {}),
        **({"Region": config.region} if config.region else {}),
        "TaskGroups": [
            {
                "Name": "sandbox",
                "Count": count,
                "Networks": [{"DynamicPorts": [{"Label": PORT_LABEL}]}],
                "RestartPolicy": {"Attempts": 0, "Mode": "fail"},  # a dead sandbox is replaced by the pool
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


class NomadAPI(Protocol):
    """The Nomad calls the provider makes, with Nomad's documented JSON shapes."""

    async def register_job(self, job: dict[str, Any]) -> dict[str, Any]: ...

    async def job_allocations(self, job_id: str) -> list[dict[str, Any]]: ...

    async def allocation(self, alloc_id: str) -> dict[str, Any]: ...

    async def stop_allocation(self, alloc_id: str) -> None: ...

    async def deregister_job(self, job_id: str, *, purge: bool) -> None: ...


class PythonNomadAdapter:
    """`NomadAPI` over python-nomad (`nomad.Nomad(...).job / .allocation`)."""

    def __init__(self, config: NomadBackendConfig, acl_token: str | None = None) -> None:
        try:
            import nomad  # noqa: PLC0415 - optional extra, imported only when Nomad is chosen
            from nomad.api.exceptions import URLNotFoundNomadException  # noqa: PLC0415
        except ImportError as exc:
            raise ImportError("the Nomad backend needs python-nomad: pip install 'hermes-rl[nomad]'") from exc
        from urllib.parse import urlparse  # noqa: PLC0415

        url = urlparse(config.address)
        self._client = nomad.Nomad(
            host=url.hostname, port=url.port or 4646, secure=url.scheme == "https",
            token=acl_token, namespace=config.namespace, region=config.region,
        )  # fmt: skip
        self._not_found = URLNotFoundNomadException

    async def _call(self, fn, *args, **kw):
        # python-nomad is blocking (requests): its calls go to the loop's bounded thread pool.
        return await asyncio.to_thread(fn, *args, **kw)

    async def register_job(self, job):
        return await self._call(self._client.job.register_job, job["ID"], {"Job": job})

    async def job_allocations(self, job_id):
        return await self._call(self._client.job.get_allocations, job_id)

    async def allocation(self, alloc_id):
        return await self._call(self._client.allocation.get_allocation, alloc_id)

    async def stop_allocation(self, alloc_id):
        await self._call(self._client.allocation.stop_allocation, alloc_id)

    async def deregister_job(self, job_id, *, purge):
        try:
            await self._call(self._client.job.deregister_job, job_id, purge=purge)
        except self._not_found:
            pass  # nothing to remove


class NomadSandboxProvider:
    def __init__(self, config: NomadBackendConfig, api: NomadAPI) -> None:
        self.config = config
        self.api = api
        self._token = secrets.token_urlsafe(24)
        self._count = 0
        self._known: dict[str, str] = {}  # sandbox name -> allocation id
        self._lock = asyncio.Lock()

    def job(self, count: int) -> dict[str, Any]:
        return build_job_spec(self.config, count=count, token=self._token)

    async def start(self) -> None:
        # A job left by a crashed run holds sandboxes nobody uses: purge it first.
        await self.api.deregister_job(self.config.job_id, purge=True)

    async def launch(self, count: int) -> list[SandboxAddress]:
        async with self._lock:
            self._count += count
            await self.api.register_job(self.job(self._count))
            found: list[SandboxAddress] = []
            async with asyncio.timeout(self.config.startup_timeout_s):
                while len(found) < count:
                    for alloc in await self.api.job_allocations(self.config.job_id):
                        name = f"nomad-{alloc['ID'][:8]}"
                        if name in self._known or alloc.get("ClientStatus") != "running" or alloc.get("DesiredStatus") != "run":
                            continue
                        where = allocation_address(await self.api.allocation(alloc["ID"]))
                        if where is None:
                            continue
                        self._known[name] = alloc["ID"]
                        found.append(SandboxAddress(name, f"http://{where[0]}:{where[1]}", self._token))
                        if len(found) == count:
                            break
                    else:
                        await asyncio.sleep(self.config.poll_interval_s)
            return found

    async def alive(self, address: SandboxAddress) -> bool:
        alloc_id = self._known.get(address.name)
        if alloc_id is None:
            return False
        alloc = await self.api.allocation(alloc_id)
        return alloc.get("ClientStatus") == "running"

    async def terminate(self, address: SandboxAddress) -> None:
        alloc_id = self._known.pop(address.name, None)
        if alloc_id is None:
            return
        async with self._lock:
            self._count = max(0, self._count - 1)
            await self.api.stop_allocation(alloc_id)
            await self.api.register_job(self.job(self._count))

    async def stop(self) -> None:
        self._known.clear()
        self._count = 0
        await self.api.deregister_job(self.config.job_id, purge=True)


def nomad_backend(config: NomadBackendConfig, api: NomadAPI | None = None) -> SlotBackend:
    return SlotBackend(NomadSandboxProvider(config, api or PythonNomadAdapter(config)), config.pool)
