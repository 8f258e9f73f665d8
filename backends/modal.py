"""Modal backend: a pool of `modal.Sandbox`es, each running sandbox_server with N slots.

SDK calls (extra `modal`, >= 1.4.3: `Sandbox.create(name=, tags=, idle_timeout=)` and
`Sandbox.from_name`; `runtime=` needs >= 1.6.0) live in `ModalSDKAdapter`; the provider adds
what the pool needs on top: sandboxes named "<pool>-<run>-<n>" and tagged at creation with the
pool and the owning run (backends/runs.py), so a start removes only this run's leftovers and
those of runs provably gone, never a concurrent run's; a creation rate limit, a cap on
sandboxes starting at once, idle timeout and lifetime. The image is the project's Dockerfile,
built by Modal (`Image.from_dockerfile`), unless a registry image is named; either holds the
sandbox runtime under /opt/hermes (backends/runtime.py), or `runtime_dir` adds it to the registry image.

Modal's semantics the provider lives with: `tunnels()` returns once the container runs, before
sandbox_server listens; a TCP readiness probe (`Probe.with_tcp`, `wait_until_ready`) says when
it listens, and the pool still waits for `/health`. `timeout` (at most 24 h) ends a sandbox
whatever it runs: the provider reports each sandbox's expiry (`expires_at`) and the pool drains
it before then (no new trajectories, a replacement started, terminated once its slots are free).

Bubblewrap under Modal's default runtime (gVisor) may be unable to create a network
namespace (gVisor gives new namespaces a configured loopback; google/gvisor#13438,
containers/bubblewrap#745), and sandbox_server then refuses every command. So the first
sandbox's isolation is checked at start; with `isolation_fallback: vm` (the default) the pool
moves to Modal's VM runtime, with `fail` it stops with a one-line error.
`tests/support/nomad_modal_doubles.py` (`ModalTestDouble`) implements `ModalAPI` with containers on a real Docker engine.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import aiohttp
from pydantic import BaseModel, Field

from backends.launch import launch_all
from backends.runs import RunOwner
from backends.runtime import RUNTIME_MOUNT, SandboxRuntime
from sandbox_server.isolation import SlotLimits
from slots.client import SandboxAddress, SandboxClient
from slots.pool import SlotPool, SlotPoolConfig

__all__ = [
    "ModalBackendConfig",
    "ModalSandboxSpec",
    "ModalAPI",
    "ModalSDKAdapter",
    "ModalSandboxProvider",
    "ModalIsolationError",
    "modal_backend",
    "MODAL_MIN_VERSION",
]

log = logging.getLogger(__name__)

TOKEN_ENV = "SANDBOX_SERVER_TOKEN"
SERVER_PORT = 8080
POOL_TAG = "hermes_rl_pool"
MAX_LIFETIME_S = 24 * 3600  # Modal's maximum sandbox `timeout`
MODAL_MIN_VERSION = "1.4.3"  # keep equal to the floor of the `modal` extra in pyproject.toml
RUNTIME_MIN_VERSION = "1.6.0"
DOCKERFILE = Path(__file__).resolve().parents[1] / "Dockerfile"


class ModalBackendConfig(BaseModel):
    kind: Literal["modal"] = "modal"
    pool: SlotPoolConfig = Field(default_factory=SlotPoolConfig)
    app_name: str = "hermes-rl-sandboxes"
    pool_name: str = Field("default", description="Names (<pool>-<run>-<n>) and tags this pool's sandboxes")
    run_id: str | None = Field(
        None, description="Names and tags this run's sandboxes; None: a fresh id. Set it to restart a crashed run"
    )
    limits: SlotLimits = Field(default_factory=SlotLimits, description="Per-slot limits the servers enforce")
    workspace_mount: str = Field(
        "/workspace", description="Where a slot's workspace appears inside the sandbox (e.g. /testbed, /app)"
    )
    image: str | None = Field(
        None,
        description="A registry image with the sandbox runtime under /opt/hermes (built from our Dockerfile, or any "
        "image when `runtime_dir` is set); None: Modal builds `dockerfile`",
    )
    runtime_dir: str | None = Field(
        None,
        description="Local sandbox runtime (scripts/build_sandbox_runtime.sh) Modal adds to `image` at /opt/hermes "
        "(Image.add_local_dir): any registry image then hosts slots, e.g. SWE-smith's published ones",
    )
    dockerfile: str = Field(str(DOCKERFILE), description="Built with Image.from_dockerfile (context: its directory)")
    runtime: Literal["gvisor", "vm"] | None = Field(
        None, description="Modal's sandbox runtime (modal>=1.6.0); None: Modal's default, gVisor"
    )
    isolation_fallback: Literal["vm", "fail"] = Field(
        "vm", description="When bubblewrap cannot isolate under the runtime: move to the VM runtime, or fail"
    )
    cpu: float = Field(2.0, gt=0)
    memory_mb: int = Field(4096, gt=0)
    lifetime_s: int = Field(
        3600,
        gt=0,
        le=MAX_LIFETIME_S,
        description="Modal `timeout` (at most 24 h): the sandbox is stopped after this long; the pool drains it "
        "`pool.drain_before_expiry_s` earlier",
    )
    idle_timeout_s: int | None = Field(None, gt=0, description="Modal `idle_timeout`")
    create_rate_per_s: float = Field(2.0, gt=0, description="At most this many Sandbox.create calls per second")
    max_starting: int = Field(4, ge=1, description="Sandboxes starting at the same time")
    startup_timeout_s: float = Field(300.0, gt=0)

    @property
    def in_containers(self) -> bool:
        """Each sandbox is a container of its own image (`in_containers`: backends/__init__.py)."""
        return True


@dataclass(frozen=True)
class ModalSandboxSpec:
    """Arguments of one `modal.Sandbox.create` call, in the SDK's own names."""

    args: tuple[str, ...]
    name: str
    image: str | None  # a registry reference, or None to build `dockerfile`
    dockerfile: str
    secrets: dict[str, str]
    timeout: int
    idle_timeout: int | None
    cpu: float
    memory: int
    encrypted_ports: tuple[int, ...]
    tags: dict[str, str] = field(default_factory=dict)
    runtime: str | None = None
    readiness_tcp_port: int | None = None  # `readiness_probe=Probe.with_tcp(port)`
    runtime_dir: str | None = None  # added to `image` at RUNTIME_MOUNT (`Image.add_local_dir(..., copy=True)`)


