"""Published Endless Terminals tasks through the env's `evaluate` on the docker backend, on the real engine.

Each trajectory runs in a task container of the image its container.def builds (%post as root at build: its
users and chowns are the image's), commands as root in /home/user with %environment sourced, and
test_final_state.py copied in after the agent and run with the image's pytest. The two tasks' %post add users
and chown files (task_000000_6eba56f8: artifactmgr; task_000000_83a2beb5). The images are the ones
test_endless_images.py builds (same registry, same content tags: a session that built them is reused).
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.terminal_tasks import TerminalTasksEnv
from tests.support.cli import run_cli
from tests.support.docker_engine import ENGINE, TEST_LABEL, engine_problem

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

FIXTURES = Path(__file__).parent / "fixtures" / "endless-published"
TASKS = ("task_000000_6eba56f8", "task_000000_83a2beb5")
REGISTRY = "hermes-rl-test-endless"  # test_endless_images.py's


@pytest.fixture
def test_id() -> Iterator[str]:
    """A label value of this test's containers, removed afterwards whatever happened."""
    problem = engine_problem(ENGINE)
    if problem is not None:
        pytest.skip(problem)
    import docker

    value = f"endless-env-{uuid.uuid4().hex[:10]}"
    yield value
    client = docker.DockerClient(base_url=ENGINE, version="auto", timeout=60)
    try:
        for c in client.containers.list(all=True, filters={"label": f"{TEST_LABEL}={value}"}):
            c.remove(force=True)
    finally:
        client.close()


@pytest.mark.parametrize("agent,accuracy", [("oracle", 1.0), ("noop", 0.0)])
def test_endless_tasks_score_in_task_containers_of_their_definitions(test_id, tmp_path, agent, accuracy):
    tasks = tmp_path / "tasks"
    for name in TASKS:
        shutil.copytree(FIXTURES / name, tasks / name)
    config = tmp_path / "docker.yaml"
    config.write_text(
        "env:\n  runtime:\n    sandbox:\n      backend:\n        kind: docker\n"
        f"        engine: {ENGINE}\n        pull: never\n        labels: {{{TEST_LABEL}: {test_id}}}\n"
        "        pool: {max_sandboxes: 1}\n"
    )
    proc = run_cli(
        TerminalTasksEnv,
        "evaluate",
        "--env.agent",
        agent,
        "--env.tasks_dir",
        str(tasks),
        "--env.image_registry",
        REGISTRY,
        "--config",
        str(config),
        "--env.data_dir_to_save_evals",
        str(tmp_path / "eval"),
        "--env.data_path_to_save_groups",
        str(tmp_path / "g.jsonl"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"'eval/accuracy': {accuracy}" in proc.stdout and "'eval/n': 2" in proc.stdout, proc.stdout[-2000:]
    assert "'eval/infrastructure_failures': 0" in proc.stdout, proc.stdout[-2000:]
    assert "FLAGGED" not in proc.stderr, proc.stderr[-2000:]
    samples = [json.loads(line) for p in (tmp_path / "eval").rglob("*.jsonl") for line in p.read_text().splitlines()]
    scores = {s["item"]["id"]: s["score"] for s in samples if "item" in s}
    assert scores == dict.fromkeys(TASKS, accuracy), samples
