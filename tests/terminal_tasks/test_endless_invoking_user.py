"""Who an Endless Terminals task runs as in its docker task container: the publisher's invoking user by default.

The publisher ran its tasks under Apptainer without setuid (docs/terminal_tasks.md): the agent and the final test
ran as uid/gid 1000 (`ec2-user`) with every file of the image appearing as that user's, `/etc/hosts` bound from
the host and not writable, while the generator checked test_initial_state.py as (fake) root on the owners `%post`
set. A task whose final test checks that the file the agent writes is the invoking user's, and that /etc/hosts
is not writable, so scores 1 here as at the publisher's; with `--env.endless_user root` (the older behaviour,
kept by name) the same commands score 0.

The task reuses the published task_000000_6eba56f8's container.def (so its %post layers come from the build cache
test_endless_images.py fills) with its own tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from environments.terminal_tasks import TerminalTasksEnv

from environments.image_sandboxes import DockerImages
from environments.terminal_tasks.apptainer import EndlessUser
from environments.terminal_tasks.container_run import (
    command_prefix,
    initial_state_from_build,
    task_container,
    task_spec,
    verify_in_container,
)
from environments.terminal_tasks.endless import load_endless_task
from environments.terminal_tasks.sandboxes import endless_recipe
from tools.executor import FileOpError
from tests.support.cli import run_cli
from tests.support.docker_engine import ENGINE, TEST_LABEL, engine_problem, remove_labelled, labelled_task_containers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(engine_problem() is not None, reason=str(engine_problem())),
]

PUBLISHED = Path(__file__).parent / "fixtures" / "endless-published" / "task_000000_6eba56f8"
REGISTRY = "hermes-rl-test-endless"  # test_endless_images.py's

# Run by the generator before any agent: as root, on the owners %post set (artifactmgr is uid 1000 there).
INITIAL_TEST = """\
import os, pwd

def test_checked_as_root_on_the_owners_post_set():
    assert os.getuid() == 0
    assert os.stat("/usr/bin").st_uid == 0
    assert os.stat("/home/user").st_uid == pwd.getpwnam("artifactmgr").pw_uid == 1000
    assert not os.path.exists("/home/user/report.txt")
"""
FINAL_TEST = """\
import os

def test_the_report_is_the_invoking_users():
    st = os.stat("/home/user/report.txt")
    assert open("/home/user/report.txt").read() == "done\\n"
    assert (st.st_uid, st.st_gid) == (1000, 1000)

def test_hosts_is_not_writable():
    assert not os.access("/etc/hosts", os.W_OK)
