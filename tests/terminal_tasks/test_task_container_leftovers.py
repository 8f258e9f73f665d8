"""What a root agent leaves running in its task container keeps running into the verifier, as in Harbor (a
server the tests query must still answer): it must not be able to write the reward or change the tests.

Each attack leaves a process behind and solves nothing (the honest score is 0); the honest case leaves a
server the tests need and must still score 1 (docs/security.md, "Terminal tasks in a task container").
"""

from __future__ import annotations

import shlex

import pytest

from environments.terminal_tasks.container_run import task_container, task_spec, verify_in_container
from environments.terminal_tasks.harbor import load_harbor_task
from tests.support.docker_engine import engine_problem
from tests.terminal_tasks import test_task_container_integrity as integrity
from tests.terminal_tasks.test_task_container_integrity import run, write_task

# The integrity tests' task image and engine, as fixtures of this module too.
task_image, engines = integrity.task_image, integrity.engines

pytestmark = [pytest.mark.slow, pytest.mark.skipif(engine_problem() is not None, reason=str(engine_problem()))]


def left_running(script: str) -> str:
    """The agent's command: `script` detached from it (its own session, no terminal), still running afterwards."""
    return f"nohup setsid bash -c {shlex.quote(script)} >/dev/null 2>&1 < /dev/null & sleep 0.5"


REWRITE_REWARD = "while :; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.005; done"
# Waits for the verifier to copy the tests in, then makes them pass (the rewrite stays).
REWRITE_TESTS = (
    "while [ ! -s /tests/test_outputs.py ]; do sleep 0.005; done; "
    "printf 'def test_answer():\\n    pass\\n' > /tests/test_outputs.py"
)
# The same, putting the original back once pytest has read it (the file's hash is right again at the end).
REWRITE_TESTS_AND_RESTORE = (
    "while [ ! -s /tests/test_outputs.py ]; do sleep 0.005; done; "
    "cp /tests/test_outputs.py /var/tmp/orig.py; "
    "printf 'def test_answer():\\n    pass\\n' > /tests/test_outputs.py; "
    "while ! grep -q passed /logs/verifier/test-stdout.txt 2>/dev/null; do sleep 0.005; done; "
    "cp /var/tmp/orig.py /tests/test_outputs.py"
)
# A root conftest.py planted after the engine's diff was taken (before that, it is flagged).
PLANT_CONFTEST_LATE = (
    "while [ ! -s /tests/test.sh ]; do sleep 0.005; done; "
    "printf 'def pytest_collection_modifyitems(items):\\n    for i in items:\\n        i.runtest = lambda: None\\n' "
    "> /conftest.py"
)

# The same, as a conftest.py of its own beside the copied tests (a file the verifier never copied in).
PLANT_TESTS_CONFTEST_LATE = (
    "while [ ! -s /tests/test.sh ]; do sleep 0.005; done; "
    "printf 'def pytest_collection_modifyitems(items):\\n    for i in items:\\n        i.runtest = lambda: None\\n' "
    "> /tests/conftest.py"
)

# Between the engine's diff and the guard's start (round-14 review): once the tests are copied in, a login profile
# the verifier's `bash -l` reads first writes the reward and ends the shell before test.sh runs...
LATE_PROFILE = (
    "while [ ! -s /tests/test.sh ]; do sleep 0.005; done; "
    "printf 'mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; exit 0\\n' > /etc/profile.d/zz-late.sh"
)
# ... or the `bash` the verifier's command runs is replaced by one that does the same.
LATE_BASH = (
    "while [ ! -s /tests/test.sh ]; do sleep 0.005; done; "
    "cp /bin/bash /var/tmp/real-bash; "
    "printf '#!/var/tmp/real-bash\\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\\n' > /var/tmp/fake; "
    "chmod +x /var/tmp/fake; mv -f /var/tmp/fake /usr/bin/bash"
)

# Open holes (docs/security.md): a root process that acts while the tests run and undoes its work before they
# end leaves nothing to see afterwards, and the container gives the verifier nothing of its own to hide in.
_OPEN = pytest.mark.xfail(strict=True, reason="open: a leftover that acts during the tests and undoes it after")


@pytest.mark.parametrize(
    "script",
    [
        REWRITE_REWARD,
        f"setpriv --reuid 65534 --regid 65534 --clear-groups bash -c {shlex.quote(REWRITE_REWARD)}",
        REWRITE_TESTS,
        LATE_PROFILE,
        LATE_BASH,
        pytest.param(REWRITE_TESTS_AND_RESTORE, marks=_OPEN),
        pytest.param(PLANT_CONFTEST_LATE, marks=_OPEN),
        pytest.param(PLANT_TESTS_CONFTEST_LATE, marks=_OPEN),
    ],
    ids=[
        "reward-rewriter",
        "reward-rewriter-as-nobody",
        "tests-rewriter",
        "late-profile",
        "late-bash",
        "tests-rewriter-restoring",
        "late-conftest",
        "late-tests-conftest",
    ],
)
async def test_a_process_the_agent_left_running_cannot_win(engines, tmp_path, task_image, script):
    verdict = await run(engines, tmp_path, task_image, left_running(script))
    assert not verdict.reward, verdict


SERVER_TESTS = """from urllib.request import urlopen

def test_answer_served():
    assert urlopen("http://127.0.0.1:8765/answer.txt", timeout=30).read().decode().strip() == "42"
"""


async def test_a_server_the_agent_left_running_still_serves_the_tests(engines, tmp_path, task_image):
    """Harbor's semantics: the agent's machine, services included, is what the tests see."""
    task_dir = write_task(tmp_path)
    (task_dir / "tests" / "test_outputs.py").write_text(SERVER_TESTS)
    task = load_harbor_task(task_dir)
    serve = "python3 -m http.server 8765 --bind 127.0.0.1 --directory /srv/www"
    async with task_container(engines, task_spec(task, task_image, network=False), task.id) as executor:
        for command in (
            "mkdir -p /srv/www && echo 42 > /srv/www/answer.txt",
            left_running(serve),
            'for i in $(seq 300); do python3 -c "import urllib.request as u; '
            "u.urlopen('http://127.0.0.1:8765/answer.txt')\" 2>/dev/null && exit 0; sleep 0.1; done; exit 1",
        ):
            result = await executor.exec(command, timeout=600, max_output_bytes=100_000)
            assert result.exit_code == 0, result.output
        verdict = await verify_in_container(executor, task)
    assert (verdict.reward, verdict.flags) == (1.0, []), verdict
