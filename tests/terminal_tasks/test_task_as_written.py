"""A task runs as its own harness runs it (issue 25): in its own working directory (/app, so a
test hashing `find /app` output gets the published hash), programs under test see no verifier
environment (a module next to a script stays importable), and the oracle gets the task's
`[agent] timeout_sec` for its command."""

from __future__ import annotations

import json
import textwrap

import pytest

from environments.models.base import TurnOptions
from environments.terminal_tasks import NoOpAgent, OracleAgent, load_harbor_task
from tests.terminal_tasks.conftest import make_env

# Terminal-Bench 2's task.toml shape (version, [metadata], [verifier], [agent], [environment]).
TASK_TOML = """\
version = "1.0"

[metadata]
author_name = "hermes-rl"
difficulty = "easy"
category = "software-engineering"
tags = ["python"]

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = {agent_timeout}

[environment]
build_timeout_sec = 120.0
cpus = 1
memory_mb = 512
"""


def write_task(root, agent_timeout: float = 900.0):
    """A script that imports a module next to it; its test runs the script as a program."""
    files = {
        "task.toml": TASK_TOML.format(agent_timeout=agent_timeout),
        "instruction.md": "Make /app/run.py print 42 (the value lives in /app/settings.py).\n",
        "environment/Dockerfile": "FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY run.py settings.py /app/\n",
        "environment/run.py": "import settings\n\nprint(settings.VALUE)\n",
        "environment/settings.py": "VALUE = 41\n",
        "solution/solve.sh": "#!/bin/bash\nset -e\nsed -i 's/41/42/' /app/settings.py\n",
        "tests/test.sh": textwrap.dedent(
            """\
            #!/bin/bash
            mkdir -p /logs/verifier
            cd /app
            python3 -m pytest -q /tests/test_outputs.py
            if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
            """
        ),
        "tests/test_outputs.py": textwrap.dedent(
            """\
            import subprocess

            # sha256 of "/app/run.py\\n/app/settings.py\\n", as the task author computed it in the image
            LISTING = "153e01105e2432c1de108f4d514ec67406ef03ef3af193af9a58f616d2527427"


            def test_the_app_directory_is_as_built():
                out = subprocess.run("find /app -maxdepth 1 -type f | sort | sha256sum", shell=True, capture_output=True, text=True)
                assert out.stdout.split()[0] == LISTING


            def test_run_prints_42():
                out = subprocess.run(["python3", "/app/run.py"], capture_output=True, text=True)
                assert out.stdout.strip() == "42", out.stderr
            """
        ),
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.slow
async def test_the_task_runs_in_app_and_its_programs_import_modules_next_to_them(scripted_server, tmp_path):
    write_task(tmp_path / "tasks" / "import-next-to-it")
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tmp_path / "tasks"))
    async with env.runtime():
        await env.setup()
        (task,) = env.tasks
        oracle = await env.rollout(task, model=OracleAgent(env.by_id))
        prompt = next(m for m in oracle.result.messages if m["role"] == "user")["content"]
        assert "Working directory: /app" in prompt
        noop = await env.rollout(task, model=NoOpAgent())
    assert (oracle.error, noop.error) == (None, None)
    assert (oracle.score, noop.score) == (1.0, 0.0)


async def test_the_oracle_command_gets_the_tasks_agent_timeout(scripted_server, tmp_path):
    task = load_harbor_task(write_task(tmp_path / "slow-task", agent_timeout=900.0))
    prompt = f"do it\n\nTask: {task.id}\nWorking directory: /workspace"
    turn = await OracleAgent({task.id: task}).chat(
        [{"role": "user", "content": prompt}], [], TurnOptions(temperature=0.0, max_tokens=10)
    )
    assert json.loads(turn.tool_calls[0]["function"]["arguments"])["timeout"] == 900.0
    # and neither the terminal tool nor the trajectory budget cuts it shorter for the oracle
    env = make_env(scripted_server.base_url, tmp_path, agent="oracle")
    assert env.tool_limits().max_timeout_s >= 900.0
    assert env.item_loop_config(task, env.loop_config()).time_budget_s == 900.0
    # a model keeps the shorter of the task's timeout and --env.runtime.loop.time_budget_s
    model_env = make_env(scripted_server.base_url, tmp_path, loop={"time_budget_s": 300.0})
    assert model_env.item_loop_config(task, model_env.loop_config()).time_budget_s == 300.0