"""
# What a model does: writes the report, and tries to add a host entry (refused at the publisher's).
AGENT = "echo done > /home/user/report.txt; echo '10.0.0.1 artifacts' >> /etc/hosts; echo hosts-exit=$?"


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("owner-task") / "endless-owner-check"
    d.mkdir()
    shutil.copy(PUBLISHED / "container.def", d / "container.def")
    (d / "task.json").write_text(json.dumps({"name": "endless-owner-check", "description": "Write report.txt."}))
    (d / "test_initial_state.py").write_text(INITIAL_TEST)
    (d / "test_final_state.py").write_text(FINAL_TEST)
    (d / "solution").mkdir()
    (d / "solution" / "solve.sh").write_text(AGENT + "\n")  # the oracle: the model's commands above
    return d


def _build(task_dir: Path, user: EndlessUser, context: Path) -> str:
    path = os.environ.get("SSL_CERT_FILE")  # %post's `pip3 install pytest` behind this machine's TLS proxy
    ca = Path(path).read_bytes() if path and Path(path).is_file() else None
    recipe = endless_recipe(load_endless_task(task_dir), REGISTRY, context, ca_bundle=ca, endless_user=user)
    images = DockerImages(ENGINE, labels={TEST_LABEL: "endless-images"})
    try:
        return asyncio.run(images.resolve(recipe))
    finally:
        images.close()


@pytest.fixture(scope="module")
def images(task_dir, tmp_path_factory) -> dict[str, str]:
    return {u: _build(task_dir, u, tmp_path_factory.mktemp(u)) for u in ("invoking", "root")}


@pytest.fixture
async def engines():
    async with labelled_task_containers("endless-user") as e:
        yield e


async def _trajectory(engines, task_dir: Path, image: str, user: EndlessUser, *commands: str):
    task = load_endless_task(task_dir)
    spec = task_spec(task, image, network=False, endless_user=user)
    async with task_container(engines, spec, task.id, command_prefix(task)) as ex:
        initial = await initial_state_from_build(ex)
        outputs = [(await ex.exec(c, timeout=120, max_output_bytes=20_000)).output for c in commands]
        return initial, outputs, await verify_in_container(ex, task)


async def test_invoking_user_scores_as_at_the_publisher(engines, task_dir, images):
    probe = (
        "id -u; id -g; id -un; echo HOME=$HOME; getent passwd ec2-user; "
        "stat -c %u:%g / /usr/bin/python3 /home/user /home/user/artifacts /var/log; "
        "su -c true root </dev/null >/dev/null 2>&1; echo su-exit=$?"
    )
    initial, (agent, seen), verdict = await _trajectory(engines, task_dir, images["invoking"], "invoking", AGENT, probe)
    # The initial state was checked at build, as root on %post's owners, and is gone before the agent.
    assert initial is not None and initial.reward == 1.0, initial
    assert "Permission denied" in agent and "hosts-exit=1" in agent, agent
    lines = seen.split("\n")
    # uid 1000's name is the image's own account (useradd in %post) before the appended ec2-user entry.
    assert lines[:4] == ["1000", "1000", "artifactmgr", "HOME=/home/user"], seen
    assert lines[4] == "ec2-user:x:1000:1000:EC2 Default User:/home/ec2-user:/bin/bash", seen
    assert lines[5:10] == ["1000:1000"] * 5, seen
    assert "su-exit=0" not in seen, seen
    assert verdict.reward == 1.0, verdict.log


async def test_root_flag_keeps_the_older_semantics(engines, task_dir, images):
    initial, (agent, who), verdict = await _trajectory(engines, task_dir, images["root"], "root", AGENT, "id -u")
    assert initial is None  # a root image is checked in the container instead
    assert "hosts-exit=0" in agent and who.strip() == "0", (agent, who)
    assert verdict.reward == 0.0, verdict.log  # the report is root's, /etc/hosts writable


async def test_file_tool_writes_as_the_invoking_user(engines, task_dir, images):
    """The agent's file tool writes as the user its commands run as: owned by it, refused where it may not write."""
    task = load_endless_task(task_dir)
    spec = task_spec(task, images["invoking"], network=False)
    async with task_container(engines, spec, task.id, command_prefix(task)) as ex:
        await ex.write_file("notes/a.txt", b"x\n")
        owner = await ex.exec("stat -c %u:%g notes notes/a.txt; cat notes/a.txt", timeout=60, max_output_bytes=1000)
        assert owner.output.split() == ["1000:1000", "1000:1000", "x"], owner.output
        with pytest.raises(FileOpError, match="/etc/hosts"):
            await ex.write_file("/etc/hosts", b"10.0.0.1 artifacts\n")
        assert b"artifacts" not in await ex.read_file("/etc/hosts")


async def test_noop_scores_zero_as_the_invoking_user(engines, task_dir, images):
    _, _, verdict = await _trajectory(engines, task_dir, images["invoking"], "invoking")
    assert verdict.reward == 0.0, verdict.log


@pytest.mark.parametrize(("user", "score"), [(None, 1.0), ("root", 0.0)], ids=["default-invoking", "flag-root"])
def test_evaluate_scores_the_task_as_the_publisher_unless_the_root_flag(task_dir, images, tmp_path, user, score):
    """Through the env's `evaluate` (image build, initial check, oracle, final test): the default scores the oracle
    as at the publisher's; `--env.endless_user root` is the older behaviour, named."""
    label = f"endless-user-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "docker.yaml"
    config.write_text(
        "env:\n  runtime:\n    sandbox:\n      backend:\n        kind: docker\n"
        f"        engine: {ENGINE}\n        pull: never\n        labels: {{{TEST_LABEL}: {label}}}\n"
    )
    flag = ["--env.endless_user", user] if user else []
    try:
        proc = run_cli(
            TerminalTasksEnv,
            "evaluate",
            "--env.agent",
            "oracle",
            "--env.tasks_dir",
            str(task_dir.parent),
            "--env.image_registry",
            REGISTRY,
            "--config",
            str(config),
            "--env.data_dir_to_save_evals",
            str(tmp_path / "eval"),
            "--env.data_path_to_save_groups",
            str(tmp_path / "g.jsonl"),
            *flag,
        )
    finally:
        remove_labelled(ENGINE, f"{TEST_LABEL}={label}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'eval/n': 1" in proc.stdout and "'eval/infrastructure_failures': 0" in proc.stdout, proc.stdout[-2000:]
    samples = [json.loads(line) for p in (tmp_path / "eval").rglob("*.jsonl") for line in p.read_text().splitlines()]
    assert [s["score"] for s in samples if "item" in s] == [score], samples
