"""One slot pool per image, made on first use: what terminal tasks and SWE-smith rows run in.

On a container backend (docker, Nomad, Modal) an item names the image its commands must see
(a terminal task's `docker_image` or Dockerfile, a SWE-smith row's `image_name`) as an
`ImageRecipe`; its trajectory gets a slot of the pool for that image, created with the backend
config's `image` set to it. The local backend has no images: one pool per workspace mount (the
slot's workspace appears where the item expects it, e.g. /app).

On the docker backend a recipe is resolved on the engine itself (`DockerImages`): the named
image when the engine has it or (unless the backend's pull policy is `never`) can pull it, else the image built from the recipe's Dockerfile and context
under a content-addressed tag (reused when present), within the recipe's build timeout. The
sandbox runtime is mounted into the container by the backend (backends/runtime.py), so nothing
is added to the image. A build that fails or times out loses that item's rollouts to
infrastructure (the error names the item), never scores them 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import re
import tarfile
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from backends import BackendConfig, make_backend
from backends.task_container import TaskContainerConfig, TaskContainers
from environments.sandbox_backend import SandboxToolBackendConfig
from slots.executor import ExecPolicy, SlotExecutor
from slots.pool import SlotPool

__all__ = ["ImageRecipe", "ImageSandboxes", "ImageUnavailable", "DockerImages", "content_tag", "IMAGE_LABEL"]

log = logging.getLogger(__name__)

# Every image this module builds carries it (value: the item's name), so a sweep finds only ours.
IMAGE_LABEL = "hermes-rl.image-of"


class ImageUnavailable(RuntimeError):
    """An item's image could not be had (missing, build failed or timed out): its rollouts are lost, not scored."""


class ImageRecipe(BaseModel, frozen=True):
    """Where an item's image comes from: a named image, else a Dockerfile built in its context."""

    owner: str = Field(..., description="The task or instance it is for (named in every error)")
    name: str | None = Field(None, description="A prebuilt image (docker_image, image_name), used when present")
    dockerfile: str | None = Field(None, description="Dockerfile text to build when `name` is absent")
    context_dir: Path | None = Field(None, description="The build context (COPY sources)")
    tag: str | None = Field(None, description="Content-addressed tag of the build (`content_tag`)")
    build_timeout_s: float = Field(600.0, gt=0, description="Longest a build may take")
    registry_image: str | None = Field(
        None, description="What Nomad/Modal run instead (the recipe plus the sandbox layer, pushed by the user)"
    )
    carries_ca: bool = Field(
        False, description="The recipe gives the host's CA bundle to its build steps itself (an Apptainer %post)"
    )

    @property
    def key(self) -> str:
        """What names the image before it is resolved (the pool's key on backends that take it as is)."""
        return self.registry_image or self.name or self.tag or self.owner


def content_tag(repository: str, dockerfile: str, context_dir: Path | None, *extra: bytes) -> str:
    """`repository:<sha256 of the recipe, its context's files and extra>`: same content, same tag."""
    h = hashlib.sha256(dockerfile.encode())
    for blob in extra:
        h.update(blob)
    if context_dir is not None and context_dir.is_dir():
        for p in sorted(context_dir.rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(context_dir)).encode() + b"\0" + p.read_bytes())
    return f"{repository}:{h.hexdigest()[:12]}"


# Where the host's CA bundle goes in an image built here, and the variables that make the usual clients
# (OpenSSL, pip/requests, curl, uv, node, git) trust it. Set after every FROM, so each stage's RUN has them.
CA_FILE = "/usr/local/share/ca-certificates/hermes-host-ca.crt"
CA_CONTEXT_NAME = "hermes-host-ca.crt"
CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO")
_FROM = re.compile(r"^\s*FROM\s", re.I)


def with_ca(dockerfile: str) -> str:
    """`dockerfile` with the host CA bundle copied in and trusted right after each FROM."""
    env = " ".join(f"{k}={CA_FILE}" for k in CA_ENV)
    out, continued = [], False
    for line in dockerfile.splitlines():
        out.append(line)
        if _FROM.match(line) and not continued:
            out += [f"COPY {CA_CONTEXT_NAME} {CA_FILE}", f"ENV {env}"]
        continued = line.rstrip().endswith("\\")
    return "\n".join(out) + "\n"


