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

import shutil
from pathlib import Path

import pytest

from backends.docker import DockerBackendConfig
from environments.terminal_tasks import NoOpAgent, OracleAgent
from slots.pool import SlotPoolConfig
from tests.support.astral_mirror import MirrorUnavailable, astral_mirror
from tests.support.docker_engine import ENGINE, TEST_LABEL, engine_problem
from tests.terminal_tasks.conftest import make_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

FIXTURE = Path(__file__).parent / "fixtures" / "tb2" / "sqlite-db-truncate"


@pytest.fixture
def astral(tmp_path):
    """(network, CA bundle path, label): astral.sh served on a network of this test's own."""
    problem = engine_problem(ENGINE)
    if problem is not None:
        pytest.skip(problem)
    try:
        with astral_mirror(tmp_path) as mirror:
            yield mirror.network, mirror.ca_bundle, mirror.label
    except MirrorUnavailable as exc:
        pytest.skip(str(exc))


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
        harbor_runtime="task-container",
    )
    async with env.runtime():
        await env.setup()
        task = env.by_id[FIXTURE.name]
        model = OracleAgent(env.by_id) if agent == "oracle" else NoOpAgent()
        rollout = await env.rollout(task, model=model)
    assert not rollout.infrastructure_failure, rollout.error
    assert rollout.score == expected, rollout
