"""Terminal tasks in their own images on the docker backend, on the real engine.

The fixtures (fixtures/tb2-images) are Terminal-Bench 2 tasks as published: task.toml, instruction.md,
environment/Dockerfile, solution/solve.sh, tests/test.sh writing /logs/verifier/reward.txt. Their
Dockerfiles start FROM ubuntu:22.04 / debian:bookworm (offline stand-ins made by scripts/base_images.sh)
and apt-get install expect, screen and gnucobol; their tests grade with those tools. Their docker_image
is not on the engine, so each runs in the image built from its Dockerfile: built once (content tag,
reused by later sessions) by the session fixture, found by the env under the same tag.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.image_sandboxes import IMAGE_LABEL, DockerImages, ImageRecipe, ImageSandboxes, ImageUnavailable
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.terminal_tasks import OracleAgent, TerminalTasksEnv
from environments.terminal_tasks.harbor import load_harbor_task
from environments.terminal_tasks.sandboxes import task_recipe
from slots.executor import ExecPolicy
from slots.pool import SlotPoolConfig
from tests.security.conftest import play
from tests.support.cli import run_cli
from tests.support.docker_engine import ENGINE, TEST_LABEL, engine_problem, sandbox_image
from tests.terminal_tasks.conftest import make_env
from tests.terminal_tasks.test_guard_killed import guard_killer_task

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

FIXTURES = Path(__file__).parent / "fixtures" / "tb2-images"
TASKS = ("expect-login", "screen-worker", "cobol-hello")
REGISTRY = "hermes-rl-test-tasks"


@pytest.fixture(scope="session")
def engine() -> str:
    problem = engine_problem(ENGINE)
    if problem is not None:
        pytest.skip(problem)
    sandbox_image()  # the runtime the backend mounts, built or brought up to date (cached by its inputs)
    return ENGINE


@pytest.fixture(scope="session")
def task_images(engine) -> dict[str, str]:
    """The fixture tasks' images, built from their Dockerfiles once (content tags: a later session reuses them)."""

    async def build() -> dict[str, str]:
        images = DockerImages(engine, labels={TEST_LABEL: "terminal-task-images"})
        try:
            out = {}
            for name in TASKS:
                out[name] = await images.resolve(task_recipe(load_harbor_task(FIXTURES / name), REGISTRY))
            return out
        finally:
            images.close()

    return asyncio.run(build())


@pytest.fixture
def test_id(engine) -> Iterator[str]:
    """A label value of this test's containers, removed afterwards whatever happened."""
    import docker

    value = f"termimg-{uuid.uuid4().hex[:10]}"
    yield value
    client = docker.DockerClient(base_url=engine, version="auto", timeout=60)
    try:
        for c in client.containers.list(all=True, filters={"label": f"{TEST_LABEL}={value}"}):
            c.remove(force=True)
    finally:
        client.close()


def _remove_images(engine: str, label: str) -> None:
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=60)
    try:
        for image in client.images.list(filters={"label": label}):
            client.images.remove(image.id, force=True)
    finally:
        client.close()


def _backend_config(test_id: str, path: Path) -> list[str]:
    """The docker backend as a user gives it (--config YAML), its containers labelled with this test's id."""
    path.write_text(
        "env:\n  runtime:\n    sandbox:\n      backend:\n        kind: docker\n"
        f"        engine: {ENGINE}\n        pull: never\n        labels: {{{TEST_LABEL}: {test_id}}}\n"
        "        pool: {max_sandboxes: 1}\n"
        # Harbor tasks run in task containers here; this engine (overlay2 on ext4) has no storage quota.
        "        task_storage: unenforced\n"
    )
    return ["--config", str(path)]


def _docker_config(test_id: str, **fields):
    from backends.docker import DockerBackendConfig

    pool = SlotPoolConfig(slots_per_sandbox=2, min_sandboxes=1, max_sandboxes=1, health_interval_s=30)
    fields.setdefault("labels", {TEST_LABEL: test_id})
    return DockerBackendConfig(engine=ENGINE, pull="never", pool=pool, **fields)