def _context_tar(recipe: ImageRecipe, ca_bundle: bytes | None = None) -> bytes:
    """The build context as a tar, its Dockerfile replaced by the recipe's text (and the CA bundle, if given)."""
    assert recipe.dockerfile is not None
    dockerfile = with_ca(recipe.dockerfile) if ca_bundle is not None else recipe.dockerfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        if recipe.context_dir is not None and recipe.context_dir.is_dir():
            for p in sorted(recipe.context_dir.rglob("*")):
                rel = str(p.relative_to(recipe.context_dir))
                if rel != "Dockerfile":
                    tar.add(p, arcname=rel, recursive=False)
        extra = {"Dockerfile": dockerfile.encode()}
        if ca_bundle is not None:
            extra[CA_CONTEXT_NAME] = ca_bundle
        for name, data in extra.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# A failed build's log lines that name a need of this machine's network, not of the task: (pattern, cause).
_INFRASTRUCTURE = (
    (
        re.compile(
            r"pull access denied|manifest unknown|failed to resolve reference|repository does not exist|"
            r"not found: manifest|toomanyrequests|registry-1\.docker\.io",
            re.I,
        ),
        "its base image is not on the engine and no registry answers",
    ),
    (
        re.compile(
            r"Could not resolve host:? *([\w.-]+)|Failed to resolve '([\w.-]+)'|"
            r"Temporary failure in name resolution|Name or service not known|getaddrinfo failed",
            re.I,
        ),
        "a host it downloads from does not resolve here",
    ),
    (
        re.compile(
            r"CERTIFICATE_VERIFY_FAILED|self[- ]signed certificate|certificate verify failed|"
            r"unable to get local issuer",
            re.I,
        ),
        "TLS to a download host is not trusted (give the proxy's CA: backend ca_bundle)",
    ),
    (
        re.compile(r"Network is unreachable|Connection timed out|Connection refused", re.I),
        "a host it downloads from is not reachable here",
    ),
)


def infrastructure_cause(log_text: str) -> str | None:
    """`infrastructure: <cause>` when a build log shows a need this machine's network cannot meet."""
    for pattern, cause in _INFRASTRUCTURE:
        m = pattern.search(log_text)
        if m:
            host = next((g for g in m.groups() if g), None) if m.groups() else None
            return f"infrastructure: {cause}" + (f" ({host})" if host else "")
    return None


