"""A task container per trajectory, as Harbor runs a task on its docker environment.

Interface (what the terminal env and the reward code plug into):

    spec = TaskContainerSpec(image="…built tag…", workdir="/app", user="root", env={...},
                             cpus=1, memory_mb=2048, storage_mb=None, network=False)
    async with TaskContainers(config) as engine:          # one engine client + thread pool
        async with engine.container(spec, owner="task-id") as box:
            r = await box.exec("make", timeout=60)           # bash -lc, as `spec.user`, from `spec.workdir`
            await box.put_files("/tests", {"test.sh": (b"...", 0o755)})
            changed = await box.changes()                    # the engine's diff against the image
            r = await box.exec("bash /tests/test.sh", timeout=900, user="root")
            data = await box.read_file("/logs/verifier/reward.txt")

- The container is the image's own filesystem, writable, kept alive by our own pid 1 where Harbor's compose
  file has `sleep infinity` under docker's init: `hermes-spawn --init` (sandbox_server/task_init.c, a static
  file copied in as /.hermes-init before the start). It reaps orphans and is non-dumpable, so the agent (no
  CAP_SYS_PTRACE here, whatever its uid) cannot ptrace it into running its own program: the verifier's guard
  spares pid 1 alone. Every command is a `docker exec` of
  `bash -lc <command>` (Harbor's own exec), as the given user (default the spec's; None: the image's
  own USER, root unless the Dockerfile names another; the verifier passes root), with the spec's environment, in the given working directory (default the
  spec's: the Dockerfile's final WORKDIR). Nothing of the host is mounted; `docker exec` through the
  engine API needs no runtime inside the container, so the image's userland is exactly what the
  agent and the tests see (truest to Harbor, simplest).
- Isolation: the engine's default seccomp profile and default capability set, never `--privileged`,
  `no-new-privileges`, a pids limit; `network_mode=none` when the task forbids internet.
- Limits: `cpus` (NanoCpus) and `memory_mb` (Memory, swap equal: no extra swap) always; `storage_mb`
  needs the engine's per-container quota (overlay2 on xfs with pquota): on an engine without it,
  `storage="refuse"` (default) refuses the container in one line, `storage="unenforced"` runs it
  and says so once.
- A command's timeout: `timeout -k 5 <s>` in the container when the image has it, and the wait
  here ends `timeout + 15` s later anyway (the command is then reported as timed out).
- Containers carry the run's labels (backends/runs.py) plus `hermes-rl.task-container`; leaving the
  context (or `close()`) removes them, a crashed run's leftovers are swept like the slot pools'.
"""

from __future__ import annotations

import asyncio
import io
import logging
import shlex
import tarfile
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, Field

from backends.runs import RunOwner, owner_gone
from sandbox_server.isolation import SPAWN_HELPER
from sandbox_server.procs import ExecResult

__all__ = ["TaskContainerConfig", "TaskContainerSpec", "TaskContainers", "TaskContainer", "TaskContainerError"]

log = logging.getLogger(__name__)

LABEL_TASK = "hermes-rl.task-container"
# pid 1: hermes-spawn (built by scripts/setup.sh) in its init mode, copied to INIT_PATH before the start. The
# engine's diff shows the file as the container's own; changes() leaves it out.
INIT_PATH = "/.hermes-init"
INIT_COMMAND = [INIT_PATH, "--init"]
# Changes the engine reports (ContainerChanges Kind): 0 modified, 1 added, 2 deleted.
CHANGE_KINDS = {0: "modified", 1: "added", 2: "deleted"}


class TaskContainerError(RuntimeError):
    """The engine refused the container, or the task asks for what this engine cannot give: one line."""


