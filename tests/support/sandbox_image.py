"""The sandbox image the Nomad/Modal test doubles run: the project's Dockerfile, built on the real engine.

That Dockerfile is what Modal builds (`Image.from_dockerfile`) and what a Nomad operator pushes:
debian:bookworm (made offline by scripts/base_images.sh) plus the sandbox runtime copied to
/opt/hermes (backends/runtime.py, built by scripts/build_sandbox_runtime.sh if missing). Tagged by
the hash of the Dockerfile and the runtime's manifest, so later sessions reuse it; nothing is pulled.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

from backends.runtime import DEFAULT_RUNTIME_DIR, RuntimeMissing, SandboxRuntime

__all__ = [
    "SANDBOX_IMAGE_REPO",
    "sandbox_image",
    "slow_start_image",
    "task_standin_image",
    "with_runtime_layer",
    "IMAGE_LABEL",
]

ROOT = Path(__file__).resolve().parents[2]
SANDBOX_IMAGE_REPO = "hermes-rl-test-sandbox"
IMAGE_LABEL = "hermes-rl.test-image"  # images are shared by test sessions (content-tagged), never removed by tests


def _has(client, tag: str) -> bool:
    import docker  # noqa: PLC0415 - a test dependency, imported where the engine is used

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def sandbox_image(client) -> str:
    """The content tag of the project's sandbox image, built on first use."""
    try:
        runtime = SandboxRuntime().check()
    except RuntimeMissing:
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "build_sandbox_runtime.sh"), str(DEFAULT_RUNTIME_DIR)], check=True
        )
        runtime = SandboxRuntime().check()
    digest = hashlib.sha256((ROOT / "Dockerfile").read_bytes() + (runtime / "manifest.json").read_bytes())
    tag = f"{SANDBOX_IMAGE_REPO}:{digest.hexdigest()[:16]}"
    if not _has(client, tag):
        # The CLI: it honours .dockerignore (the context is the runtime only).
        subprocess.run(
            [
                "docker",
                "build",
                "-q",
                "--label",
                f"{IMAGE_LABEL}=1",
                "-t",
                tag,
                "-f",
                str(ROOT / "Dockerfile"),
                str(ROOT),
            ],
            check=True,
            capture_output=True,
        )
    return tag


def _build_dockerfile(client, dockerfile: str, tag: str) -> None:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile.encode())
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    data.seek(0)
    client.images.build(fileobj=data, custom_context=True, tag=tag, labels={IMAGE_LABEL: "1"}, rm=True)


def task_standin_image(client, base: str) -> str:
    """`base` plus python3 and pytest: what the doubles' stand-in registry serves for a task's image (its verifier
    runs pytest; the task images themselves are built and run on the docker backend's tests)."""
    tag = f"{base.replace(':', '-task:')}"
    if not _has(client, tag):
        _build_dockerfile(
            client,
            f"FROM {base}\nRUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
            "--no-install-recommends python3 python3-pytest && rm -rf /var/lib/apt/lists/*\n",
            tag,
        )
    return tag


def with_runtime_layer(client, base: str, runtime_dir: Path) -> str:
    """`base` plus the sandbox layer (environments/terminal_tasks/sandboxes.py SANDBOX_LAYER, the runtime at
    /opt/hermes): what a user pushes for Nomad and what Modal builds from a registry image plus the runtime.
    Tagged by the base image's id and the runtime's manifest, so later sessions reuse it."""
    from environments.terminal_tasks.sandboxes import SANDBOX_LAYER  # noqa: PLC0415 - the layer as written

    base_id = client.images.get(base).id
    digest = hashlib.sha256(base_id.encode() + (runtime_dir / "manifest.json").read_bytes()).hexdigest()[:16]
    tag = f"hermes-rl-test/with-runtime:{digest}"
    if not _has(client, tag):
        dockerfile = f"FROM {base}\n{SANDBOX_LAYER}"
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            tar.add(runtime_dir, arcname="hermes_runtime")
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(dockerfile.encode())
            tar.addfile(info, io.BytesIO(dockerfile.encode()))
        data.seek(0)
        client.images.build(fileobj=data, custom_context=True, tag=tag, labels={IMAGE_LABEL: "1"}, rm=True)
    return tag


def slow_start_image(client, base: str, delay_s: int) -> str:
    """`base` whose sandbox-server waits `delay_s` before it starts: a server that listens late.

    The wrapper replaces the command itself (not an ENTRYPOINT), so it delays the same way whether the
    platform keeps the image's entrypoint (Nomad's docker driver) or not."""
    tag = f"{base.replace(':', '-slow:')}-cmd{delay_s}"
    if not _has(client, tag):
        server = "/opt/hermes/sandbox-server"
        wrapper = rf'#!/bin/sh\nsleep {delay_s}\nexec {server}.real "$@"\n'  # printf turns \n into newlines
        dockerfile = (
            f"FROM {base}\nRUN mv {server} {server}.real && printf '{wrapper}' > {server} && chmod 755 {server}\n"
        )
        _build_dockerfile(client, dockerfile, tag)
    return tag