class DockerImages:
    """Resolves recipes to images on one Docker (or Podman) engine; each tag is built at most once at a time."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        labels: dict[str, str] | None = None,
        pull: bool = False,
        ca_bundle: bytes | None = None,
        proxy: dict[str, str] | None = None,
    ) -> None:
        self.base_url = base_url
        self.labels = dict(labels or {})
        self.pull = pull  # try pulling a named image the engine lacks before building (the backend's pull policy)
        self.ca_bundle = ca_bundle  # the host's CA bundle, put into every image built here (with_ca)
        self.proxy = dict(proxy or {})  # HTTP(S)_PROXY/NO_PROXY: Docker's predefined build args
        self._locks: dict[str, asyncio.Lock] = {}
        self._known: dict[str, str] = {}
        self._failed: dict[str, ImageUnavailable] = {}
        # Engine calls block: a few threads of their own, so a slow build never holds the loop.
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="docker-images")

    def _client(self, timeout: float = 60) -> Any:
        import docker  # noqa: PLC0415 - only with the docker backend

        if self.base_url:
            return docker.DockerClient(base_url=self.base_url, version="auto", timeout=int(timeout))
        return docker.from_env(version="auto", timeout=int(timeout))

    def _exists(self, name: str) -> bool:
        import docker.errors  # noqa: PLC0415

        client = self._client()
        try:
            client.images.get(name)
            return True
        except docker.errors.ImageNotFound:
            return False
        finally:
            client.close()

    def _pulled(self, name: str) -> bool:
        """Whether `name` could be pulled (a registry that has it); False, with the reason logged, otherwise."""
        client = self._client(timeout=1800)
        try:
            client.images.pull(name)
            return True
        except Exception as exc:  # noqa: BLE001 - no registry, no such image, no credentials: build instead
            log.warning("could not pull %s (%s); building its Dockerfile instead", name, exc)
            return False
        finally:
            client.close()

    def tag_of(self, recipe: ImageRecipe) -> str:
        """The tag a recipe is built under here: its content tag, plus the CA bundle's hash when one goes in."""
        assert recipe.tag is not None
        if self.ca_bundle is None or recipe.carries_ca:
            return recipe.tag
        return f"{recipe.tag}-ca{hashlib.sha256(self.ca_bundle).hexdigest()[:8]}"

    async def _build(self, recipe: ImageRecipe, tag: str) -> None:
        """`docker build` (the engine's classic builder, context on stdin) as a child process of ours.

        A process, not an API call in a thread: on the build timeout it is killed, the engine sees its client
        gone and cancels the build, and nothing is left waiting on the engine's stream.
        """
        argv = ["docker"] + (["-H", self.base_url] if self.base_url else [])
        argv += ["build", "--rm", "--force-rm", "-t", tag]
        for k, v in {**self.labels, IMAGE_LABEL: recipe.owner}.items():
            argv += ["--label", f"{k}={v}"]
        for k, v in self.proxy.items():
            argv += ["--build-arg", f"{k}={v}"]
        argv.append("-")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DOCKER_BUILDKIT": "0", "HOME": "/nonexistent"}
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            context = await asyncio.get_running_loop().run_in_executor(
                self._executor, _context_tar, recipe, None if recipe.carries_ca else self.ca_bundle
            )
            out, _ = await asyncio.wait_for(proc.communicate(context), recipe.build_timeout_s)
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        if proc.returncode != 0:
            text = out.decode(errors="replace")
            tail = "\n".join(line for line in text.splitlines() if line.strip())[-3000:]
            cause = infrastructure_cause(text)
            head = f"{cause}: " if cause else ""
            raise ImageUnavailable(f"{recipe.owner}: {head}building its image failed (exit {proc.returncode})\n{tail}")

    async def resolve(self, recipe: ImageRecipe) -> str:
        """The local image to run `recipe` in: its named image if the engine has it, else the (cached) build."""
        key = recipe.name or recipe.tag or recipe.owner
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key in self._known:
                return self._known[key]
            if key in self._failed:  # one failed build per run, not one per rollout of the item
                raise self._failed[key]
            try:
                image = await self._resolve(recipe)
            except ImageUnavailable as exc:
                self._failed[key] = exc
                raise
            self._known[key] = image
            return image

    async def _resolve(self, recipe: ImageRecipe) -> str:
        loop = asyncio.get_running_loop()
        name = recipe.name
        if name is not None and await loop.run_in_executor(self._executor, self._exists, name):
            return name
        if name is not None and self.pull and await loop.run_in_executor(self._executor, self._pulled, name):
            return name
        if recipe.dockerfile is None or recipe.tag is None:
            how = "could not be pulled" if self.pull else "is not pulled (pull: never)"
            raise ImageUnavailable(
                f"{recipe.owner}: image {recipe.name} is not on the docker engine, {how}, and there is no "
                "Dockerfile to build; load or build it first (`docker image ls`)"
            )
        tag = self.tag_of(recipe)
        if await loop.run_in_executor(self._executor, self._exists, tag):
            return tag
        try:
            await self._build(recipe, tag)
        except TimeoutError:
            raise ImageUnavailable(
                f"{recipe.owner}: building its image took longer than build_timeout_sec = {recipe.build_timeout_s:g} "
                "(the build was cancelled); raise it in task.toml or build the image beforehand"
            ) from None
        except OSError as exc:  # no docker CLI
            raise ImageUnavailable(f"{recipe.owner}: cannot run `docker build` ({exc})") from exc
        return tag

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:60] or "item"


