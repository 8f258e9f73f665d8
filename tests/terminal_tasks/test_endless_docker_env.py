"""Published Endless Terminals tasks through the env's `evaluate` on the docker backend, on the real engine.

Each container.def task's trajectory runs in a task container of the image its definition builds (%post as root
at build: its users and chowns are the image's; test_initial_state.py checked as root there), then every file
chowned to the publisher's invoking user (the default --env.endless_user invoking), commands as uid/gid 1000 in
/home/user with %environment sourced, and test_final_state.py copied in after the agent and run with the image's
pytest as that user. They are every published task with
a non-empty definition except the three whose own files decide their score (test_endless_images.py's
PUBLISHED_DEFECTS, argued in docs/terminal_tasks.md); seven add users in %post and chown files to them.
The tenth is the generator's Harbor export of a task (fixtures/endless-harbor-published): its image from its
Dockerfile, solve.sh and test.sh as Harbor runs them, test.sh with the image's pytest in place of its uv/CPython
download (--env.bootstrap_tests_with_sandbox_pytest: github.com does not resolve here).
The container.def images share their %post layers with the root images test_endless_images.py builds (same
registry, build cache); both agents' runs here use the same images.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.terminal_tasks import TerminalTasksEnv
from tests.support.cli import run_cli
from tests.support.docker_engine import ENGINE, TEST_LABEL, engine_problem

pytestmark = [pytest.mark.slow, pytest.mark.timeout(5400)]

FIXTURES = Path(__file__).parent / "fixtures" / "endless-published"
TASKS = (
    "task_000000_6eba56f8",
    "task_000000_7c0ad94e",
    "task_000000_7ccae1fb",
    "task_000000_83a2beb5",
    "task_000000_bc36287b",
    "task_000000_c79e7c5d",
    "task_000000_dfbcff7a",
    "task_000000_ebb97dfa",
    "task_000000_f6642236",
)
HARBOR_EXPORT = Path(__file__).parent / "fixtures" / "endless-harbor-published" / "task_000000_659a19e1"
ALL = (*TASKS, HARBOR_EXPORT.name)
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


def test_the_tasks_include_post_sections_that_add_users_and_chown_to_them() -> None:
    adds_and_chowns = []
    for name in TASKS:
        text = (FIXTURES / name / "container.def").read_text()
        post = text.split("%post", 1)[1].split("\n%", 1)[0]
        users = re.findall(r"useradd\s[^\n]*?(\w+)\s*$", post, re.M)
        if users and any(re.search(rf"chown\s+(-R\s+)?{u}\b", post) for u in users):
            adds_and_chowns.append(name)
    assert len(adds_and_chowns) >= 7, adds_and_chowns


def _evaluate(tmp_path: Path, tasks: Path, test_id: str, agent: str, user: str) -> dict[str, float]:
    config = tmp_path / "docker.yaml"
    config.write_text(
        "env:\n  runtime:\n    sandbox:\n      backend:\n        kind: docker\n"
        f"        engine: {ENGINE}\n        pull: never\n        labels: {{{TEST_LABEL}: {test_id}}}\n"
        "        pool: {max_sandboxes: 2}\n        task_storage: unenforced\n"  # the export's storage_mb
    )
    out = tmp_path / agent
    proc = run_cli(
        TerminalTasksEnv,
        "evaluate",
        "--env.agent",
        agent,
        "--env.tasks_dir",
        str(tasks),
        "--env.harbor_runtime",
        "task-container",
        "--env.bootstrap_tests_with_sandbox_pytest",
        "true",
        "--env.image_registry",
        REGISTRY,
        "--env.endless_user",
        user,
        "--config",
        str(config),
        "--env.data_dir_to_save_evals",
        str(out / "eval"),
        "--env.data_path_to_save_groups",
        str(out / "g.jsonl"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"'eval/n': {len(ALL)}" in proc.stdout, proc.stdout[-2000:]
    assert "'eval/tests_bootstrapped_with_sandbox_pytest': 1.0" in proc.stdout, proc.stdout[-2000:]
    assert f"{HARBOR_EXPORT.name}: tests/test.sh runs with the image's pytest" in proc.stderr, proc.stderr[-2000:]
    assert "'eval/infrastructure_failures': 0" in proc.stdout, proc.stdout[-2000:]
    assert "FLAGGED" not in proc.stderr, proc.stderr[-2000:]
    samples = [json.loads(line) for p in (out / "eval").rglob("*.jsonl") for line in p.read_text().splitlines()]
    bootstrapped = [s["item"]["id"] for s in samples if s.get("item", {}).get("tests_bootstrapped_with_sandbox_pytest")]
    assert bootstrapped == [HARBOR_EXPORT.name], bootstrapped
    return {s["item"]["id"]: s["score"] for s in samples if "item" in s}


# invoking: the default, as the publisher ran them; root: the older behaviour, kept by name.
@pytest.mark.parametrize("user", ["invoking", "root"])
def test_published_endless_tasks_oracle_one_noop_zero_through_evaluate(test_id, tmp_path, user):
    tasks = tmp_path / "tasks"
    for name in TASKS:
        shutil.copytree(FIXTURES / name, tasks / name)
    shutil.copytree(HARBOR_EXPORT, tasks / HARBOR_EXPORT.name)
    scores = {agent: _evaluate(tmp_path, tasks, test_id, agent, user) for agent in ("oracle", "noop")}
    assert scores == {"oracle": dict.fromkeys(ALL, 1.0), "noop": dict.fromkeys(ALL, 0.0)}, scores
