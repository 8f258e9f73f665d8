"""The tested program kills test.sh's shell after writing reward.txt = 1: its guard never gets to run.

Harbor's tests run the agent's programs as test.sh's own uid (the container's root on docker), so such a
program can signal the shell running test.sh. SIGKILL skips every trap, the guard's EXIT trap included, so
nothing discards the reward file the program wrote; a shell that died by a signal must score nothing.
"""

from __future__ import annotations

from pathlib import Path

from environments.terminal_tasks import OracleAgent
from tests.terminal_tasks.conftest import make_env

# The hostile agent's work (played by the oracle): a program the tests run that writes reward 1 into
# the verifier's reward directory, then SIGKILLs its parent, the shell running test.sh under the guard.
KILLER = (
    "#!/bin/bash\ncat > /app/prog.sh <<'EOF'\n"
    "d=$(ls -d /tmp/hermes-verify-*/logs/verifier | head -1)\n"
    'echo 1 > "$d/reward.txt"\n'
    "kill -KILL $PPID\n"
    "EOF\n"
)
# An honest test.sh: it runs the program, then writes the reward its check decides (here: 0).
TEST_SH = "#!/bin/bash\nbash /app/prog.sh\necho 0 > /logs/verifier/reward.txt\n"


def guard_killer_task(
    tasks_dir: Path, name: str = "guard-killer", solution: str = KILLER, dockerfile_extra: str = ""
) -> str:
    task = tasks_dir / name
    for d in ("environment", "solution", "tests"):
        (task / d).mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text(
        'version = "1.0"\n\n[metadata]\nauthor_name = "hermes-rl"\n\n[verifier]\ntimeout_sec = 120.0\n\n'
        "[agent]\ntimeout_sec = 120.0\n\n[environment]\nbuild_timeout_sec = 300.0\n"
    )
    (task / "instruction.md").write_text("Write /app/prog.sh.\n")
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n\nWORKDIR /app\n" + dockerfile_extra)
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "solution" / "solve.sh").write_text(solution)
    return name


async def test_a_tested_program_that_kills_the_guarded_shell_scores_zero(scripted_server, tmp_path):
    name = guard_killer_task(tmp_path / "tasks")
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(tmp_path / "tasks"))
    async with env.runtime():
        await env.setup()
        rollout = await env.rollout(env.by_id[name], model=OracleAgent(env.by_id))
    assert rollout.error is None, rollout.error
    assert rollout.score == 0.0, rollout.score