class ImageSandboxes:
    """A `ToolBackend` whose trajectories run in a slot of the pool for their item's image (or workspace, local)."""

    def __init__(
        self,
        config: SandboxToolBackendConfig,
        factory: Callable[[BackendConfig], SlotPool] = make_backend,
        images: DockerImages | None = None,
    ) -> None:
        self.config = config
        self.factory = factory
        self.pools: dict[tuple[str, str | None], SlotPool] = {}
        self._lock = asyncio.Lock()
        backend = config.resolved_backend()
        if images is None and backend.kind == "docker":
            images = DockerImages(
                getattr(backend, "engine", None),
                labels=getattr(backend, "labels", None),
                pull=getattr(backend, "pull", "never") != "never",
                ca_bundle=backend.ca_bundle_bytes(),
                proxy=getattr(backend, "build_proxy", None),
            )
        self.images = images
        self._task_containers: TaskContainers | None = None

    @property
    def per_image(self) -> bool:
        return self.config.backend.in_containers

    @property
    def builds_images(self) -> bool:
        """The backend runs images from this machine's engine, so recipes are resolved (and built) here."""
        return self.images is not None

    async def start(self) -> None:
        pass  # pools start on first use

    async def stop(self) -> None:
        pools, self.pools = list(self.pools.values()), {}
        await asyncio.gather(*(p.stop() for p in pools), return_exceptions=True)
        if self._task_containers is not None:
            engines, self._task_containers = self._task_containers, None
            await engines.close()
        if self.images is not None:
            self.images.close()

    def _config_for(self, image: str, workspace: str | None) -> BackendConfig:
        backend = self.config.resolved_backend()
        suffix = hashlib.sha1(f"{image}\0{workspace}".encode()).hexdigest()[:8]
        update: dict[str, object] = {"image": image}
        if workspace is not None and "workspace_mount" in type(backend).model_fields:
            update["workspace_mount"] = workspace
        for name in ("job_id", "pool_name", "name_prefix"):  # Nomad jobs, Modal tags, docker names: one set per pool
            if name in type(backend).model_fields:
                update[name] = f"{getattr(backend, name)}-{suffix}"
        # Validated, not copied: the backend's own checks apply to the item's image (Nomad refuses unpinned tags).
        return type(backend).model_validate({**backend.model_dump(), **update})

    async def image_for(self, recipe: ImageRecipe | str) -> str:
        """The image a pool for `recipe` is created with on this backend."""
        if isinstance(recipe, str):
            return recipe
        if self.images is not None:
            return await self.images.resolve(recipe)
        if recipe.registry_image is None and recipe.name is None:
            raise ImageUnavailable(f"{recipe.owner}: no image to run on {self.config.backend.kind}")
        return recipe.registry_image or recipe.name or ""

    @property
    def gives_task_containers(self) -> bool:
        """A container per trajectory of the item's own image (backends/task_container.py): docker only."""
        return self.config.backend.kind == "docker"

    async def task_containers(self) -> TaskContainers:
        """The docker engine's task containers (started on first use, stopped with this backend)."""
        async with self._lock:
            if self._task_containers is None:
                backend = self.config.resolved_backend()
                engines = TaskContainers(
                    TaskContainerConfig(
                        engine=getattr(backend, "engine", TaskContainerConfig().engine),
                        storage=getattr(backend, "task_storage", "refuse"),
                        labels=getattr(backend, "labels", {}),
                        network=getattr(backend, "network", None),
                    )
                )
                await engines.start()
                self._task_containers = engines
        return self._task_containers

    async def _pool(self, image: str | None, workspace: str | None) -> SlotPool:
        key = (image or "", workspace)
        async with self._lock:
            pool = self.pools.get(key)
            if pool is None:
                backend = self.config.resolved_backend()
                if image is not None:
                    try:
                        config = self._config_for(image, workspace)
                    except ValidationError as exc:
                        why = exc.errors()[0]["msg"].removeprefix("Value error, ")
                        raise ImageUnavailable(f"image {image} on the {backend.kind} backend: {why}") from None
                else:
                    config = backend.model_copy(update={"workspace_mount": workspace})
                pool = self.factory(config)
                await pool.start()
                self.pools[key] = pool
        return pool

    @asynccontextmanager
    async def trajectory(
        self,
        task_id: str,
        image: ImageRecipe | str | None = None,
        workspace: str | None = None,
        policy: ExecPolicy | None = None,
    ) -> AsyncIterator[SlotExecutor]:
        """A slot of the pool for `image` (container backends) or with its workspace at `workspace` (local).

        `workspace` on a container backend: where the slot's workspace appears (the pool's servers'
        `--workspace-mount`); `policy`: the item's network and environment for every command of the trajectory.
        """
        if self.per_image and image is None:
            raise ValueError(f"an item on the {self.config.backend.kind} backend needs its image")
        if self.per_image:
            assert image is not None
            pool = await self._pool(await self.image_for(image), workspace)
        else:
            default_mount = getattr(self.config.resolved_backend(), "workspace_mount", "/workspace")
            pool = await self._pool(None, workspace or default_mount)
        async with pool.trajectory(task_id, policy) as executor:
            yield executor
