"""Where this server runs from: a normal Python (the local backend) or the self-contained runtime.

The runtime (scripts/build_sandbox_runtime.sh, backends/runtime.py) is a directory with its own
loader, libraries and Python; its `sandbox-server` launcher starts this package with
`-X hermes_runtime=<dir>`. Run from it, the server uses nothing of the image it runs in but
bash and the image's tools for the commands: the slot's exec server is the runtime's static
hermes-spawn (no Python inside the slot), and the slots see the image's own
PATH (its ENV PATH first, then the usual directories) and python3, never ours.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SLOT_PATH", "SYSTEM_PATH", "Runtime", "current_runtime", "image_path", "image_python", "system_program"]

XOPTION = "hermes_runtime"
# The PATH of every slot command, after the local backend's interpreter directory if any.
SLOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Where the programs the server itself starts are found (bash, setpriv, prlimit): never the PATH of
# the image or the slot, which may name a workspace directory (a task's venv or tools under /app)
# where the agent could plant a `bash` that reads every command, the verifier's included.
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def system_program(name: str) -> str | None:
    """`name`'s absolute path in the system directories (SYSTEM_PATH), or None."""
    return shutil.which(name, path=SYSTEM_PATH)


@dataclass(frozen=True)
class Runtime:
    dir: Path
    loader: str  # the dynamic loader's file name in lib/

    @property
    def launcher(self) -> Path:
        return self.dir / "sandbox-server"

    @property
    def spawn_helper(self) -> Path:
        return self.dir / "hermes-spawn"

    @property
    def confine_library(self) -> Path:
        return self.dir / "hermes-confine.so"


def current_runtime() -> Runtime | None:
    """The runtime this process runs from, or None under a normal Python."""
    where = sys._xoptions.get(XOPTION)
    if not isinstance(where, str) or not where:
        return None
    root = Path(where)
    manifest = json.loads((root / "manifest.json").read_text())
    return Runtime(root, manifest["loader"])


def image_path(path: str, runtime: Runtime) -> str | None:
    """The PATH the image sets (its ENV PATH, which the container gives this server), without the
    runtime's own directories; None if it adds nothing to the usual one."""
    usual = SLOT_PATH.split(":")
    own = str(runtime.dir).rstrip("/") + "/"
    dirs = [d for d in path.split(":") if d.startswith("/") and not (d + "/").startswith(own) and d not in usual]
    return ":".join(dict.fromkeys(dirs)) or None


def image_python(path_head: str | None) -> str | None:
    """The image's own python3 (or python) as the slots find it on their PATH; None if it has none."""
    path = f"{path_head}:{SLOT_PATH}" if path_head else SLOT_PATH
    return shutil.which("python3", path=path) or shutil.which("python", path=path)
