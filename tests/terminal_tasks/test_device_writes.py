"""Runnability never skips a task for a harmless device write (`2>/dev/null`, `>/dev/stderr`, `/dev/tty`...).

The task is the TB2 fixture (fixtures/tb2/count-errors, the published test.sh bootstrap) with device writes in the
forms published Terminal-Bench 2 scripts use (configure-git-webserver/tests/verify.sh `command -v curl &> /dev/null`,
`curl -s -o /dev/null`; install-windows-3.11/tests/qemu-control.sh `2>/dev/null`, `>/dev/null 2>&1`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.terminal_tasks import NoOpAgent, OracleAgent
from environments.terminal_tasks.harbor import load_harbor_task
from environments.terminal_tasks.runnability import scan_script
from tests.terminal_tasks.conftest import make_env

TB2 = Path(__file__).parent / "fixtures" / "tb2" / "count-errors"

DEVICE_WRITES = """
if ! command -v python3 &> /dev/null; then
    echo "python3 is missing" > /dev/stderr
fi
ls /tests 2>/dev/null >/dev/stdout
command -v curl >/dev/null 2>&1 || echo "no curl" 1>&2
echo "verifying" > /dev/tty 2>/dev/null || true
head -c 8 /dev/zero > /dev/null
cat /dev/null > /dev/fd/1
echo done >> /dev/null
"""


def _task_with_device_writes(tmp_path: Path) -> Path:
    task = tmp_path / "count-errors"
    shutil.copytree(TB2, task)
    test_sh = task / "tests" / "test.sh"
    text = test_sh.read_text()
    marker = "uvx \\\n"
    assert marker in text
    test_sh.write_text(text.replace(marker, DEVICE_WRITES + "\n" + marker, 1))
    return task


@pytest.mark.parametrize(
    "line",
    [
        "pytest /tests 2>/dev/null",
        "x &> /dev/null",
        "echo hi > /dev/stderr",
        "echo hi >/dev/stdout",
        "exec 3>/dev/tty",
        "echo x | tee -a /dev/tty",
        "echo x > /dev/fd/2",
        "x > /dev/full",
        "dd if=/dev/zero of=/dev/null count=1",
        "cat /dev/urandom | head -c 4 > /dev/null",
    ],
)
def test_device_writes_are_not_problems(line):
    _, problems = scan_script(
        line, where="tests/test.sh", machine=None, roots=("/app", "/tests", "/logs"), ownership_checked=False
    )
    assert problems == []


@pytest.mark.parametrize(
    ("line", "path"),
    [
        ("echo x > /etc/motd", "/etc/motd"),
        ("echo 1 > /dev/shm/flag", "/dev/shm/flag"),  # a real file in a tmpfs, not a device
        ("sed -i 's/a/b/' /etc/hosts", "/etc/hosts"),
        ("sed -i -e '/^x/a y' /var/lib/x.conf", "/var/lib/x.conf"),
    ],
)
def test_real_writes_outside_are_still_named(line, path):
    _, problems = scan_script(
        line, where="tests/test.sh", machine=None, roots=("/app", "/tests", "/logs"), ownership_checked=False
    )
    assert [p.text for p in problems] == [f"tests/test.sh: writes outside the workspace ({path})"]


def test_a_sed_script_is_not_a_path():
    # terminal-bench-2 nginx-request-logging's solve.sh: `sed -i '/http {/a ...' FILE` (the script names no file).
    _, problems = scan_script(
        "sed -i '/http {/a \\    log_format x;' /app/nginx.conf\nsed -i 's/foo/bar/g' /app/a.txt",
        where="solution/solve.sh",
        machine=None,
        roots=("/app",),
        ownership_checked=False,
    )
    assert problems == []


def test_the_task_has_only_its_bootstrap_problems(tmp_path):
    task = load_harbor_task(_task_with_device_writes(tmp_path))
    assert task.local_problems and task.only_bootstrap_blocks, [p.text for p in task.local_problems]
    assert not any("/dev" in p.text for p in task.local_problems)


@pytest.mark.slow
async def test_a_test_sh_with_device_writes_runs_on_the_local_backend(scripted_server, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _task_with_device_writes(tasks)
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tasks), bootstrap_tests_with_sandbox_pytest=True)
    async with env.runtime():
        await env.setup()
        assert [t.id for t in env.tasks] == ["count-errors"]
        scores = {
            type(a).__name__: (await env.rollout(env.tasks[0], model=a)).score
            for a in (OracleAgent(env.by_id), NoOpAgent())
        }
    assert scores == {"OracleAgent": 1.0, "NoOpAgent": 0.0}
