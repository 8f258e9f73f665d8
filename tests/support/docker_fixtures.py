"""Pytest fixtures of a real container engine, imported by the conftests that need them
(tests/containers, tests/security), so both share one definition.

`docker_engine` skips a test only when no engine answers. Each test gets its own `docker_test_id`;
every container it makes carries `hermes-rl.test=<id>` and is removed by that label afterwards, so
tests never touch other runs' containers on the same engine.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.docker_engine import (
    ENGINE,
    TEST_LABEL,
    PodmanService,
    SandboxImage,
    engine_problem,
    podman_problem,
    podman_service,
    remove_labelled,
    sandbox_image,
    verifier_image,
)

__all__ = [
    "docker_engine",
    "docker_sandbox_image",
    "docker_verifier_image",
    "docker_test_id",
    "podman_engine",
    "podman_test_id",
]


@pytest.fixture(scope="session")
def docker_engine() -> str:
    problem = engine_problem(ENGINE)
    if problem is not None:
        pytest.skip(problem)
    return ENGINE


@pytest.fixture(scope="session")
def docker_sandbox_image(docker_engine) -> SandboxImage:
    return sandbox_image()


@pytest.fixture(scope="session")
def docker_verifier_image(docker_sandbox_image) -> SandboxImage:
    """The sandbox image's runtime in an image with git, python3 and pytest (a verifier's needs)."""
    return verifier_image(docker_sandbox_image)


@pytest.fixture
def docker_test_id(docker_engine) -> Iterator[str]:
    """A label value unique to this test; its containers are removed afterwards whatever happened."""
    test_id = f"docker-{uuid.uuid4().hex[:10]}"
    yield test_id
    remove_labelled(docker_engine, f"{TEST_LABEL}={test_id}")


@pytest.fixture(scope="session")
def podman_engine(tmp_path_factory) -> Iterator[PodmanService]:
    """Podman's Docker-compatible API service, started for this session on a private socket."""
    problem = podman_problem()
    if problem is not None:
        pytest.skip(problem)
    with podman_service(tmp_path_factory.mktemp("podman")) as service:
        yield service


@pytest.fixture
def podman_test_id(podman_engine) -> Iterator[str]:
    test_id = f"podman-{uuid.uuid4().hex[:10]}"
    yield test_id
    remove_labelled(podman_engine.engine, f"{TEST_LABEL}={test_id}")
