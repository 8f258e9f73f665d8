"""The engine client's read timeout is the config's: one `docker diff` of a container an oracle filled with
packages (caffe-cifar-10: boost, opencv...) took over the client's default 60 s on a loaded engine, and the
trajectory was lost to a ReadTimeout."""

from __future__ import annotations

import pytest

from backends.task_container import TaskContainerConfig, TaskContainers
from tests.support.docker_engine import ENGINE, engine_problem

pytestmark = pytest.mark.skipif(engine_problem() is not None, reason=str(engine_problem()))


async def test_engine_calls_wait_as_long_as_configured() -> None:
    assert TaskContainerConfig().engine_timeout_s >= 300
    async with TaskContainers(TaskContainerConfig(engine=ENGINE, engine_timeout_s=421)) as engines:
        assert engines.api.timeout == 421
