"""Tests on a real container engine (Docker; Podman's compatible API started per session).

The fixtures live in tests/support/docker_fixtures.py (tests/security uses them too).
"""

from tests.support.docker_fixtures import (  # noqa: F401 - fixtures
    docker_engine,
    docker_sandbox_image,
    docker_test_id,
    podman_engine,
    podman_test_id,
)
