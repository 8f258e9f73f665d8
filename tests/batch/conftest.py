"""A local multi-node Ray cluster for the --ray tests; a real container engine for the docker one."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from ray.cluster_utils import Cluster

from tests.support.docker_fixtures import docker_engine, docker_sandbox_image, docker_test_id  # noqa: F401 - fixtures

NODE = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024}
# Ray rewrites a 127.0.0.1 cluster address to the machine's outward IP, where these raylets do not
# listen; this Ray setting (meant for one-machine clusters) keeps the driver on the loopback too.
DRIVER_ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head that runs no workers (0 CPUs) and two 1-CPU worker nodes: one worker actor on each."""
    c = Cluster(
        initialize_head=True,
        head_node_args={
            **NODE,
            "num_cpus": 0,
            "include_dashboard": False,
            # Notice a killed node within seconds rather than Ray's default ~30 s.
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4},
        },
    )
    try:
        for _ in range(2):
            c.add_node(**NODE, num_cpus=1)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()