class ModalIsolationError(RuntimeError):
    """bubblewrap cannot isolate commands in Modal sandboxes under the chosen runtime."""


class ModalAPI(Protocol):
    async def lookup_app(self, name: str) -> str:
        """`modal.App.lookup(name, create_if_missing=True)`; returns the app id."""
        ...

    async def create_sandbox(self, app_id: str, spec: ModalSandboxSpec) -> str:
        """`modal.Sandbox.create(*args, app=..., name=..., tags=..., ...)`; returns the sandbox's object id."""
        ...

    async def tunnel_url(self, sandbox_id: str, port: int, timeout: float) -> str:
        """`Sandbox.tunnels(timeout=...)[port].url`: available once the container runs, not when the port listens."""
        ...

    async def wait_until_ready(self, sandbox_id: str, timeout: float) -> None:
        """`Sandbox.wait_until_ready(timeout=...)`: the readiness probe passed (TimeoutError if not in time)."""
        ...

    async def poll(self, sandbox_id: str) -> int | None:
        """`Sandbox.poll()`: None while running, else the exit code."""
        ...

    async def terminate(self, sandbox_id: str) -> None: ...

    async def list_sandboxes(self, app_id: str, tags: dict[str, str]) -> list[str]:
        """`modal.Sandbox.list(app_id=..., tags=...)`: ids of the app's running sandboxes with these tags."""
        ...

    async def sandbox_tags(self, sandbox_id: str) -> dict[str, str]:
        """`Sandbox.get_tags()`."""
        ...


