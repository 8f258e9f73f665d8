"""Shared fixtures of tests on a real container engine (Docker here; Podman's compatible API too).

`docker_engine` skips a test only when no engine answers. Each test gets its own `docker_test_id`;
every container it makes carries `hermes-rl.test=<id>` and is removed by that label afterwards, so
tests never touch other runs' containers on the same engine.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.docker_engine import ENGINE, TEST_LABEL, SandboxImage, engine_problem, sandbox_image


@pytest.fixture(scope="session")
def docker_engine() -> str:
    problem = engine_problem(ENGINE)
    if problem is not None:
        pytest.skip(problem)
    return ENGINE


@pytest.fixture(scope="session")
def docker_sandbox_image(docker_engine, tmp_path_factory) -> SandboxImage:
    return sandbox_image(tmp_path_factory.mktemp("docker-runtime"))


@pytest.fixture
def docker_test_id(docker_engine) -> Iterator[str]:
    """A label value unique to this test; its containers are removed afterwards whatever happened."""
    import docker

    test_id = f"docker-{uuid.uuid4().hex[:10]}"
    yield test_id
    client = docker.DockerClient(base_url=docker_engine, version="auto", timeout=60)
    try:
        for c in client.containers.list(all=True, filters={"label": f"{TEST_LABEL}={test_id}"}):
            c.remove(force=True)
    finally:
        client.close()
