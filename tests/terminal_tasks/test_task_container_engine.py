"""The engine client's read timeout is the config's: one `docker diff` of a container an oracle filled with
packages (caffe-cifar-10: boost, opencv...) took over the client's default 60 s on a loaded engine, and the
trajectory was lost to a ReadTimeout."""

from __future__ import annotations

import pytest

from backends.task_container import TaskContainerConfig, TaskContainers
from tests.support.docker_engine import ENGINE, engine_problem, labelled_task_containers

pytestmark = pytest.mark.skipif(engine_problem() is not None, reason=str(engine_problem()))


async def test_engine_calls_wait_as_long_as_configured() -> None:
    assert TaskContainerConfig().engine_timeout_s >= 300
    async with TaskContainers(TaskContainerConfig(engine=ENGINE, engine_timeout_s=421)) as engines:
        assert engines.api.timeout == 421


async def test_more_cpus_than_the_engine_has_is_refused_in_one_line() -> None:
    """mcmc-sampling-stan asks for more CPUs than a 2-core machine has: refused before any container, one line."""
    from backends.task_container import LABEL_TASK, TaskContainerError, TaskContainerSpec

    async with labelled_task_containers("cpus") as engines:
        have = (await engines.info())["NCPU"]
        spec = TaskContainerSpec(image="debian:bookworm", workdir="/", cpus=have + 2)
        with pytest.raises(TaskContainerError) as info:
            async with engines.container(spec, "many-cpus"):
                pass
        message = str(info.value)
        assert f"cpus = {have + 2}" in message and f"this engine has {have}" in message and "\n" not in message
        mine = {"label": f"{LABEL_TASK}={engines.owner.run_id}"}
        assert not await engines._call(engines.api.containers, all=True, filters=mine)  # none was made
