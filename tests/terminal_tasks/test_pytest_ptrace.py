"""A tested program must not ptrace or write the memory of the pytest a Harbor test.sh started, whatever its form.

The usual Terminal-Bench 2 test.sh runs pytest as a console script (`pytest /tests/test_outputs.py`, or through
uvx), not as `python3 -m pytest` (which the guard wraps), and writes reward 1 iff it exits 0. The tests run the
agent's program with subprocess.run, then fail; the program patches pytest's code right after the wait4 it is
blocked in, so pytest exits 0 once the program ends. Every exec in the verifier's tree starts a domain nested in its
parent's, so no program can reach an ancestor, while a parent still traces its own children and a background
server test.sh started can still be stopped by a later command. Real env and sandbox, local and docker backends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.terminal_tasks.conftest import make_env
from tests.terminal_tasks.test_docker_tasks import _docker_config, engine, test_id  # noqa: F401 (fixtures used below)
from tests.terminal_tasks.test_guard_ptrace import (  # noqa: F401 (pytestmark: the same skip)
    OWN_CHILD,
    PROC_MEM,
    PTRACE,
    play_all,
    program_task,
    pytestmark,
)

# pytest as the console script on the slot's PATH (the local backend's venv; the image's on docker).
PYTEST_TEST = (
    "#!/bin/bash\npytest /tests/test_outputs.py\n"
    "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
)
RUNS_AND_FAILS = (
    "import subprocess\n\n\ndef test_the_program():\n"
    "    subprocess.run(['python3', '/app/prog.py'], check=False)\n"
    "    assert False, 'the program does not do the task'\n"
)
# posix_spawn, as CPython 3.13's subprocess does for a path (and Rust's Command, uv's too).
SPAWNS_AND_FAILS = (
    "import os, sys\n\n\ndef test_the_program():\n"
    "    os.waitpid(os.posix_spawn(sys.executable, [sys.executable, '/app/prog.py'], os.environ), 0)\n"
    "    assert False, 'the program does not do the task'\n"
)
RUNS_OWN_CHILD = (
    "import subprocess\n\n\ndef test_the_program():\n"
    "    out = subprocess.run(['python3', '/app/prog.py'], capture_output=True, text=True).stdout\n"
    "    assert out.strip() == 'traced my own child', out\n"
)
# A server test.sh starts in the background and stops with pkill from a later command (a sibling, not its parent).
SERVER_TEST = (
    "#!/bin/bash\npython3 /app/prog.py &\nserver=$!\nsleep 0.5\n"
    "pkill -f /app/prog.py\nwait $server\n"
    "if [ $? -ne 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
)
SERVER = "import time\ntime.sleep(10)\n"
# The library every program preloads: no tested program (the container's root on docker) may rewrite, replace or
# unmount it. It prints what it could do; the test passes iff it could do none of it.
TAMPER = """import ctypes, os
lib, done = "/.hermes-confine.so", []
for name, attempt in {
    "write": lambda: os.close(os.open(lib, os.O_WRONLY)),
    "unlink": lambda: os.unlink(lib),
    "rename over": lambda: (open("/tmp/x", "w").close(), os.rename("/tmp/x", lib)),
    "unmount": lambda: ctypes.CDLL(None, use_errno=True).umount2(lib.encode(), 2) == 0 or 1 / 0,
}.items():
    try:
        attempt()
        done.append(name)
    except Exception:
        pass
print("did:", done)
"""
RUNS_TAMPER = (
    "import os, subprocess\n\n\ndef test_the_program():\n"
    "    assert os.path.isfile('/.hermes-confine.so')\n"
    "    out = subprocess.run(['python3', '/app/prog.py'], capture_output=True, text=True).stdout\n"
    "    assert out.strip() == 'did: []', out\n"
)
# debian:bookworm: python3 and its pytest (/usr/bin/pytest), procps (pkill).
PYTEST_IMAGE = (
    "RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pytest procps "
    "&& rm -rf /var/lib/apt/lists/*\n"
)


def pytest_task(tasks_dir: Path, name: str, program: str, test_py: str, dockerfile_extra: str = "") -> str:
    program_task(tasks_dir, name, program, PYTEST_TEST, dockerfile_extra)
    (tasks_dir / name / "tests" / "test_outputs.py").write_text(test_py)
    return name


def all_tasks(tasks_dir: Path, dockerfile_extra: str = "") -> dict[str, float]:
    return {
        pytest_task(tasks_dir, "pytest-ptrace-exit", PTRACE, RUNS_AND_FAILS, dockerfile_extra): 0.0,
        pytest_task(tasks_dir, "pytest-proc-mem-exit", PROC_MEM, RUNS_AND_FAILS, dockerfile_extra): 0.0,
        pytest_task(tasks_dir, "pytest-posix-spawn-ptrace-exit", PTRACE, SPAWNS_AND_FAILS, dockerfile_extra): 0.0,
        pytest_task(tasks_dir, "pytest-own-child-ptrace", OWN_CHILD, RUNS_OWN_CHILD, dockerfile_extra): 1.0,
        program_task(tasks_dir, "pkill-background-server", SERVER, SERVER_TEST, dockerfile_extra): 1.0,
        pytest_task(tasks_dir, "tamper-with-the-library", TAMPER, RUNS_TAMPER, dockerfile_extra): 1.0,
    }


async def test_a_tested_program_cannot_make_a_console_script_pytest_exit_0(scripted_server, tmp_path, caplog):
    expected = all_tasks(tmp_path / "tasks")
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tmp_path / "tasks"))
    await play_all(env, expected, caplog)


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_a_root_verifier_s_pytest_cannot_be_made_to_exit_0(request, tmp_path, scripted_server, caplog):
    """The same on the docker backend: the image's bash, python3 and pytest, as the container's root."""
    labels = request.getfixturevalue("test_id")
    expected = all_tasks(tmp_path / "tasks", PYTEST_IMAGE)
    env = make_env(
        scripted_server.base_url,
        tmp_path,
        backend=_docker_config(labels),
        tasks_dir=str(tmp_path / "tasks"),
        image_registry="hermes-rl-test-pytest-ptrace",
    )
    await play_all(env, expected, caplog)
