"""A published Terminal-Bench 2 task in its own container, as Harbor runs it, on the real docker engine.

fixtures/tb2/sqlite-db-truncate is the task as published (yujianll/skill-usage, terminal-bench-2/): its
Dockerfile starts FROM python:3.13-slim-bookworm (the stand-in scripts/base_images.sh makes), its test.sh
apt-installs curl, fetches uv with `curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh` and runs pytest
through `uvx -p 3.13 -w pytest==8.4.1 ...` (from PyPI, through this machine's TLS proxy).

astral.sh does not resolve here, so the test serves it: a container on the task's network under the name
astral.sh, with a certificate of a CA made here, serving an install.sh that installs uv and uvx from the uv
wheel (build/test-cache/uv) as the real one does ($HOME/.local/bin, plus its `env` file). The CA goes into
the bundle the backend injects (ca_bundle: the host's bundle plus this CA), exactly as the host's proxy CA
does. Oracle 1.0, no-op 0.0.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import uuid
import zipfile
from pathlib import Path

import pytest

from backends.docker import DockerBackendConfig
from environments.terminal_tasks import NoOpAgent, OracleAgent
from slots.pool import SlotPoolConfig
from tests.support.docker_engine import ENGINE, TEST_LABEL, engine_problem, remove_labelled
from tests.terminal_tasks.conftest import make_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "tb2" / "sqlite-db-truncate"
UV_CACHE = REPO / "build" / "test-cache" / "uv"
UV_VERSION = "0.9.5"
BASE = "python:3.13-slim-bookworm"

SERVER = """import functools, http.server, ssl
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/srv/www")
server = http.server.ThreadingHTTPServer(("0.0.0.0", 443), handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/srv/site.crt", "/srv/site.key")
server.socket = ctx.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""

# What astral.sh's installer leaves: uv and uvx in $HOME/.local/bin and an `env` file that puts it on PATH.
INSTALL_SH = f"""#!/bin/sh
set -e
mkdir -p "$HOME/.local/bin"
for b in uv uvx; do
  curl -fsSL "https://astral.sh/uv/{UV_VERSION}/$b" -o "$HOME/.local/bin/$b"
  chmod +x "$HOME/.local/bin/$b"
done
printf 'export PATH="$HOME/.local/bin:$PATH"\\n' > "$HOME/.local/bin/env"
echo "installed uv {UV_VERSION} to $HOME/.local/bin"
"""


def uv_binaries() -> dict[str, bytes]:
    wheels = sorted(UV_CACHE.glob(f"uv-{UV_VERSION}-*manylinux*x86_64*.whl"))
    if not wheels:
        UV_CACHE.mkdir(parents=True, exist_ok=True)
        got = subprocess.run(
            [
                *(str(REPO / ".venv" / "bin" / "python"), "-m", "pip", "download", f"uv=={UV_VERSION}"),
                *("--no-deps", "--only-binary=:all:", "--platform", "manylinux2014_x86_64", "-d", str(UV_CACHE)),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        wheels = sorted(UV_CACHE.glob(f"uv-{UV_VERSION}-*manylinux*x86_64*.whl"))
        if not wheels:
            pytest.skip(f"no uv {UV_VERSION} wheel in {UV_CACHE} and pip could not fetch it: {got.stderr[-300:]}")
    with zipfile.ZipFile(wheels[0]) as whl:
        return {name: whl.read(f"uv-{UV_VERSION}.data/scripts/{name}") for name in ("uv", "uvx")}


def make_ca(where: Path) -> tuple[Path, Path, Path]:
    """(ca.crt, site.crt, site.key): a CA made here and astral.sh's certificate signed by it."""

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    ssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=hermes-test-ca",
    )
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "site.key", "-out", "site.csr", "-subj", "/CN=astral.sh")
    (where / "ext.cnf").write_text("subjectAltName=DNS:astral.sh\n")
    ssl(
        *("x509", "-req", "-in", "site.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"),
        *("-days", "2", "-extfile", "ext.cnf", "-out", "site.crt"),
    )
    return where / "ca.crt", where / "site.crt", where / "site.key"


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def astral(tmp_path):
    """(network, CA bundle path): astral.sh served on a network of this test's own."""
    problem = engine_problem(ENGINE)
    if problem is not None:
        pytest.skip(problem)
    import docker

    client = docker.DockerClient(base_url=ENGINE, version="auto", timeout=120)
    try:
        client.images.get(BASE)
    except docker.errors.ImageNotFound:
        client.close()
        pytest.skip(f"{BASE} is not on the engine: run scripts/base_images.sh")
    binaries = uv_binaries()
    ca, crt, key = make_ca(tmp_path)
    host_bundle = os.environ.get("SSL_CERT_FILE")
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes((Path(host_bundle).read_bytes() if host_bundle else b"") + b"\n" + ca.read_bytes())
    test_id = f"tb2-task-container-{uuid.uuid4().hex[:8]}"
    network = client.networks.create(f"hermes-test-{test_id}", labels={TEST_LABEL: test_id})
    site = client.containers.create(
        BASE,
        ["python3", "/srv/server.py"],
        labels={TEST_LABEL: test_id},
        network=network.name,
        detach=True,
    )
    try:
        network.disconnect(site)
        network.connect(site, aliases=["astral.sh"])
        files = {
            "server.py": (SERVER.encode(), 0o644),
            "site.crt": (crt.read_bytes(), 0o644),
            "site.key": (key.read_bytes(), 0o600),
            f"www/uv/{UV_VERSION}/install.sh": (INSTALL_SH.encode(), 0o644),
            **{f"www/uv/{UV_VERSION}/{n}": (b, 0o755) for n, b in binaries.items()},
        }
        site.put_archive("/srv", _tar(files))
        site.start()
        yield network.name, bundle, test_id
    finally:
        remove_labelled(ENGINE, f"{TEST_LABEL}={test_id}")
        network.remove()
        client.close()


@pytest.mark.parametrize("agent,expected", [("oracle", 1.0), ("noop", 0.0)])
async def test_published_tb2_task_with_curl_and_uvx_scores_in_its_own_container(
    astral, tmp_path, scripted_server, agent, expected
):
    network, bundle, test_id = astral
    shutil.copytree(FIXTURE, tmp_path / "tasks" / FIXTURE.name)
    backend = DockerBackendConfig(
        engine=ENGINE,
        pull="never",
        pool=SlotPoolConfig(slots_per_sandbox=1, min_sandboxes=1, max_sandboxes=1),
        labels={TEST_LABEL: test_id},
        network=network,
        ca_bundle=str(bundle),
        task_storage="unenforced",
    )
    env = make_env(
        scripted_server.base_url,
        tmp_path,
        backend=backend,
        tasks_dir=str(tmp_path / "tasks"),
        image_registry="hermes-rl-test-tb2",
    )
    async with env.runtime():
        await env.setup()
        task = env.by_id[FIXTURE.name]
        model = OracleAgent(env.by_id) if agent == "oracle" else NoOpAgent()
        rollout = await env.rollout(task, model=model)
    assert not rollout.infrastructure_failure, rollout.error
    assert rollout.score == expected, rollout