class ModalSDKAdapter:
    """`ModalAPI` over the `modal` SDK's async (`.aio`) interface.

    `sdk` is the `modal` module (imported when not given); tests hand in a recorder to bind
    every call made here against the real SDK's signatures at its floor and newest versions.
    """

    def __init__(self, sdk: Any = None) -> None:
        if sdk is None:
            try:
                import modal  # noqa: PLC0415 - optional extra, imported only when Modal is chosen
            except ImportError as exc:
                raise ImportError(
                    f"the Modal backend needs the modal SDK: pip install 'hermes-rl[modal]' (modal>={MODAL_MIN_VERSION})"
                ) from exc
            sdk = modal
        self._modal = sdk
        self._apps: dict[str, Any] = {}
        self._sandboxes: dict[str, Any] = {}
        self._images: dict[tuple[str, str | None], Any] = {}

    @staticmethod
    def create_kwargs(spec: ModalSandboxSpec) -> dict[str, Any]:
        """The keyword arguments given to `modal.Sandbox.create` (besides app, image, secrets objects)."""
        kwargs = {
            "name": spec.name,
            "tags": dict(spec.tags),
            "timeout": spec.timeout,
            "idle_timeout": spec.idle_timeout,
            "cpu": spec.cpu,
            "memory": spec.memory,
            "encrypted_ports": list(spec.encrypted_ports),
        }
        if spec.runtime is not None:  # only then: `runtime=` needs modal >= 1.6.0
            kwargs["runtime"] = spec.runtime
        return kwargs

    def _probe(self, spec: ModalSandboxSpec) -> dict[str, Any]:
        if spec.readiness_tcp_port is None:
            return {}
        return {"readiness_probe": self._modal.Probe.with_tcp(spec.readiness_tcp_port)}

    def _image(self, spec: ModalSandboxSpec) -> Any:
        key = (spec.image or spec.dockerfile, spec.runtime_dir)
        if key not in self._images:
            if spec.image and spec.runtime_dir:  # any image: the runtime is a layer of its own
                self._images[key] = self._modal.Image.from_registry(spec.image).add_local_dir(
                    spec.runtime_dir, RUNTIME_MOUNT, copy=True
                )
            elif spec.image:
                self._images[key] = self._modal.Image.from_registry(spec.image)
            else:  # Modal builds our Dockerfile once and caches the layers
                context = str(Path(spec.dockerfile).parent)
                self._images[key] = self._modal.Image.from_dockerfile(spec.dockerfile, context_dir=context)
        return self._images[key]

    async def lookup_app(self, name):
        app = await self._modal.App.lookup.aio(name, create_if_missing=True)
        self._apps[app.app_id] = app
        return app.app_id

    async def create_sandbox(self, app_id, spec):
        m = self._modal
        try:
            sb = await m.Sandbox.create.aio(
                *spec.args,
                app=self._apps[app_id],
                image=self._image(spec),
                secrets=[m.Secret.from_dict(spec.secrets)],
                **self._probe(spec),
                **self.create_kwargs(spec),
            )
        except TypeError as exc:
            if spec.runtime is not None and "runtime" in str(exc):
                raise TypeError(
                    f"this modal SDK has no Sandbox runtime= (added in {RUNTIME_MIN_VERSION}): upgrade modal, "
                    "or set isolation_fallback: fail and leave runtime unset"
                ) from exc
            raise
        self._sandboxes[sb.object_id] = sb
        return sb.object_id

    async def _get(self, sandbox_id):
        sb = self._sandboxes.get(sandbox_id)
        if sb is None:
            sb = await self._modal.Sandbox.from_id.aio(sandbox_id)
            self._sandboxes[sandbox_id] = sb
        return sb

    async def tunnel_url(self, sandbox_id, port, timeout):
        tunnels = await (await self._get(sandbox_id)).tunnels.aio(timeout=int(timeout))
        return tunnels[port].url

    async def wait_until_ready(self, sandbox_id, timeout):
        await (await self._get(sandbox_id)).wait_until_ready.aio(timeout=max(1, int(timeout)))

    async def poll(self, sandbox_id):
        return await (await self._get(sandbox_id)).poll.aio()

    async def terminate(self, sandbox_id):
        await (await self._get(sandbox_id)).terminate.aio()
        self._sandboxes.pop(sandbox_id, None)

    async def list_sandboxes(self, app_id, tags):
        return [sb.object_id async for sb in self._modal.Sandbox.list.aio(app_id=app_id, tags=tags)]

    async def sandbox_tags(self, sandbox_id):
        return dict(await (await self._get(sandbox_id)).get_tags.aio())


class _RateLimiter:
    """At most `rate` acquisitions per second, spaced evenly."""

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        async with self._lock:
            now = time.monotonic()
            if self._next > now:
                await asyncio.sleep(self._next - now)
            self._next = max(now, self._next) + self._interval


