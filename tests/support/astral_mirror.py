"""astral.sh served on a docker network of its own, for published TB2 test.sh files on a machine where
astral.sh does not resolve: a container named astral.sh (network alias) with a certificate of a CA made
here serves an install.sh that installs uv and uvx from the uv wheel (build/test-cache/uv, fetched once with
pip) as the real installer does ($HOME/.local/bin and its `env` file). The CA, appended to the host's bundle,
is what the docker backend's `ca_bundle` injects into the task images. Used by tests and scripts/tb2_table.py.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.docker_engine import ENGINE, TEST_LABEL, remove_labelled

__all__ = ["AstralMirror", "astral_mirror", "MirrorUnavailable"]


class MirrorUnavailable(RuntimeError):
    """What the mirror needs is missing here (the uv wheel, the base image, openssl)."""


@dataclass(frozen=True)
class AstralMirror:
    network: str
    ca_bundle: Path
    label: str


REPO = Path(__file__).resolve().parents[2]
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
            raise MirrorUnavailable(
                f"no uv {UV_VERSION} wheel in {UV_CACHE} and pip could not fetch it: {got.stderr[-300:]}"
            )
    with zipfile.ZipFile(wheels[0]) as whl:
        return {name: whl.read(f"uv-{UV_VERSION}.data/scripts/{name}") for name in ("uv", "uvx")}


def make_ca(where: Path) -> tuple[Path, Path, Path]:
    """(ca.crt, site.crt, site.key): a CA made here and astral.sh's certificate signed by it; the ones already
    in `where` when all three are there and valid for another day."""
    made = where / "ca.crt", where / "site.crt", where / "site.key"
    if all(p.is_file() for p in made):
        check = ["openssl", "x509", "-checkend", "86400", "-noout", "-in", str(made[0])]
        fresh = subprocess.run(check, capture_output=True, check=False)
        if fresh.returncode == 0:
            return made
    where.mkdir(parents=True, exist_ok=True)

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
        "7",
        "-subj",
        "/CN=hermes-test-ca",
    )
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "site.key", "-out", "site.csr", "-subj", "/CN=astral.sh")
    (where / "ext.cnf").write_text("subjectAltName=DNS:astral.sh\n")
    ssl(
        *("x509", "-req", "-in", "site.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"),
        *("-days", "7", "-extfile", "ext.cnf", "-out", "site.crt"),
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


@contextmanager
def astral_mirror(workdir: Path, engine: str = ENGINE, ca_dir: Path | None = None) -> Iterator[AstralMirror]:
    """astral.sh on a fresh network; everything made is labelled and removed on exit. `ca_dir` keeps the CA
    (and so the bundle's hash in image tags) across runs; by default each mirror makes its own in `workdir`."""
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=120)
    try:
        client.images.get(BASE)
    except docker.errors.ImageNotFound:
        client.close()
        raise MirrorUnavailable(f"{BASE} is not on the engine: run scripts/base_images.sh") from None
    binaries = uv_binaries()
    ca, crt, key = make_ca(ca_dir or workdir)
    host_bundle = os.environ.get("SSL_CERT_FILE")
    bundle = workdir / "bundle.pem"
    bundle.write_bytes((Path(host_bundle).read_bytes() if host_bundle else b"") + b"\n" + ca.read_bytes())
    label = f"astral-mirror-{uuid.uuid4().hex[:8]}"
    network = client.networks.create(f"hermes-test-{label}", labels={TEST_LABEL: label})
    try:
        site = client.containers.create(
            BASE, ["python3", "/srv/server.py"], labels={TEST_LABEL: label}, network=network.name, detach=True
        )
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
        yield AstralMirror(network.name, bundle, label)
    finally:
        remove_labelled(engine, f"{TEST_LABEL}={label}")
        network.remove()
        client.close()