async def _oracle_on_docker(scripted_server, tmp_path, test_id, names: list[str]) -> dict[str, tuple]:
    """{task: (error, score)} of the oracle (the hostile agent's work) on each task under tmp_path/tasks,
    in docker, one at a time: one task's loop must not take the CPU another's stray needs to be on time."""
    env = make_env(
        scripted_server.base_url,
        tmp_path,
        backend=_docker_config(test_id),
        tasks_dir=str(tmp_path / "tasks"),
        image_registry="hermes-rl-test-root-guard",
    )
    results = {}
    async with env.runtime():
        await env.setup()
        for name in names:
            rollout = await env.rollout(env.by_id[name], model=OracleAgent(env.by_id))
            results[name] = (rollout.error, rollout.score)
    return results


@pytest.mark.parametrize("agent,accuracy", [("oracle", 1.0), ("noop", 0.0)])
def test_tb2_tasks_installing_packages_score_in_their_own_images(task_images, test_id, tmp_path, agent, accuracy):
    """evaluate on the docker backend: oracle 1.0 and no-op 0.0 on each task, each in a task container of its own
    image (root, writable: the tasks' apt-installed tools are there), as Harbor runs them."""
    proc = run_cli(
        TerminalTasksEnv,
        "evaluate",
        "--env.agent",
        agent,
        "--env.tasks_dir",
        str(FIXTURES),
        "--env.image_registry",
        REGISTRY,
        *_backend_config(test_id, tmp_path / "docker.yaml"),
        "--env.data_dir_to_save_evals",
        str(tmp_path / "eval"),
        "--env.data_path_to_save_groups",
        str(tmp_path / "g.jsonl"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"'eval/accuracy': {accuracy}" in proc.stdout and "'eval/n': 3" in proc.stdout, proc.stdout[-2000:]
    assert "'eval/infrastructure_failures': 0" in proc.stdout
    samples = [json.loads(line) for p in (tmp_path / "eval").rglob("*.jsonl") for line in p.read_text().splitlines()]
    scores = {s["item"]["id"]: s["score"] for s in samples if "item" in s}
    assert scores == dict.fromkeys(TASKS, accuracy), samples


async def test_an_ubuntu_2204_image_with_python_310_only_hosts_slots_and_tools_never_get_root(task_images, test_id):
    task = load_harbor_task(FIXTURES / "expect-login")
    sandboxes = ImageSandboxes(SandboxToolBackendConfig(backend=_docker_config(test_id)))
    policy = ExecPolicy(verifier_as_root=True, verifier_network=False)
    try:
        async with sandboxes.trajectory(
            "t", image=task_recipe(task, REGISTRY), workspace="/app", policy=policy
        ) as executor:
            probe = await executor.exec(
                "python3 --version; ls /usr/bin /usr/local/bin | grep -E '^python3\\.[0-9]+$'; "
                "command -v expect; id -u; pwd",
                timeout=60,
                max_output_bytes=10_000,
            )
            # A hostile policy asks every tool for root; only the env's verifier call runs as root.
            asks = {"as_root": True, "user": "root", "root": True, "sudo": True, "privileged": True}
            messages = await play(
                executor,
                [
                    [("terminal", {"command": "id -u", **asks})],
                    [("python", {"code": "import os; print('uid', os.getuid())", **asks})],
                    [("terminal", {"command": "touch /etc/hermes-root-was-here; echo rc=$?", **asks})],
                ],
            )
            verifier = await executor.verify_exec(
                "id -u; touch /etc/x 2>/dev/null; echo rc=$?; tail -n +3 /proc/net/dev",
                timeout=60,
                max_output_bytes=10_000,
            )
        (pool,) = sandboxes.pools.values()
        images = {a.name for a in pool.sandboxes}
    finally:
        await sandboxes.stop()
    lines = probe.output.split("\n")
    assert probe.exit_code == 0 and lines[0].startswith("Python 3.10."), probe.output
    assert lines[1:3] == ["python3.10", "/usr/bin/expect"], probe.output  # no other python: the runtime is its own
    assert lines[3] != "0" and lines[4] == "/app", probe.output
    outputs = [json.loads(m["content"]) for m in messages]
    assert outputs[0]["output"].strip().isdigit() and outputs[0]["output"].strip() != "0", outputs
    assert "uid " in str(outputs[1]) and "uid 0" not in str(outputs[1]), outputs
    assert "rc=1" in outputs[2]["output"], outputs
    # The verifier is root but the slot's root filesystem stays read-only to it; offline as asked.
    vlines = verifier.output.strip().split("\n")
    assert vlines[:2] == ["0", "rc=1"], verifier.output
    assert [v.split(":")[0].strip() for v in vlines[2:]] == ["lo"], verifier.output
    assert len(images) == 1


async def test_a_present_docker_image_is_used_rather_than_rebuilt(task_images, engine):
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=60)
    name = f"hermes-rl-test-named/expect-login:{uuid.uuid4().hex[:8]}"
    client.images.get(task_images["expect-login"]).tag(name)
    images = DockerImages(engine)
    try:
        task = load_harbor_task(FIXTURES / "expect-login").model_copy(update={"docker_image": name})
        recipe = task_recipe(task, "hermes-rl-test-unused-registry")
        assert await images.resolve(recipe) == name
        # Absent: its Dockerfile is built under the content tag instead (here already present, so reused).
        absent = recipe.model_copy(update={"name": f"{name}-absent", "tag": task_images["expect-login"]})
        assert await images.resolve(absent) == task_images["expect-login"]
    finally:
        images.close()
        client.images.remove(name)
        client.close()


@pytest.mark.parametrize(
    "dockerfile,timeout,message",
    [
        ("FROM debian:bookworm\nRUN echo broken-step && exit 3\n", 300.0, "building its image failed"),
        # A fresh step each time (the engine caches a finished step, even one whose build we gave up on).
        # The step sleeps far longer than _gone waits, so its end is never mistaken for the cancellation.
        ("FROM debian:bookworm\nRUN sleep 600 && echo {nonce}\n", 3.0, "took longer than build_timeout_sec = 3"),
    ],
    ids=["fails", "times-out"],
)
async def test_a_build_that_fails_or_times_out_names_the_task(engine, test_id, dockerfile, timeout, message):
    # A build we stopped waiting for may still finish on the engine: its image (ours by label) goes next run.
    _remove_images(engine, f"{IMAGE_LABEL}=broken-task")
    images = DockerImages(engine, labels={TEST_LABEL: test_id})
    nonce = uuid.uuid4().hex
    recipe = ImageRecipe(
        owner="broken-task",
        name="hermes-rl-tests/broken-task:20251127",
        dockerfile=dockerfile.replace("{nonce}", nonce),
        tag=f"hermes-rl-test-broken/broken-task:{uuid.uuid4().hex[:12]}",
        build_timeout_s=timeout,
    )
    try:
        with pytest.raises(ImageUnavailable) as info:
            await images.resolve(recipe)
    finally:
        images.close()
    assert str(info.value).startswith("broken-task: ") and message in str(info.value), str(info.value)
    # The build was cancelled on the engine, not abandoned: its step's container goes (the build client was killed).
    assert await _gone(engine, nonce), f"the build step {nonce} still runs on the engine"


async def _gone(engine: str, nonce: str, rounds: int = 1200) -> bool:
    """Whether the step container naming `nonce` is gone within `rounds` tenths of a second (a loaded engine takes
    seconds to cancel a build)."""
    import docker

    client = docker.DockerClient(base_url=engine, version="auto", timeout=60)
    try:
        for _ in range(rounds):
            if not any(nonce in " ".join(c.attrs.get("Args") or []) for c in client.containers.list()):
                return True
            await asyncio.sleep(0.1)
        return False
    finally:
        client.close()


async def test_a_task_whose_image_cannot_be_built_is_lost_to_infrastructure_not_scored(
    engine, test_id, tmp_path, scripted_server
):
    task_dir = tmp_path / "tasks" / "broken-build"
    shutil.copytree(FIXTURES / "cobol-hello", task_dir)
    (task_dir / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nRUN echo no-such-step && exit 100\n")
    env = make_env(
        scripted_server.base_url,
        tmp_path,
        backend=_docker_config(test_id),
        tasks_dir=str(tmp_path / "tasks"),
        image_registry=f"hermes-rl-test-broken-{test_id}",
    )
    async with env.runtime():
        await env.setup()
        rollouts = [await env.rollout(env.by_id["broken-build"], model=OracleAgent(env.by_id)) for _ in range(2)]
    for rollout in rollouts:
        assert rollout.infrastructure_failure and rollout.score is None
        assert "broken-build: building its image failed" in (rollout.error or ""), rollout.error


# What the agent's program leaves behind when the tests run it as root: a loop rewriting reward.txt = 1,
# or a process that waits for test.sh's shell to end ($PPID: test.sh runs in the guard's shell) and then
# writes reward.txt = 1 once, in the moment between the guard's last check and the verdict's read-out.
# Or the program itself, when the tests start it in the background (as tests of a server do) and end
# without stopping it: it keeps rewriting reward.txt = 1 in place (`1<>`: never empty, made if missing).
WAIT_THEN_WRITE = (
    'g=$PPID; while s=; read -r _ _ s _ < "/proc/$g/stat" 2>/dev/null && [ "$s" != Z ]; do :; done\n'
    'echo 1 1<>"$d/reward.txt"; sleep 30\n'
)
ROOT_STRAYS = {  # name: (how test.sh runs /app/prog.sh, prog.sh after it finds the reward directory $d)
    "root-reward-writer": ("bash /app/prog.sh", '( while :; do echo 1 > "$d/reward.txt" 2>/dev/null; done ) &\n'),
    "root-reward-after-exit": ("bash /app/prog.sh", f"( {WAIT_THEN_WRITE} ) >/dev/null 2>&1 &\n"),
    "root-server-writer": (
        "bash /app/prog.sh >/dev/null 2>&1 &\nsleep 0.5",
        'w() { while :; do echo 1 1<>"$d/reward.txt"; done; }; w & w\n',  # two: one is on a CPU
    ),
}


async def test_a_root_verifier_still_stops_what_the_tested_code_leaves_writing_the_reward(
    engine, test_id, tmp_path, scripted_server
):
    """The tests run the agent's program as root; it leaves a process writing reward.txt = 1. The guard kills it."""
    for name, (run, stray) in ROOT_STRAYS.items():
        task = tmp_path / "tasks" / name
        for d in ("environment", "solution", "tests"):
            (task / d).mkdir(parents=True)
        (task / "task.toml").write_text(
            'version = "1.0"\n\n[metadata]\nauthor_name = "hermes-rl"\n\n[verifier]\ntimeout_sec = 120.0\n\n'
            "[agent]\ntimeout_sec = 120.0\n\n[environment]\nbuild_timeout_sec = 300.0\n"
        )
        (task / "instruction.md").write_text("Write /app/prog.sh.\n")
        (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n\nWORKDIR /app\n")
        (task / "tests" / "test.sh").write_text(f"#!/bin/bash\n{run}\necho 0 > /logs/verifier/reward.txt\nsleep 1\n")
        # The hostile agent's work (played by the oracle): a program that outlives the test writing reward 1.
        (task / "solution" / "solve.sh").write_text(
            "#!/bin/bash\ncat > /app/prog.sh <<'EOF'\n"
            "d=$(ls -d /tmp/hermes-verify-*/logs/verifier | head -1)\n"
            f"{stray}disown\nEOF\n"
        )
    results = await _oracle_on_docker(scripted_server, tmp_path, test_id, list(ROOT_STRAYS))
    # Nothing scores: 0, or (where the guard left test.sh no reward file) Harbor's trial error, which no
    # training group takes (reward.py): never the stray's 1.
    for name, (error, score) in results.items():
        assert (error, score) == (None, 0.0) or (score is None and "gave no reward" in str(error)), (name, error)


async def test_a_root_verifier_scores_zero_when_the_tested_program_kills_the_guarded_shell(
    engine, test_id, tmp_path, scripted_server
):
    """As root in the container: the tested program writes reward 1 and SIGKILLs test.sh's shell (no trap runs)."""
    name = guard_killer_task(tmp_path / "tasks")
    assert await _oracle_on_docker(scripted_server, tmp_path, test_id, [name]) == {name: (None, 0.0)}


# The image puts a directory of the workspace on PATH (a task's own venv or tools under /app), so the agent
# can plant programs there. Its `tar` swaps the pristine test.sh the verifier unpacks for one writing reward 1,
# its `sha256sum` says the tests' files are unchanged. Only test.sh's own commands may see the image's PATH.
PATH_PLANTER = (
    "#!/bin/bash\nmkdir -p /app/bin\ncat > /app/bin/tar <<'EOF'\n#!/bin/bash\n/bin/tar \"$@\"; rc=$?\n"
    'while [ $# -gt 0 ]; do [ "$1" = -C ] && d=$2; shift; done\n'
    'if [ -f "$d/tests/test.sh" ]; then printf \'#!/bin/bash\\necho 1 > %s/logs/verifier/reward.txt\\n\' "$d"'
    ' > "$d/tests/test.sh"; fi\nexit $rc\nEOF\n'
    "printf '#!/bin/bash\\nexit 0\\n' > /app/bin/sha256sum\nchmod +x /app/bin/tar /app/bin/sha256sum\n"
)


async def test_programs_the_agent_plants_on_the_images_path_do_not_run_the_verifiers_own_steps(
    engine, test_id, tmp_path, scripted_server
):
    name = guard_killer_task(
        tmp_path / "tasks",
        "path-planter",
        solution=PATH_PLANTER,
        dockerfile_extra="ENV PATH=/app/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
    )
    assert await _oracle_on_docker(scripted_server, tmp_path, test_id, [name]) == {name: (None, 0.0)}


# The agent plants `bash` itself on the image's PATH: every command the server starts, the verifying script
# included, used to be `bash -c ...` looked up there. The planted one answers the verifying script with the
# verdict lines it expects (its nonce read off the script), "exit 0" and reward 1, and runs nothing.
BASH_PLANTER = (
    "#!/bin/bash\nmkdir -p /app/bin\ncat > /app/bin/bash <<'EOF'\n#!/bin/sh\n"
    'case "$*" in *hermes-verify-*)\n'
    "  n=$(printf '%s' \"$*\" | grep -o 'echo \"[0-9a-f]\\{16\\} rc' | head -1 | cut -c7-22)\n"
    '  echo "$n rc 0"; echo "$n reward.txt $(echo 1 | base64 -w0)"; exit 0;;\n'
    'esac\nexec /bin/bash "$@"\nEOF\nchmod +x /app/bin/bash\n'
)


async def test_a_bash_the_agent_plants_on_the_images_path_never_runs_a_command(
    engine, test_id, tmp_path, scripted_server
):
    name = guard_killer_task(
        tmp_path / "tasks",
        "bash-planter",
        solution=BASH_PLANTER,
        dockerfile_extra="ENV PATH=/app/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
    )
    assert await _oracle_on_docker(scripted_server, tmp_path, test_id, [name]) == {name: (None, 0.0)}
