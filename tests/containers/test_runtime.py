"""The self-contained sandbox runtime in images that have neither our Python nor bubblewrap.

On the real Docker engine: `debian:bookworm` (minbase, no python at all) and an ubuntu:22.04 image
with only apt's python3 (3.10, which sandbox_server itself could not run on) host a real
sandbox_server from build/hermes-runtime mounted read-only at /opt/hermes, reached through the
real SlotPool and SandboxClient. Slots run confined, see the image's toolchain and nothing of
ours, and the container's filesystem shows nothing installed into the image.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import shutil
import struct
import subprocess
import uuid
from pathlib import Path

import pytest

from backends import container_seccomp
from backends.runtime import RUNTIME_MOUNT, SandboxRuntime
from sandbox_server.__main__ import TOKEN_ENV
from sandbox_server.isolation import SlotLimits
from slots.client import SandboxAddress
from slots.pool import SlotPool, SlotPoolConfig

REPO = Path(__file__).resolve().parents[2]
LABEL = "hermes-rl.test"
BASE = "debian:bookworm"  # scripts/base_images.sh: minbase, no python
# What the server needs in a container (the Dockerfile's header): namespaces, loopback in a command's
# own network namespace, the watchdog's view of slot processes; the seccomp profile goes in as a file.
CONFINE = ["--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--cap-add", "SYS_PTRACE"]
PY310_DOCKERFILE = f"""FROM ubuntu:22.04
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \\
    && rm -rf /var/lib/apt/lists/*
LABEL {LABEL}=runtime
"""


def _docker(*args: str, stdin: str | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(["docker", *args], input=stdin, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:2])} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


async def _adocker(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "docker", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:2])} failed: {err.decode().strip()}")
    return out.decode().strip()


@pytest.fixture(scope="session")
def engine() -> None:
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI: run scripts/setup.sh (docker.io)")
    try:
        subprocess.run(["docker", "version"], capture_output=True, timeout=30, check=True)
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"no Docker engine answers ({exc}): start it with scripts/start_docker.sh")
    for image in (BASE, "ubuntu:22.04"):
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
            pytest.fail(f"base image {image} missing: run scripts/base_images.sh")


@pytest.fixture(scope="session")
def runtime_dir() -> Path:
    """build/hermes-runtime as the sources are now: the script returns at once when nothing changed."""
    runtime = SandboxRuntime()
    subprocess.run(["bash", str(REPO / "scripts" / "build_sandbox_runtime.sh"), str(runtime.dir)], check=True)
    return runtime.check()


@pytest.fixture(scope="session")
def py310_image(engine) -> str:
    """ubuntu:22.04 with apt's python3 only: built once, tagged by its Dockerfile's content."""
    tag = f"hermes-rl-test/ubuntu-python3:{hashlib.sha256(PY310_DOCKERFILE.encode()).hexdigest()[:12]}"
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode != 0:
        _docker("build", "-q", "-t", tag, "-", stdin=PY310_DOCKERFILE, timeout=900)
    return tag


class DockerRunProvider:
    """Sandboxes as `docker run` of `image` with the runtime mounted read-only (or, `runtime_dir` None,
    the image's own command with the token in its environment); only its own containers go."""

    def __init__(self, image: str, runtime_dir: Path | None, scratch: Path, env: tuple[str, ...] = ()) -> None:
        self.image, self.runtime_dir, self.scratch, self.env = image, runtime_dir, scratch, env
        self.label = f"{LABEL}=runtime-{uuid.uuid4().hex[:10]}"
        self.containers: list[str] = []

    async def start(self) -> None:
        pass

    async def launch(self, count: int) -> list[SandboxAddress]:
        out = []
        for _ in range(count):
            token = secrets.token_hex(16)
            if self.runtime_dir is None:
                run = ["-e", f"{TOKEN_ENV}={token}", self.image]
            else:
                token_file = self.scratch / f"token-{uuid.uuid4().hex[:8]}"
                token_file.write_text(token)
                argv = SandboxRuntime.server_argv(
                    port=8080, slots=2, data_dir="/var/lib/hermes-sandbox", limits=SlotLimits(), token_file="/run/token"
                )
                run = ["-v", f"{self.runtime_dir}:{RUNTIME_MOUNT}:ro", "-v", f"{token_file}:/run/token:ro", self.image]
                run += argv
            seccomp = self.scratch / "seccomp.json"
            seccomp.write_text(json.dumps(container_seccomp.profile()))
            cid = await _adocker(
                "run",
                "-d",
                "--label",
                self.label,
                *CONFINE,
                "--security-opt",
                f"seccomp={seccomp}",
                "--tmpfs",
                "/tmp",
                "-p",
                "127.0.0.1::8080",
                *self.env,
                *run,
            )
            self.containers.append(cid)
            port = (await _adocker("port", cid, "8080/tcp")).splitlines()[0].rsplit(":", 1)[1]
            out.append(SandboxAddress(cid, f"http://127.0.0.1:{port}", token))
        return out

    async def alive(self, address: SandboxAddress) -> bool:
        return await _adocker("inspect", "-f", "{{.State.Running}}", address.name) == "true"

    async def terminate(self, address: SandboxAddress) -> None:
        await _adocker("rm", "-f", address.name)

    async def stop(self) -> None:
        for cid in self.containers:
            await _adocker("rm", "-f", cid)
        self.containers.clear()


async def _pool(
    image: str, runtime_dir: Path, scratch: Path, env: tuple[str, ...]
) -> tuple[SlotPool, DockerRunProvider]:
    provider = DockerRunProvider(image, runtime_dir, scratch, env)
    pool = SlotPool(provider, SlotPoolConfig(slots_per_sandbox=2, min_sandboxes=1, max_sandboxes=1))
    await pool.start()
    return pool, provider


def _elf_interpreter(path: Path) -> bytes | None:
    """The PT_INTERP (dynamic loader) an ELF64 executable asks for; None for a static one."""
    data = path.read_bytes()
    assert data[:5] == b"\x7fELF\x02", f"{path} is not an ELF64 executable"
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 0x20)[0], *struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP
            return data[p_offset : p_offset + p_filesz].rstrip(b"\0")
    return None


CONFINEMENT = r"""
echo "uid=$(id -u)"
echo "runtime=[$(ls -A /opt/hermes /.hermes-runtime 2>&1 | tr '\n' ' ')]"
for p in /usr/hermes-probe /etc/hermes-probe /opt/hermes-probe /hermes-probe /var/hermes-probe; do
  (echo x > "$p") 2>/dev/null && echo "wrote $p"
done
echo ok > "$HOME/inside" && echo "workspace=$(cat "$HOME/inside")"
echo "path=$PATH"
echo "python3=$(command -v python3 || echo none)"
echo "helper=$(command -v apt-helper || echo none)"
echo "parent=$(tr '\0' ' ' < /proc/$PPID/cmdline)"
"""


@pytest.mark.parametrize("which", ["debian-no-python", "ubuntu-python3.10"])
async def test_slots_in_a_foreign_image_are_confined_and_see_only_the_image(
    which, engine, runtime_dir, py310_image, tmp_path
):
    image = BASE if which == "debian-no-python" else py310_image
    # As an image's `ENV PATH=...` would: its own directory first (and one of ours, which slots never get).
    path = f"/usr/lib/apt:{RUNTIME_MOUNT}/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    pool, provider = await _pool(image, runtime_dir, tmp_path, ("-e", f"PATH={path}"))
    try:
        health = await pool.client(pool.slots()[0]).health()
        assert health["isolation"]["available"], health["isolation"]
        assert health["enforced"]["command_start"] == "hermes-spawn"
        async with pool.trajectory("runtime") as ex:
            res = await ex.exec(CONFINEMENT, timeout=60, max_output_bytes=10_000)
            assert res.exit_code == 0, res.output
            lines = dict(line.split("=", 1) for line in res.output.splitlines() if "=" in line)
            assert int(lines["uid"]) >= 1000, res.output
            # /opt/hermes is covered, and the exec server (a static binary) mounts no copy of the runtime: nothing of ours shows.
            assert "No such file" in lines["runtime"] and "sandbox-server" not in lines["runtime"], res.output
            assert "wrote" not in res.output, res.output
            assert lines["workspace"] == "ok"
            assert RUNTIME_MOUNT not in lines["path"] and ".hermes" not in lines["path"]
            assert lines["path"].startswith("/usr/lib/apt:") and lines["helper"] == "/usr/lib/apt/apt-helper"
            # Started by the slot's exec server (hermes-spawn --serve; not a bwrap per command), no Python of ours.
            assert lines["parent"].startswith("/.hermes-spawn --serve "), res.output
            if which == "debian-no-python":
                assert lines["python3"] == "none", res.output
                assert health["python"] is None
                # The python tool says plainly there is no interpreter.
                res = await ex.exec(ex.python, timeout=30, max_output_bytes=10_000, stdin="print(1)")
                assert res.exit_code == 127 and "no python3" in res.output, res.output
            else:
                assert lines["python3"] == "/usr/bin/python3", res.output
                assert health["python"] == "/usr/bin/python3"
                res = await ex.exec("python3 --version", timeout=30, max_output_bytes=1000)
                assert res.output.startswith("Python 3.10."), res.output
                # The python tool's interpreter is the image's: 3.10, none of our packages.
                program = "import sys, importlib.util as u\nprint(sys.version_info[:2], sys.executable, u.find_spec('aiohttp'))"
                res = await ex.exec(ex.python, timeout=30, max_output_bytes=1000, stdin=program)
                assert res.exit_code == 0 and res.output.strip() == "(3, 10) /usr/bin/python3 None", res.output
        # Nothing went into the image: the only change under /usr /etc /opt is the mount point itself.
        [cid] = provider.containers
        changed = [line.split(" ", 1)[1] for line in _docker("diff", cid).splitlines()]
        into_image = [p for p in changed if p.split("/")[1] in ("usr", "etc", "opt", "bin", "lib", "sbin")]
        assert sorted(into_image) == ["/opt", RUNTIME_MOUNT], changed
    finally:
        await pool.stop()


async def test_the_runtime_needs_nothing_of_the_image(engine, runtime_dir):
    """Its launchers are static and it brings its own loader and libc: it runs with an empty PATH and no /usr."""
    for path in ("sandbox-server", "bwrap", "hermes-spawn"):
        assert _elf_interpreter(runtime_dir / path) is None, f"{path} needs the image's dynamic loader"
    manifest = json.loads((runtime_dir / "manifest.json").read_text())
    out = _docker(
        "run", "--rm", "--label", f"{LABEL}=runtime-{uuid.uuid4().hex[:10]}", "-e", "PATH=",
        "-v", f"{runtime_dir}:{RUNTIME_MOUNT}:ro", "--tmpfs", "/usr",
        BASE, f"{RUNTIME_MOUNT}/sandbox-server", "--help",
    )  # fmt: skip
    assert "--data-dir" in out
    assert manifest["python"].startswith("3.11")


async def test_the_project_dockerfile_is_the_base_plus_the_runtime(engine, runtime_dir, tmp_path):
    """The Nomad/Modal image builds here from debian:bookworm; its server takes the token from its
    environment and re-execs through the runtime's launcher without it."""
    tag = f"hermes-rl-test/project-sandbox:{uuid.uuid4().hex[:10]}"
    _docker("build", "-q", "-t", tag, "--label", f"{LABEL}=runtime", str(REPO), timeout=600)
    try:
        provider = DockerRunProvider(tag, None, tmp_path)
        pool = SlotPool(provider, SlotPoolConfig(slots_per_sandbox=8, min_sandboxes=1, max_sandboxes=1))
        await pool.start()
        try:
            health = await pool.client(pool.slots()[0]).health()
            assert health["isolation"]["available"] and health["python"] is None, health
            [cid] = provider.containers
            token = pool.sandboxes[0].token
            environ = _docker("exec", cid, "cat", f"/proc/{health['pid']}/environ")
            assert TOKEN_ENV not in environ and token not in environ
            async with pool.trajectory("project-image") as ex:
                res = await ex.exec("id -u", timeout=30, max_output_bytes=100)
                assert res.exit_code == 0 and int(res.output) >= 1000, res.output
        finally:
            await pool.stop()
    finally:
        _docker("rmi", tag)
