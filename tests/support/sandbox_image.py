"""The sandbox image the Nomad/Modal test doubles run: the sandbox runtime under /opt/hermes in debian:bookworm.

Interim until scripts/build_sandbox_runtime.sh (branch h/runtime) makes the frozen runtime: here
/opt/hermes holds what `backends.runtime` promises (`sandbox-server`, `bwrap`, `hermes-spawn`)
as a small launcher over Debian's python3 and bubblewrap, with sandbox_server and its wheels
copied from this venv (same CPython minor as bookworm's). Built once per content (the tag is a
hash of everything copied in), so later sessions reuse it; nothing is pulled from a registry.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import aiohttp
import pydantic

__all__ = ["SANDBOX_IMAGE_REPO", "sandbox_image", "slow_start_image", "task_standin_image", "IMAGE_LABEL"]

ROOT = Path(__file__).resolve().parents[2]
SANDBOX_IMAGE_REPO = "hermes-rl-test-sandbox"
IMAGE_LABEL = "hermes-rl.test-image"  # images are shared by test sessions (content-tagged), never removed by tests
SITE = Path(aiohttp.__file__).resolve().parents[1]
# sandbox_server's imports and theirs (requirements.txt: aiohttp, pydantic).
PACKAGES = (
    "aiohttp aiohappyeyeballs aiosignal attr attrs frozenlist multidict propcache yarl idna "
    "pydantic pydantic_core annotated_types typing_inspection typing_extensions.py"
).split()

DOCKERFILE = f"""FROM debian:bookworm
RUN apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 bubblewrap git \\
    && rm -rf /var/lib/apt/lists/*
COPY opt /opt/hermes
LABEL {IMAGE_LABEL}=1
"""

LAUNCHER = """#!/bin/sh
# backends.runtime's `sandbox-server`: the same CLI as `python -m sandbox_server`.
PYTHONPATH=/opt/hermes/lib PYTHONUNBUFFERED=1 exec python3 -m sandbox_server "$@"
"""


def _context(out: Path) -> None:
    opt = out / "opt"
    lib = opt / "lib"
    lib.mkdir(parents=True)
    shutil.copytree(ROOT / "sandbox_server", lib / "sandbox_server", ignore=shutil.ignore_patterns("__pycache__"))
    for name in PACKAGES:
        src = SITE / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(
            src, lib / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if src.is_dir() else {})
        )
    spawn = ROOT / "sandbox_server" / "hermes-spawn"
    if not spawn.is_file():
        raise FileNotFoundError(f"{spawn} is not built: run `bash sandbox_server/build_spawn_helper.sh {spawn}`")
    shutil.copy2(spawn, opt / "hermes-spawn")
    (opt / "sandbox-server").write_text(LAUNCHER)
    (opt / "sandbox-server").chmod(0o755)
    (opt / "bwrap").symlink_to("/usr/bin/bwrap")
    (out / "Dockerfile").write_text(DOCKERFILE)


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path.relative_to(root)).encode())
        if path.is_symlink():
            h.update(str(path.readlink()).encode())
        elif path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _has(client, tag: str) -> bool:
    import docker  # noqa: PLC0415 - a test dependency, imported where the engine is used

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def sandbox_image(client) -> str:
    """The content tag of the sandbox image, built on first use (a few minutes: apt in debian:bookworm)."""
    if sys.version_info[:2] != (3, 11):
        raise RuntimeError("the interim sandbox image copies this venv's cp311 wheels: run the tests with Python 3.11")
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp)
        _context(ctx)
        tag = f"{SANDBOX_IMAGE_REPO}:{_digest(ctx)}"
        if not _has(client, tag):
            # The CLI, not the SDK: its build context keeps the symlink as a symlink.
            subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True)
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
    """`base` plus pytest: what the doubles' stand-in registry serves for a task's image (its verifier runs pytest)."""
    tag = f"{base.replace(':', '-task:')}"
    if not _has(client, tag):
        _build_dockerfile(
            client,
            f"FROM {base}\nRUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
            "--no-install-recommends python3-pytest && rm -rf /var/lib/apt/lists/*\n",
            tag,
        )
    return tag


def slow_start_image(client, base: str, delay_s: int) -> str:
    """`base` whose entrypoint waits `delay_s` before running the command: a server that listens late."""
    tag = f"{base.replace(':', '-slow:')}-{delay_s}"
    if not _has(client, tag):
        _build_dockerfile(
            client, f'FROM {base}\nENTRYPOINT ["/bin/sh", "-c", "sleep {delay_s}; exec \\"$@\\"", "--"]\n', tag
        )
    return tag


_ = pydantic  # imported so PACKAGES is known to exist in this venv
