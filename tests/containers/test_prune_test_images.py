"""scripts/prune_test_images.sh on the real engine: the newest tags of each repository with the prefix stay, older
ones go, and repositories without the prefix are never touched."""

from __future__ import annotations

import io
import subprocess
import tarfile
import time
import uuid

import pytest

from tests.support.docker_engine import engine_problem

pytestmark = pytest.mark.skipif(engine_problem() is not None, reason=str(engine_problem()))

SCRIPT = "scripts/prune_test_images.sh"


def _empty_image(tag: str, n: int) -> None:
    """A distinct one-file image (its own layer and creation time) tagged `tag`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = f"{tag} {n}\n".encode()
        info = tarfile.TarInfo("marker")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    subprocess.run(["docker", "import", "-", tag], input=buf.getvalue(), check=True, capture_output=True)


def _tags(prefix: str) -> set[str]:
    out = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], check=True, capture_output=True, text=True
    ).stdout
    return {line for line in out.split() if line.startswith(prefix)}


def test_prune_keeps_the_newest_tags_per_repository_and_only_under_the_prefix():
    prefix = f"hermes-rl-test-prune-{uuid.uuid4().hex[:8]}"
    other = f"hermes-rl-prunecheck-{uuid.uuid4().hex[:8]}/kept"
    made = (
        [f"{prefix}/a:{i}" for i in range(3)] + [f"{prefix}-b/b:{i}" for i in range(2)] + [f"{other}:0", f"{other}:1"]
    )
    try:
        for i, tag in enumerate(made):
            _empty_image(tag, i)
            time.sleep(1.1)  # the engine lists creation times to the second: each image its own second
        run = subprocess.run(
            ["bash", SCRIPT, "--keep", "1", "--prefix", prefix], capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stderr
        assert "removing 3 stale image tag(s)" in run.stdout
        assert _tags(prefix) == {f"{prefix}/a:2", f"{prefix}-b/b:1"}
        assert _tags(other) == {f"{other}:0", f"{other}:1"}
        bad = subprocess.run(["bash", SCRIPT, "--keep", "two"], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "--keep must be a whole number" in bad.stderr
    finally:
        subprocess.run(["docker", "rmi", "-f", *made], capture_output=True)