class TaskContainerConfig(BaseModel):
    engine: str = Field("unix:///var/run/docker.sock", description="Engine API address, used as given")
    storage: Literal["refuse", "unenforced"] = Field(
        "refuse",
        description="A task's storage_mb on an engine without per-container quotas: refuse the task, or run it "
        "without the limit (said once)",
    )
    pids_limit: int = Field(4096, gt=0, description="Processes per task container")
    network: str | None = Field(
        None, description="Network a task with internet joins (None: the engine's default bridge)"
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on every container")
    engine_threads: int = Field(4, ge=1, le=64, description="Threads for the engine's blocking API calls")
    engine_timeout_s: int = Field(
        600,
        gt=0,
        description="Read timeout of one engine call (a large container's diff takes minutes on a busy engine)",
    )


class TaskContainerSpec(BaseModel):
    image: str = Field(..., description="A local image (built tag or the task's docker_image)")
    workdir: str = Field(..., description="Where commands start (Harbor: the Dockerfile's final WORKDIR)")
    user: str | None = Field(
        None, description="Who the agent's commands run as (None: the image's own USER, root unless it names one)"
    )
    keepalive_user: str | None = Field(
        None,
        description="Who the container's pid 1 runs as (None: `user`); root keeps the engine's capabilities for "
        "root's own steps where the commands run as another user",
    )
    env: dict[str, str] = Field(default_factory=dict, description="The task's environment for every command")
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(None, gt=0)
    network: bool = Field(False, description="allow_internet: the engine's default bridge, else no network at all")


def _tar(files: dict[str, tuple[bytes, int]], owner: int = 0) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, owner, owner, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class TaskContainer:
    """One started container; every method is a coroutine over the engine's API."""

    def __init__(self, engines: TaskContainers, cid: str, spec: TaskContainerSpec, name: str) -> None:
        self._engines = engines
        self.id = cid
        self.spec = spec
        self.name = name
        self.has_timeout = True
        # The programs every command runs under, found by path before the agent's first command: a `timeout` or
        # `bash` the agent adds earlier on PATH later is never what runs the verifier (one it replaces in place is
        # a change the integrity check flags).
        self.timeout_path = "timeout"
        self.bash_path = "bash"

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        user: str | None = None,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        max_output_bytes: int = 1_000_000,
        login: bool = True,
    ) -> ExecResult:
        """`bash -lc command` in the container; stdout and stderr together, capped at `max_output_bytes`.

        `login=False`: `bash -c`, no profile read (our own steps: a root agent may have rewritten the profiles)."""
        argv = [self.bash_path, "-lc" if login else "-c", command]
        if self.has_timeout:
            argv = [self.timeout_path, "-k", "5", f"{max(timeout, 1):g}", *argv]
        who = user or self.spec.user or ""
        if who in ("root", "0", "0:0") and "HOME" not in self.spec.env:
            # root's home as the image has it, not as the agent may have rewritten /etc/passwd (its login profiles
            # are what the integrity check compares)
            env = {"HOME": "/root", **(env or {})}
        return await self._engines._exec(self, argv, timeout, who, workdir, env, max_output_bytes)

    async def put_files(self, directory: str, files: dict[str, tuple[bytes, int]], owner: int = 0) -> None:
        """Files (relative name -> (content, mode)) into `directory` (made if missing), owned by uid and gid `owner`
        (the engine keeps the archive's owners)."""
        await self.exec(f"mkdir -p {shlex.quote(directory)}", timeout=60, user="root", workdir="/", login=False)
        await self._engines._call(self._engines.api.put_archive, self.id, directory, _tar(files, owner))

    async def write_file(self, path: str, data: bytes) -> None:
        p = PurePosixPath(path if path.startswith("/") else f"{self.spec.workdir}/{path}")
        await self.put_files(str(p.parent), {p.name: (data, 0o644)})

    async def read_file(self, path: str) -> bytes:
        p = path if path.startswith("/") else f"{self.spec.workdir}/{path}"
        return await self._engines._call(self._engines._read, self.id, p)

    async def read_tar(self, path: str) -> bytes:
        """`path` (a file, link or whole directory) as the engine's tar archive: no program of the container runs."""
        return await self._engines._call(self._engines._tar_of, self.id, path)

    @property
    def engines(self) -> TaskContainers:
        """The engine this container runs on (the verifier makes its own containers of the pristine image there)."""
        return self._engines

    async def changes(self) -> list[tuple[str, str]]:
        """(kind, path) of what differs from the image: modified, added, deleted (the engine's `docker diff`)."""
        found = await self._engines._call(self._engines.api.diff, self.id) or []
        # Our pid 1's file, put there before the start. `/` itself is listed changed for it only when nothing else
        # in `/` changed; no check reads `/` alone.
        return [(CHANGE_KINDS.get(c.get("Kind"), "?"), c.get("Path", "")) for c in found if c.get("Path") != INIT_PATH]


