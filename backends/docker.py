"""Docker backend: each sandbox_server is a container on a Docker (or Podman) engine.

The server is the self-contained runtime (backends/runtime.py) mounted read-only at /opt/hermes,
so any image can host slots: nothing of the image's userland is needed and nothing is installed
into it. The engine is spoken to with the `docker` SDK (extra `docker`) at the configured address
only ($DOCKER_HOST is never read); its calls block, so they run on a small executor this provider
owns. Only the API subset Docker and Podman's compatible service both document is used.

- The token goes into the container as a file written through the archive API before it starts:
  never in argv, the environment or `docker inspect`.
- The server's port is published on 127.0.0.1 (a port the engine picks, read back from the port map);
  bridge addresses are never used.
- Every container carries the run's labels (backends/runs.py: `hermes_rl_run`, fresh per provider, and
  its owner's host, boot and pid namespace, pid and start time) and `hermes-rl.pool`. `stop()` removes exactly this run's containers, half-started ones
  included; `start()` sweeps containers of the same pool whose owner provably is gone (same host, pid
  dead or reused), never those of another live run.
- bubblewrap needs CAP_SYS_ADMIN (and NET_ADMIN for a command's own loopback) and a seccomp profile that
  lets it make namespaces and pivot_root (backends/container_seccomp.py: Docker's default refusals but those);
  the slot watchdog needs SYS_PTRACE to see slot processes' /proc entries; no `--privileged`. Slot commands
  get their own, stricter filter (sandbox_server/syscall_filter.h).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import logging
import os
import secrets
import tarfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from collections.abc import Callable

from pydantic import BaseModel, Field

from backends.launch import launch_all
from backends.container_seccomp import SECURITY_OPT, security_opt
from backends.runs import RUN_LABEL, RunOwner, owner_gone
from backends.runtime import DEFAULT_RUNTIME_DIR, RUNTIME_MOUNT, SandboxRuntime
from sandbox_server.isolation import SlotLimits
from slots.client import SandboxAddress
from slots.pool import SlotPool, SlotPoolConfig

if TYPE_CHECKING:
    import docker

__all__ = [
    "DockerBackendConfig",
    "DockerSandboxProvider",
    "DockerBackendError",
    "docker_backend",
    "LABEL_RUN",
    "LABEL_POOL",
]

log = logging.getLogger(__name__)

LABEL_RUN = RUN_LABEL  # with the owner's host, boot, pid namespace, pid and start time (backends/runs.py)
LABEL_POOL = "hermes-rl.pool"
SERVER_PORT = 8080
TOKEN_FILE = "/.hermes-token"  # in the container's root: slots see /opt, /etc, /usr..., never "/"
DATA_DIR = "/var/lib/hermes-sandbox"

T = TypeVar("T")


class DockerBackendConfig(BaseModel):
    kind: Literal["docker"] = "docker"
    pool: SlotPoolConfig = Field(default_factory=SlotPoolConfig)
    engine: str = Field(
        "unix:///var/run/docker.sock",
        description="Engine API address (Docker or Podman's compatible service); used as given, $DOCKER_HOST is ignored",
    )
    api_version: str = Field("auto", description="Engine API version to speak ('auto': ask the engine)")
    image: str = Field(
        "debian:bookworm", description="Image the sandboxes run in (any userland: the runtime is mounted)"
    )
    pull: Literal["never", "missing", "always"] = Field(
        "missing",
        description="never: the image must be on the engine; missing: pull only if absent (a ':latest' tag is "
        "not special); always: pull at pool start",
    )
    runtime_dir: str = Field(
        str(DEFAULT_RUNTIME_DIR),
        description="Host directory of the sandbox runtime (scripts/build_sandbox_runtime.sh), mounted read-only at /opt/hermes",
    )
    pool_name: str = Field(
        "hermes-rl", description="Value of the hermes-rl.pool label (start-up sweeps stay within it)"
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on every container")
    published_host: str = Field(
        "127.0.0.1", description="Host address the server's port is published on and reached at (never a bridge IP)"
    )
    network: str | None = Field(
        None,
        description="Network the containers join (None: the engine's default bridge); slots stay offline "
        "unless a command's policy allows network",
    )
    cpus: float | None = Field(None, gt=0, description="CPUs per container (None: no limit)")
    memory_mb: int | None = Field(None, gt=0, description="Memory per container in MiB (None: no limit)")
    pids_limit: int | None = Field(
        None, gt=0, description="Processes per container, all slots together (None: the engine's default)"
    )
    ulimits: dict[str, int] = Field(
        default_factory=dict,
        description="Container rlimits, name -> value (soft = hard), e.g. nofile; Podman without CAP_SYS_RESOURCE "
        "can only give its own limits, not its raised defaults",
    )
    limits: SlotLimits = Field(default_factory=SlotLimits, description="Per-slot limits the servers enforce")
    workspace_mount: str = Field("/workspace", description="Where a slot's workspace appears inside the sandbox")
    engine_threads: int = Field(4, ge=1, le=64, description="Threads for the engine's blocking API calls")
    request_timeout_s: float = Field(60.0, gt=0, description="Timeout of one engine API call")
    pull_timeout_s: float = Field(1800.0, gt=0, description="Timeout of pulling the image")
    ca_bundle: str | None = Field(
        "host",
        description="CA bundle put into images built from task Dockerfiles (and trusted through SSL_CERT_FILE, "
        "REQUESTS_CA_BUNDLE, PIP_CERT, CURL_CA_BUNDLE...): a path, 'host' (the host's SSL_CERT_FILE when set) or "
        "None; for a TLS-intercepting proxy",
    )
    build_proxy: dict[str, str] = Field(
        default_factory=dict,
        description="HTTP_PROXY / HTTPS_PROXY / NO_PROXY given to image builds (Docker's predefined build args)",
    )
    task_storage: Literal["refuse", "unenforced"] = Field(
        "refuse",
        description="A task's storage_mb where the engine has no per-container quota: refuse the task, or run it "
        "without the limit (said once)",
    )

    def ca_bundle_bytes(self) -> bytes | None:
        """The CA bundle to inject, read here (the host's SSL_CERT_FILE is read in this one place)."""
        path = os.environ.get("SSL_CERT_FILE") if self.ca_bundle == "host" else self.ca_bundle
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise DockerBackendError(
                f"cannot read the CA bundle {path} ({exc}); set ca_bundle to a readable file or None"
            ) from None

    @property
    def in_containers(self) -> bool:
        """Each sandbox is a container of its own image (`in_containers`: backends/__init__.py)."""
        return True


class DockerBackendError(RuntimeError):
    """The engine refused, or the image or runtime is missing: one line saying what to do."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _token_archive(token: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = token.encode()
        info = tarfile.TarInfo(TOKEN_FILE.lstrip("/"))
        info.size, info.mode, info.uid, info.gid = len(data), 0o400, 0, 0
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class DockerSandboxProvider:
    def __init__(self, config: DockerBackendConfig) -> None:
        self.config = config
        self.owner = RunOwner.current(uuid.uuid4().hex[:12])
        self.run_id = self.owner.run_id
        self._pending: set[concurrent.futures.Future] = set()  # engine calls still running in a thread
        self._executor: ThreadPoolExecutor | None = None
        self._client: docker.DockerClient | None = None
        self._security_opt: list[str] = SECURITY_OPT  # the engine's, once asked (start)
        self._containers: dict[str, str] = {}  # sandbox name -> container id
        self._seq = 0

    # -- engine calls, off the event loop ---------------------------------------------------
    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        assert self._executor is not None, "start() first"
        # A cancelled await does not stop the thread: a create may still land after it, so stop()
        # waits for what is pending before it lists this run's containers.
        future = self._executor.submit(fn, *args, **kwargs)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return await asyncio.wrap_future(future)

    @property
    def api(self) -> Any:
        assert self._client is not None, "start() first"
        return self._client.api

    def labels(self) -> dict[str, str]:
        return {
            **self.config.labels,
            **self.owner.labels(),
            LABEL_POOL: self.config.pool_name,
        }

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            import docker
        except ImportError:
            raise DockerBackendError(
                "the docker backend needs the `docker` SDK: pip install 'hermes-rl[docker]'"
            ) from None
        runtime = SandboxRuntime(Path(self.config.runtime_dir))
        runtime.check()
        self._executor = ThreadPoolExecutor(self.config.engine_threads, thread_name_prefix="docker-engine")
        try:
            self._client = await self._call(
                docker.DockerClient,
                base_url=self.config.engine,
                version=self.config.api_version,
                timeout=int(self.config.request_timeout_s),
            )
        except docker.errors.DockerException as exc:
            raise DockerBackendError(
                f"no container engine answers at {self.config.engine} ({_one_line(exc)}); start dockerd (or "
                "`podman system service`) or set env.runtime.sandbox.backend.engine"
            ) from None
        self._security_opt = security_opt(await self._call(self.api.version))
        await self._ensure_image()
        await self.sweep_orphans()

    async def _ensure_image(self) -> None:
        import docker

        image, policy = self.config.image, self.config.pull
        present = True
        try:
            await self._call(self.api.inspect_image, image)
        except docker.errors.ImageNotFound:
            present = False
        if present and policy != "always":
            return
        if policy == "never":
            raise DockerBackendError(
                f"image {image} is not on the engine at {self.config.engine} and pull is never; "
                "build or load it there, or set pull: missing"
            )
        repo, tag = docker.utils.parse_repository_tag(image)
        try:
            # A tag must be given: without one the SDK pulls every tag of the repository.
            await asyncio.wait_for(self._call(self.api.pull, repo, tag=tag or "latest"), self.config.pull_timeout_s)
            await self._call(self.api.inspect_image, image)
        except (docker.errors.APIError, asyncio.TimeoutError) as exc:
            reason = _one_line(getattr(exc, "explanation", None) or type(exc).__name__)
            raise DockerBackendError(
                f"image {image} is not on the engine and could not be pulled ({reason}); "
                "build or load it there, or check its name and the registry"
            ) from None

    async def sweep_orphans(self) -> int:
        """Remove containers of this pool whose owning run is provably gone; returns how many."""
        found = await self._call(
            self.api.containers, all=True, filters={"label": f"{LABEL_POOL}={self.config.pool_name}"}
        )
        gone = [c["Id"] for c in found if owner_gone(c.get("Labels") or {}, self.owner.host, self.owner.pidns)]
        for cid in gone:
            await self._remove(cid)
        if gone:
            log.info("removed %d container(s) left by dead runs of pool %s", len(gone), self.config.pool_name)
        return len(gone)

    async def launch(self, count: int) -> list[SandboxAddress]:
        return await launch_all(count, self._launch_one, self.terminate)

    async def _launch_one(self) -> SandboxAddress:
        import docker

        self._seq += 1
        name = f"hermes-{self.config.pool_name}-{self.run_id}-{self._seq}"
        token = secrets.token_urlsafe(24)
        c = self.config
        argv = SandboxRuntime.container_server_argv(c, port=SERVER_PORT, data_dir=DATA_DIR, token_file=TOKEN_FILE)
        host_config = self.api.create_host_config(
            binds={str(Path(c.runtime_dir).resolve()): {"bind": RUNTIME_MOUNT, "mode": "ro"}},
            port_bindings={SERVER_PORT: (c.published_host, None)},
            # SYS_ADMIN: bubblewrap's namespaces and mounts; NET_ADMIN: loopback up in a command's own
            # network namespace; SYS_PTRACE: the slot watchdog reads /proc/<pid>/ns and smaps_rollup of
            # slot processes (other uids). Commands themselves run with every capability dropped.
            cap_add=["SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"],
            security_opt=self._security_opt,  # backends/container_seccomp.py
            tmpfs={"/tmp": "rw,exec,nosuid,nodev,mode=1777"},
            network_mode=c.network,
            nano_cpus=int(c.cpus * 1e9) if c.cpus else None,
            mem_limit=f"{c.memory_mb}m" if c.memory_mb else None,
            pids_limit=c.pids_limit,
            ulimits=[docker.types.Ulimit(name=k, soft=v, hard=v) for k, v in c.ulimits.items()] or None,
        )
        self._containers[name] = name  # stop() finds it by label even if create never returns
        try:
            created = await self._call(
                self.api.create_container,
                c.image,
                name=name,
                entrypoint=argv[:1],
                command=argv[1:],
                user="0:0",  # the server drops each command to its slot's uid itself
                working_dir="/",
                environment={},
                labels=self.labels(),
                ports=[SERVER_PORT],
                host_config=host_config,
            )
            self._containers[name] = created["Id"]
            await self._call(self.api.put_archive, created["Id"], "/", _token_archive(token))
            await self._call(self.api.start, created["Id"])
            port = await self._published_port(created["Id"])
        except BaseException as exc:
            await asyncio.shield(self._remove_when_landed(name))
            if isinstance(exc, docker.errors.APIError):
                raise DockerBackendError(
                    f"could not start a sandbox container from {c.image}: {_one_line(exc.explanation or exc)}"
                ) from None
            raise
        return SandboxAddress(name, f"http://{c.published_host}:{port}", token)

    async def _remove_when_landed(self, name: str) -> None:
        """Remove a container whose launch failed or was cancelled, once its create (if any) has landed."""
        self._containers.pop(name, None)
        if self._pending:
            await asyncio.wait([asyncio.wrap_future(f) for f in list(self._pending)])
        await self._remove(name)

    async def _published_port(self, cid: str) -> int:
        info = await self._call(self.api.inspect_container, cid)
        bound = ((info.get("NetworkSettings") or {}).get("Ports") or {}).get(f"{SERVER_PORT}/tcp") or []
        for b in bound:
            if b.get("HostPort"):
                return int(b["HostPort"])
        state = info.get("State") or {}
        raise DockerBackendError(
            f"container {info.get('Name', cid)} has no published port for {SERVER_PORT}/tcp "
            f"(status {state.get('Status')}, exit code {state.get('ExitCode')})"
        )

    async def alive(self, address: SandboxAddress) -> bool:
        import docker

        cid = self._containers.get(address.name)
        if cid is None:
            return False
        try:
            info = await self._call(self.api.inspect_container, cid)
        except docker.errors.NotFound:
            return False
        running = bool((info.get("State") or {}).get("Running"))
        if not running:
            tail = await self.logs(address, lines=20)
            log.warning("sandbox container %s is not running; its log ends with:\n%s", address.name, tail)
        return running

    async def logs(self, address: SandboxAddress, lines: int = 50) -> str:
        """The last `lines` of a sandbox container's output (for error messages)."""
        import docker

        cid = self._containers.get(address.name, address.name)
        try:
            raw = await self._call(self.api.logs, cid, tail=lines)
        except docker.errors.APIError:
            return ""
        return raw.decode(errors="replace")

    def container_id(self, address: SandboxAddress) -> str:
        return self._containers[address.name]

    async def terminate(self, address: SandboxAddress) -> None:
        cid = self._containers.pop(address.name, None)
        if cid is not None:
            await self._remove(cid)

    async def _remove(self, cid: str) -> None:
        import docker

        try:
            # Kill and remove at once: the container's filesystem (slot workspaces included) goes with it.
            await self._call(self.api.remove_container, cid, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise

    async def stop(self) -> None:
        if self._client is None:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None
            return
        try:
            # By label, not by what we tracked: a create whose answer never came back is found too,
            # once the calls still running in threads have landed.
            if self._pending:
                await asyncio.wait([asyncio.wrap_future(f) for f in list(self._pending)])
            mine = await self._call(self.api.containers, all=True, filters={"label": f"{LABEL_RUN}={self.run_id}"})
            await asyncio.gather(*(self._remove(c["Id"]) for c in mine))
            self._containers.clear()
        finally:
            client, self._client = self._client, None
            await self._call(client.close)
            assert self._executor is not None
            self._executor.shutdown(wait=False)
            self._executor = None


def docker_backend(config: DockerBackendConfig | None = None) -> SlotPool:
    config = config or DockerBackendConfig()
    return SlotPool(DockerSandboxProvider(config), config.pool)
