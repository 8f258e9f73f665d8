"""The sandbox runtime a container-based backend puts into any image.

A directory, built by `bash scripts/build_sandbox_runtime.sh [DIR]`, that needs nothing of the
image (no Python, package, loader or libc of it; nothing installed into it):

    sandbox-server   static launcher of sandbox_server (same CLI as `python -m sandbox_server`) on the
                     runtime's own Python, loader and libraries (python/, lib/)
    bwrap            static launcher of bubblewrap (libexec/bwrap) on the same loader and libraries
    hermes-spawn     the uid-and-limits helper, static
    hermes-confine.so  the verifier's exec-confining preload library (no libc), bound read-only into slot commands

It is mounted read-only at `RUNTIME_MOUNT` (docker backend) or copied there by an image layer
(Nomad, Modal: the project Dockerfile, terminal tasks' SANDBOX_LAYER). Nothing is unpacked or
written at run time, so $TMPDIR need not allow exec. Slots see none of it (sandbox_server/bundle.py):
their PATH, python3 and tools are the image's own. The image needs bash for commands and util-linux's
setpriv/prlimit (Debian, Ubuntu and their derivatives have them).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sandbox_server.isolation import SlotLimits
from slots.pool import SlotPoolConfig

__all__ = ["RUNTIME_MOUNT", "RUNTIME_FILES", "DEFAULT_RUNTIME_DIR", "SandboxRuntime", "RuntimeMissing"]

RUNTIME_MOUNT = "/opt/hermes"
# Random per-container slot uid bases: above the local backend's pid-derived ones (< 2**28), and
# below the overflow uid range.
UID_BASE_MIN = 2**28
UID_BASE_SLOTS = (2**31 - 2**28) // 256
RUNTIME_FILES = ("sandbox-server", "bwrap", "hermes-spawn", "hermes-confine.so")
DEFAULT_RUNTIME_DIR = Path(__file__).resolve().parents[1] / "build" / "hermes-runtime"


class ContainerBackendConfig(Protocol):
    """What every container backend's config says about the servers it starts."""

    @property
    def pool(self) -> SlotPoolConfig: ...
    @property
    def limits(self) -> SlotLimits: ...
    @property
    def workspace_mount(self) -> str: ...


class RuntimeMissing(FileNotFoundError):
    """The runtime directory lacks a file: it was not built."""


@dataclass(frozen=True)
class SandboxRuntime:
    dir: Path = DEFAULT_RUNTIME_DIR

    def check(self) -> Path:
        """The runtime directory, or a one-line error saying how to build it."""
        missing = [f for f in RUNTIME_FILES if not (self.dir / f).is_file()]
        if missing:
            raise RuntimeMissing(
                f"sandbox runtime at {self.dir} lacks {', '.join(missing)}: "
                f"run `bash scripts/build_sandbox_runtime.sh {self.dir}` (scripts/setup.sh does)"
            )
        return self.dir

    @staticmethod
    def server_argv(
        *,
        port: int | str,
        slots: int,
        data_dir: str,
        limits: SlotLimits,
        workspace_mount: str = "/workspace",
        token_file: str | None = None,
        mount: str = RUNTIME_MOUNT,
        extra: list[str] | None = None,
    ) -> list[str]:
        """The command that starts the frozen sandbox_server inside a container."""
        argv = [f"{mount}/sandbox-server", "--host", "0.0.0.0", "--port", str(port), "--slots", str(slots)]
        argv += ["--data-dir", data_dir, "--bwrap", f"{mount}/bwrap", "--workspace-mount", workspace_mount]
        if limits.uid_base is None:
            # The server's pid (its default uid base) is the same small number in every container,
            # but a uid's process count (RLIMIT_NPROC) is machine-wide: slots of two containers
            # with one uid would share one budget. A random base per server keeps them apart.
            limits = limits.model_copy(update={"uid_base": UID_BASE_MIN + secrets.randbelow(UID_BASE_SLOTS) * 256})
        argv += limits.cli_args()
        if token_file is not None:
            argv += ["--token-file", token_file]
        return argv + list(extra or [])

    @staticmethod
    def container_server_argv(
        config: ContainerBackendConfig, *, port: int | str, data_dir: str, token_file: str | None = None
    ) -> list[str]:
        """`server_argv` as a container backend's `config` sets it up. A task's verifier may run as the
        image's root, as Harbor runs test.sh: root there is the container's, in the command's own namespaces."""
        return SandboxRuntime.server_argv(
            port=port,
            slots=config.pool.slots_per_sandbox,
            data_dir=data_dir,
            limits=config.limits,
            workspace_mount=config.workspace_mount,
            token_file=token_file,
            extra=["--allow-root-commands"],
        )