class TaskContainers:
    """The engine client and thread pool task containers are made with (an async context)."""

    def __init__(self, config: TaskContainerConfig | None = None, owner: RunOwner | None = None) -> None:
        self.config = config or TaskContainerConfig()
        self.owner = owner or RunOwner.current(uuid.uuid4().hex[:12])
        self._executor: ThreadPoolExecutor | None = None
        self._client: Any = None
        self._info: dict[str, Any] | None = None
        self._storage_quota: bool | None = None
        self._said_unenforced = False
        self._seq = 0
        self._init: bytes | None = None

    async def __aenter__(self) -> TaskContainers:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def api(self) -> Any:
        assert self._client is not None, "start() first"
        return self._client.api

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        assert self._executor is not None, "start() first"
        return await asyncio.get_running_loop().run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def start(self) -> None:
        import docker  # noqa: PLC0415 - only with the docker backend

        self._executor = ThreadPoolExecutor(self.config.engine_threads, thread_name_prefix="task-containers")
        try:
            self._client = await self._call(
                docker.DockerClient, base_url=self.config.engine, version="auto", timeout=self.config.engine_timeout_s
            )
        except docker.errors.DockerException as exc:
            raise TaskContainerError(f"no container engine answers at {self.config.engine} ({exc})") from None
        found = await self._call(self.api.containers, all=True, filters={"label": LABEL_TASK})
        for c in found:
            if owner_gone(c.get("Labels") or {}, self.owner.host, self.owner.pidns):
                await self._remove(c["Id"])

    async def close(self) -> None:
        if self._client is None:
            return
        mine = await self._call(self.api.containers, all=True, filters={"label": f"{LABEL_TASK}={self.owner.run_id}"})
        for c in mine:
            await self._remove(c["Id"])
        client, self._client = self._client, None
        await self._call(client.close)
        assert self._executor is not None
        self._executor.shutdown(wait=False)
        self._executor = None

    async def _remove(self, cid: str) -> None:
        import docker  # noqa: PLC0415

        try:
            await self._call(self.api.remove_container, cid, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:  # another run sweeping the same leftover got there first
            if exc.status_code != 409:
                raise

    async def info(self) -> dict[str, Any]:
        """The engine's `docker info` (asked once)."""
        if self._info is None:
            self._info = await self._call(self.api.info)
        return self._info

    async def storage_quota(self) -> bool:
        """Whether the engine gives containers a size quota (overlay2 needs xfs with pquota)."""
        if self._storage_quota is None:
            info = await self.info()
            status = dict((k, v) for k, v in (info.get("DriverStatus") or []))
            fs = status.get("Backing Filesystem", "")
            self._storage_quota = info.get("Driver") in ("overlay2", "btrfs", "zfs", "devicemapper") and (
                fs in ("xfs", "btrfs", "zfs") or info.get("Driver") in ("btrfs", "zfs", "devicemapper")
            )
        return self._storage_quota

    def _init_tar(self) -> bytes:
        """hermes-spawn as INIT_PATH (root's, 0755), read once."""
        if self._init is None:
            try:
                self._init = _tar({INIT_PATH: (SPAWN_HELPER.read_bytes(), 0o755)})
            except OSError as exc:
                raise TaskContainerError(
                    f"the task containers' init {SPAWN_HELPER} is missing ({exc.strerror}): run `bash scripts/setup.sh`"
                ) from None
        return self._init

    async def _storage_opt(self, spec: TaskContainerSpec, owner: str) -> dict[str, str] | None:
        if spec.storage_mb is None:
            return None
        if await self.storage_quota():
            return {"size": f"{spec.storage_mb}m"}
        if self.config.storage == "refuse":
            raise TaskContainerError(
                f"{owner}: storage_mb = {spec.storage_mb} cannot be enforced by this engine (no per-container "
                "quota: overlay2 needs xfs with pquota); set task_containers.storage unenforced to run it without"
            )
        if not self._said_unenforced:
            self._said_unenforced = True
            log.warning("task storage_mb limits are not enforced: this engine has no per-container quota")
        return None

    @asynccontextmanager
    async def container(self, spec: TaskContainerSpec, owner: str) -> AsyncIterator[TaskContainer]:
        """A started container for one trajectory, removed on exit."""
        import docker  # noqa: PLC0415

        cpus = (await self.info()).get("NCPU") or 0
        if spec.cpus and cpus and spec.cpus > cpus:
            raise TaskContainerError(
                f"{owner}: the task asks for cpus = {spec.cpus:g} and this engine has {cpus}: the limit cannot be "
                f"applied here; run it on an engine with at least {spec.cpus:g} CPUs"
            )
        self._seq += 1
        name = f"hermes-task-{self.owner.run_id}-{self._seq}"
        host_config = self.api.create_host_config(
            network_mode=(self.config.network or "bridge") if spec.network else "none",
            nano_cpus=int(spec.cpus * 1e9) if spec.cpus else None,
            mem_limit=f"{spec.memory_mb}m" if spec.memory_mb else None,
            memswap_limit=f"{spec.memory_mb}m" if spec.memory_mb else None,
            pids_limit=self.config.pids_limit,
            storage_opt=await self._storage_opt(spec, owner),
            security_opt=["no-new-privileges"],
        )
        labels = {**self.config.labels, **self.owner.labels(), LABEL_TASK: self.owner.run_id}
        cid = None
        try:
            try:
                created = await self._call(
                    self.api.create_container,
                    spec.image,
                    name=name,
                    entrypoint=INIT_COMMAND[:1],
                    command=INIT_COMMAND[1:],
                    user=spec.keepalive_user or spec.user or "",
                    working_dir=spec.workdir,
                    environment=spec.env,
                    labels=labels,
                    host_config=host_config,
                )
                cid = created["Id"]
                await self._call(self.api.put_archive, cid, "/", self._init_tar())
                await self._call(self.api.start, cid)
            except docker.errors.APIError as exc:
                raise TaskContainerError(
                    f"{owner}: the engine refused its container: {exc.explanation or exc}"
                ) from None
            box = TaskContainer(self, cid, spec, name)
            probe = await self._exec(
                box, ["sh", "-c", "command -v bash; command -v timeout"], 60, "root", "/", None, 1000
            )
            found = [line for line in probe.output.split("\n") if line.startswith("/")]
            box.bash_path = next((f for f in found if f.endswith("/bash")), "bash")
            box.timeout_path = next((f for f in found if f.endswith("/timeout")), "timeout")
            box.has_timeout = box.timeout_path != "timeout"
            yield box
        finally:
            if cid is not None:
                await asyncio.shield(self._remove(cid))

    async def _exec(
        self,
        box: TaskContainer,
        argv: list[str],
        timeout: float,
        user: str,
        workdir: str | None,
        env: dict[str, str] | None,
        max_output_bytes: int,
    ) -> ExecResult:
        started = time.monotonic()
        exec_id = await self._call(
            self.api.exec_create,
            box.id,
            argv,
            stdout=True,
            stderr=True,
            user=user,
            workdir=workdir or box.spec.workdir,
            environment={**box.spec.env, **(env or {})},
        )
        run = self._call(self.api.exec_start, exec_id["Id"], stream=False, demux=False)
        try:
            output = await asyncio.wait_for(run, timeout + 15)
        except TimeoutError:
            return ExecResult(None, "", timed_out=True, duration_s=time.monotonic() - started)
        info = await self._call(self.api.exec_inspect, exec_id["Id"])
        code = info.get("ExitCode")
        data = output or b""
        truncated = len(data) > max_output_bytes
        text = data[:max_output_bytes].decode("utf-8", errors="replace")
        # `timeout` exits 124 (137 after its -k): the command ran out of time.
        timed_out = box.has_timeout and code in (124, 137) and time.monotonic() - started >= timeout
        return ExecResult(
            None if timed_out else code,
            text,
            timed_out=timed_out,
            truncated=truncated,
            duration_s=time.monotonic() - started,
        )

    def _tar_of(self, cid: str, path: str) -> bytes:
        import docker  # noqa: PLC0415

        try:
            stream, _ = self.api.get_archive(cid, path)
        except docker.errors.NotFound:
            raise FileNotFoundError(path) from None
        return b"".join(stream)

    def _read(self, cid: str, path: str) -> bytes:
        """A file's content (through the archive API: no program of the container runs)."""
        with tarfile.open(fileobj=io.BytesIO(self._tar_of(cid, path))) as tar:
            member = next((m for m in tar.getmembers() if m.isfile()), None)
            if member is None:
                raise IsADirectoryError(path)
            handle = tar.extractfile(member)
            assert handle is not None
            return handle.read()
