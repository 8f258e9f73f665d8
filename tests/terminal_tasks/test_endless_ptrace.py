"""An Endless Terminals verdict is pytest's own exit status: a program the tests run must not be able to
ptrace or write the memory of that pytest (or of the script reading its status) to make it exit 0.

The hostile agent's work (the task's solution, played by the oracle) is /home/user/prog.py, which the
task's final test runs and then fails on. The attacks patch pytest's code right after the wait4 it is
blocked in (waiting for the program), so pytest exits 0 as soon as the program ends. An honest program
that ptraces its own child still passes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


from environments.terminal_tasks import BUNDLED_TASKS, OracleAgent
from tests.terminal_tasks.conftest import make_env
from tests.terminal_tasks.test_guard_ptrace import OWN_CHILD, PROC_MEM, PTRACE, pytestmark  # noqa: F401

RUNS_AND_FAILS = (
    "import subprocess\n\n\ndef test_the_program():\n"
    "    subprocess.run(['python3', '/home/user/prog.py'], check=False)\n"
    "    assert False, 'the program does not do the task'\n"
)
RUNS_OWN_CHILD = (
    "import subprocess\n\n\ndef test_the_program():\n"
    "    out = subprocess.run(['python3', '/home/user/prog.py'], capture_output=True, text=True).stdout\n"
    "    assert out.strip() == 'traced my own child', out\n"
)


def endless_program_task(tasks_dir: Path, name: str, program: str, final_test: str) -> str:
    root = tasks_dir / name
    shutil.copytree(BUNDLED_TASKS / "endless" / "task_000003_d4f6b8c0", root)
    (root / "solution" / "solve.sh").write_text(f"#!/bin/bash\ncat > /home/user/prog.py <<'EOF'\n{program}EOF\n")
    (root / "test_final_state.py").write_text(final_test)
    meta = json.loads((root / "task.json").read_text())
    (root / "task.json").write_text(json.dumps({**meta, "name": name}))
    return name


async def test_a_tested_program_cannot_make_pytest_exit_0(scripted_server, tmp_path):
    tasks = tmp_path / "tasks"
    expected = {
        endless_program_task(tasks, "task_000010_0000ace1", PTRACE, RUNS_AND_FAILS): 0.0,
        endless_program_task(tasks, "task_000011_0000ace2", PROC_MEM, RUNS_AND_FAILS): 0.0,
        endless_program_task(tasks, "task_000012_0000ace3", OWN_CHILD, RUNS_OWN_CHILD): 1.0,
    }
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tasks))
    async with env.runtime():
        await env.setup()
        rollouts = {n: await env.rollout(env.by_id[n], model=OracleAgent(env.by_id)) for n in expected}
    assert {n: (r.error, r.score) for n, r in rollouts.items()} == {n: (None, s) for n, s in expected.items()}
