"""Reward integrity of an Endless Terminals task in its task container (docs/security.md).

The agent is the invoking user (uid 1000, the default `endless_user`), owning every file of the container its
final-state test later runs in: it can change what root could. Each attack is played without solving
the task (its honest score is 0) and tries to make test_final_state.py pass anyway: every one must score 0.
The task is a published one (task_000000_6eba56f8, its %post installs pytest with pip3); its image is the one
test_endless_images.py builds (same content tag).
"""

from __future__ import annotations

import asyncio
import os
import shlex
from pathlib import Path

import pytest

from backends.task_container import TaskContainers
from environments.image_sandboxes import DockerImages
from environments.terminal_tasks.agents import sampled_solution_script
from environments.terminal_tasks.container_run import (
    command_prefix,
    endless_pytest,
    task_container,
    task_spec,
    verify_in_container,
)
from environments.terminal_tasks.endless import load_endless_task
from environments.terminal_tasks.sandboxes import endless_recipe
from tests.support.docker_engine import ENGINE, TEST_LABEL, engine_problem, labelled_task_containers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(engine_problem() is not None, reason=str(engine_problem())),
]

TASK_DIR = Path(__file__).parent / "fixtures" / "endless-published" / "task_000000_6eba56f8"
REGISTRY = "hermes-rl-test-endless"  # test_endless_images.py's

# A pytest that reports success whatever it is asked to run.
FAKE_PYTEST = shlex.quote("import sys; print('1 passed'); sys.exit(0)")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    path = os.environ.get("SSL_CERT_FILE")  # %post's `pip3 install pytest` behind this machine's TLS proxy
    ca = Path(path).read_bytes() if path and Path(path).is_file() else None
    recipe = endless_recipe(load_endless_task(TASK_DIR), REGISTRY, tmp_path_factory.mktemp("ctx"), ca_bundle=ca)
    images = DockerImages(ENGINE, labels={TEST_LABEL: "endless-images"})
    try:
        return asyncio.run(images.resolve(recipe))
    finally:
        images.close()


@pytest.fixture
async def engines():
    async with labelled_task_containers("endless-integrity") as e:
        yield e


async def run(engines: TaskContainers, image: str, *commands: str):
    task = load_endless_task(TASK_DIR)
    async with task_container(engines, task_spec(task, image, network=False), task.id, command_prefix(task)) as ex:
        for command in commands:
            result = await ex.exec(command, timeout=600, max_output_bytes=100_000)
            assert result.exit_code == 0, result.output
        return await verify_in_container(ex, task)


async def test_oracle_scores_one_noop_zero(engines, image):
    task = load_endless_task(TASK_DIR)
    solved = await run(engines, image, sampled_solution_script(task, task.workdir))
    assert (solved.reward, solved.flags) == (1.0, []), solved
    nothing = await run(engines, image)
    assert (nothing.reward, nothing.flags) == (0.0, []), nothing


@pytest.mark.parametrize(
    "attack",
    [
        # the image's interpreter replaced
        "cp /usr/bin/python3 /usr/bin/python3.real && printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/python3",
        # the %environment every test command sources, given a PYTHONPATH with a fake pytest
        f"mkdir -p /opt/evil/pytest && printf %s {FAKE_PYTEST} > /opt/evil/pytest/__main__.py && "
        "touch /opt/evil/pytest/__init__.py && "
        "echo 'export PYTHONPATH=/opt/evil' >> /.singularity.d/env/90-environment.sh",
        # a fake pytest package in the directory the tests start from (python3 -m puts it first on sys.path)
        f"mkdir -p /home/user/pytest && printf %s {FAKE_PYTEST} > /home/user/pytest/__main__.py && "
        "touch /home/user/pytest/__init__.py",
        # an ini file above the tests' directory: collect only, nothing runs, exit 0
        "printf '[pytest]\\naddopts = --collect-only\\n' > /pytest.ini",
        # a conftest.py above the tests' directory that turns every failure into success
        "printf 'def pytest_sessionfinish(session, exitstatus):\\n    session.exitstatus = 0\\n' > /conftest.py",
        # a login shell's profile that ends the verifier's shell with success before pytest runs
        "echo 'exit 0' >> /root/.profile",
        "echo 'exit 0' > /etc/profile.d/zz-done.sh",
    ],
    ids=["python3", "environment", "cwd-pytest", "ini", "conftest", "root-profile", "etc-profile"],
)
async def test_root_agent_tampering_scores_zero(engines, image, attack, request):
    verdict = await run(engines, image, attack)
    assert verdict.reward == 0.0, verdict
    if request.node.callspec.id in ("python3", "environment"):  # changes the engine's diff shows: flagged too
        assert verdict.flags, verdict


async def test_initial_state_test_runs_in_the_container_as_the_final_one(engines, image):
    task = load_endless_task(TASK_DIR)
    assert task.initial_test is not None
    async with task_container(engines, task_spec(task, image, network=False), task.id, command_prefix(task)) as ex:
        fresh = await endless_pytest(ex, task, task.initial_test)
        listing = await ex.exec("ls /tests 2>&1; true", timeout=60, max_output_bytes=10_000)
        # The built image is the state the task was written against; its test leaves nothing for the agent.
        assert (fresh.reward, fresh.reason) == (1.0, "test_initial_state.py: pytest exit 0"), fresh
        assert "No such file" in listing.output, listing.output
        broken = await ex.exec("touch /home/user/artifacts/permissions_log.txt", timeout=60, max_output_bytes=10_000)
        assert broken.exit_code == 0, broken.output
        assert (await endless_pytest(ex, task, task.initial_test)).reward == 0.0


def _left_running(script: str) -> str:
    """`script` detached from the agent's command (own session, no terminal), still running after it."""
    return f"nohup setsid bash -c {shlex.quote(script)} >/dev/null 2>&1 < /dev/null & sleep 0.5"


@pytest.mark.parametrize(
    "script",
    [
        # once the final test is copied in, the %environment the verifier sources ends its shell with success
        "while [ ! -e /tests ]; do sleep 0.005; done; echo 'exit 0' >> /.singularity.d/env/90-environment.sh",
        # once the final test is copied in, python3 (uid 1000's, as every file here) reports success
        "while [ ! -e /tests ]; do sleep 0.005; done; rm -f /usr/bin/python3 && "
        "printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/python3 && chmod +x /usr/bin/python3",
    ],
    ids=["environment", "python3"],
)
async def test_a_process_the_agent_left_running_cannot_change_the_final_test_run(engines, image, script):
    """The engine's diff is taken before the final test; what the agent left running acts after it. It is stopped
    before the diff (the final test checks the state the agent left, not its processes)."""
    verdict = await run(engines, image, _left_running(script))
    assert verdict.reward == 0.0, verdict