class ModalSandboxProvider:
    def __init__(self, config: ModalBackendConfig, api: ModalAPI, owner: RunOwner | None = None) -> None:
        self.config = config
        self.api = api
        self._token = secrets.token_urlsafe(24)
        self._app_id: str | None = None
        self._ids: dict[str, str] = {}  # sandbox name -> Modal object id
        self._expires: dict[str, float] = {}  # sandbox name -> time.monotonic() when Modal ends it
        self.owner = owner or RunOwner.current(config.run_id)
        self._serial = itertools.count()
        self._starting = asyncio.Semaphore(config.max_starting)
        self._rate = _RateLimiter(config.create_rate_per_s)
        self.orphans_removed = 0
        self.runtime = config.runtime  # moves to "vm" when bubblewrap cannot isolate under the default
        self._isolation_checked = False
        self._isolation_lock = asyncio.Lock()

    @property
    def tags(self) -> dict[str, str]:
        return {POOL_TAG: self.config.pool_name, **self.owner.labels()}

    def spec(self, name: str) -> ModalSandboxSpec:
        return ModalSandboxSpec(
            args=tuple(
                SandboxRuntime.container_server_argv(self.config, port=SERVER_PORT, data_dir="/var/lib/hermes-sandbox")
            ),
            name=name,
            image=self.config.image,
            dockerfile=self.config.dockerfile,
            secrets={TOKEN_ENV: self._token},
            timeout=self.config.lifetime_s,
            idle_timeout=self.config.idle_timeout_s,
            cpu=self.config.cpu,
            memory=self.config.memory_mb,
            encrypted_ports=(SERVER_PORT,),
            tags=self.tags,
            runtime=self.runtime,
            readiness_tcp_port=SERVER_PORT,
            runtime_dir=self.config.runtime_dir if self.config.image else None,
        )

    async def start(self) -> None:
        if self.config.runtime_dir is not None:
            SandboxRuntime(Path(self.config.runtime_dir)).check()  # one line saying how to build it
        self._app_id = await self.api.lookup_app(self.config.app_name)
        await self._remove_orphans()

    def name(self, number: int) -> str:
        return f"{self.config.pool_name}-{self.owner.run_id}-{number}"

    async def _remove_orphans(self) -> None:
        """Terminate this pool's sandboxes that this run left (a restart with the same run_id) or whose run is gone."""
        assert self._app_id is not None
        ours = set(self._ids.values())
        for sandbox_id in await self.api.list_sandboxes(self._app_id, {POOL_TAG: self.config.pool_name}):
            if sandbox_id not in ours and self.owner.sweeps(await self.api.sandbox_tags(sandbox_id)):
                await self.api.terminate(sandbox_id)
                self.orphans_removed += 1

    async def _isolation_problem(self, address: SandboxAddress) -> str | None:
        """Why sandbox_server in this sandbox cannot isolate commands (its own bwrap probe), or None."""
        async with aiohttp.ClientSession() as session:
            health = await SandboxClient(address, session).wait_ready(
                self.config.pool.ready_timeout_s, functools.partial(self.alive, address)
            )
        isolation = health["isolation"]
        return None if isolation["available"] else str(isolation.get("reason") or "no reason given")

    async def _one(self) -> SandboxAddress:
        if self._isolation_checked:
            return await self._create()
        async with self._isolation_lock:  # the first sandbox settles the runtime; the others wait for it
            while not self._isolation_checked:
                address = await self._create()
                try:
                    problem = await self._isolation_problem(address)
                except BaseException:
                    await asyncio.shield(self.terminate(address))
                    raise
                if problem is None:
                    self._isolation_checked = True
                    return address
                await self.terminate(address)
                runtime = self.runtime or "default (gVisor)"
                if self.runtime == "vm" or self.config.isolation_fallback == "fail":
                    todo = (
                        "no runtime is left to try"
                        if self.runtime == "vm"
                        else "set `runtime: vm` or `isolation_fallback: vm`"
                    )
                    raise ModalIsolationError(
                        f"bubblewrap cannot isolate commands in Modal sandboxes under the {runtime} runtime: {problem}; {todo}"
                    )
                log.warning(
                    "bubblewrap cannot isolate under Modal's %s runtime (%s); using the vm runtime", runtime, problem
                )
                self.runtime = "vm"
        return await self._create()

    async def _create(self) -> SandboxAddress:
        assert self._app_id is not None, "start() first"
        name = self.name(next(self._serial))
        async with self._starting:
            await self._rate.wait()
            created = time.monotonic()  # Modal counts `timeout` from creation: this errs on the early side
            sandbox_id = await self.api.create_sandbox(self._app_id, self.spec(name))
            self._ids[name] = sandbox_id
            self._expires[name] = created + self.config.lifetime_s
            try:
                url = await self.api.tunnel_url(sandbox_id, SERVER_PORT, self.config.startup_timeout_s)
                # The tunnel exists once the container runs; the probe says when the server listens.
                await self.api.wait_until_ready(sandbox_id, self.config.startup_timeout_s)
            except BaseException:
                await asyncio.shield(self.terminate(SandboxAddress(name, "", self._token)))
                raise
        return SandboxAddress(name, url.rstrip("/"), self._token)

    async def launch(self, count: int) -> list[SandboxAddress]:
        return await launch_all(count, self._one)

    async def alive(self, address: SandboxAddress) -> bool:
        sandbox_id = self._ids.get(address.name)
        return sandbox_id is not None and await self.api.poll(sandbox_id) is None

    def expires_at(self, address: SandboxAddress) -> float | None:
        """When Modal ends this sandbox (`time.monotonic()`), for the pool's drain before expiry."""
        return self._expires.get(address.name)

    async def terminate(self, address: SandboxAddress) -> None:
        sandbox_id = self._ids.pop(address.name, None)
        self._expires.pop(address.name, None)
        if sandbox_id is not None:
            await self.api.terminate(sandbox_id)

    async def stop(self) -> None:
        await asyncio.gather(*(self.api.terminate(i) for i in self._ids.values()), return_exceptions=True)
        self._ids.clear()
        self._expires.clear()
        if self._app_id is not None:
            await self._remove_orphans()  # anything a cancelled launch left behind


def modal_backend(config: ModalBackendConfig, api: ModalAPI | None = None) -> SlotPool:
    return SlotPool(ModalSandboxProvider(config, api or ModalSDKAdapter()), config.pool)
