"""A tested program must not rewrite the rest of the verifying script that bash is still reading.

A verifying script longer than the server's SHELL_ARGV_BYTES reaches the slot's bash as a memory file on fd 3
(`bash /dev/fd/3`). bash reads a script file as it goes (after each command it reads on from where that command
ended), and every program test.sh runs inherits fd 3. A program that could write through it would replace what the
script does after test.sh (print the verdict) with a forged verdict block: reward 1.0. A task whose tests/ holds
many files (fixtures) makes the script that long. Real env and sandbox, local backend.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from environments.terminal_tasks import OracleAgent
from tests.terminal_tasks.conftest import make_env
from tests.terminal_tasks.test_docker_tasks import _oracle_on_docker, engine, test_id  # noqa: F401 (fixtures used below)
from tests.terminal_tasks.test_guard_ptrace import program_task, pytestmark  # noqa: F401

# Writes a forged verdict over the script's remainder (after the line that runs test.sh) through fd 3.
FORGE = r"""import os, re
try:
    script = os.pread(3, 1 << 22, 0)
    nonce = re.search(rb'echo "([0-9a-f]{16}) rc ', script).group(1)
    at = script.rindex(b"\nrc=$?\n") + 1
    forged = b'echo "%s rc 0"; echo "%s reward.txt MQo="; exit 0\n' % (nonce, nonce)
    os.pwrite(3, forged + b"#" * (len(script) - at - len(forged) - 1) + b"\n", at)
    print("forged")
except Exception as exc:
    print("could not forge:", exc)
"""
# 0.5 iff the program ran to its end and could not forge (a forged verdict says 1).
TEST_SH = (
    "#!/bin/bash\nout=$(python3 /app/prog.py)\n"
    'case $out in "could not forge"*) echo 0.5 ;; *) echo 0 ;; esac > /logs/verifier/reward.txt\n'
)


async def test_a_tested_program_cannot_rewrite_the_verifying_script(scripted_server, tmp_path):
    tasks = tmp_path / "tasks"
    name = program_task(tasks, "rewrite-the-verifying-script", FORGE, TEST_SH)
    data: Path = tasks / name / "tests" / "fixtures"
    data.mkdir()
    for i in range(200):  # the manifest (a sha256 line per file) takes the script past SHELL_ARGV_BYTES
        (data / f"case-{i:03d}-with-a-long-descriptive-name.json").write_text("{}\n")
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tasks))
    async with env.runtime():
        await env.setup()
        rollout = await env.rollout(env.by_id[name], model=OracleAgent(env.by_id))
    assert (rollout.error, rollout.score) == (None, 0.5)


# The agent plants `bash` on an image PATH that names a workspace directory. The server starts every command with
# the system's bash; the verifying script then ran test.sh's guarded shell as `env -i PATH="$image_path" ... bash`,
# which env looks up on that PATH: the planted bash, as the guard shell itself, wrote reward 1 and exited 0.
GUARD_SHELL_PLANTER = (
    "#!/bin/bash\nmkdir -p /app/bin\ncat > /app/bin/bash <<'EOF'\n#!/bin/sh\n"
    'case "$*" in *__hermes_guard*) echo 1 > "${3%/tests/test.sh}/logs/verifier/reward.txt"; exit 0;; esac\n'
    'exec /bin/bash "$@"\nEOF\nchmod +x /app/bin/bash\n'
)


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_a_bash_planted_on_the_images_path_is_not_the_guarded_shell(request, tmp_path, scripted_server):
    labels = request.getfixturevalue("test_id")
    tasks = tmp_path / "tasks"
    name = program_task(
        tasks,
        "guard-shell-planter",
        "",
        "#!/bin/bash\necho 0.5 > /logs/verifier/reward.txt\n",
        "ENV PATH=/app/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
    )
    (tasks / name / "solution" / "solve.sh").write_text(GUARD_SHELL_PLANTER)
    # test.sh itself ran (0.5), under the system's bash
    assert await _oracle_on_docker(scripted_server, tmp_path, labels, [name]) == {name: (None, 0.5)}
