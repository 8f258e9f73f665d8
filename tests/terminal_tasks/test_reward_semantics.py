"""Harbor's reward semantics end to end on the local backend: the raw float is the score (2.0 stays 2.0, 0.5 stays
0.5), and a test.sh that writes no reward file loses the rollout to the verifier (Harbor's trial error), never a 0."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.terminal_tasks import BUNDLED_TASKS, NoOpAgent
from tests.terminal_tasks.conftest import make_env

CASES = {
    "raw-two": "echo 2.0 > /logs/verifier/reward.txt\n",
    "half-json": 'echo 0 > /logs/verifier/reward.txt\necho \'{"reward": 0.5, "style": 3}\' > /logs/verifier/reward.json\n',
    "no-reward": "echo 'tests ran, no reward written'\n",
    "empty-reward": ": > /logs/verifier/reward.txt\n",
}


def _tasks(tmp_path: Path) -> Path:
    root = tmp_path / "tasks"
    for name, body in CASES.items():
        task = root / name
        shutil.copytree(BUNDLED_TASKS / "harbor" / "edit-config", task)
        (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + body)
    return root


@pytest.mark.slow
async def test_reward_files_score_as_harbor_reads_them(scripted_server, tmp_path):
    env = make_env(scripted_server.base_url, tmp_path, tasks_dir=str(_tasks(tmp_path)))
    async with env.runtime():
        await env.setup()
        rollouts = {t.id: await env.rollout(t, model=NoOpAgent()) for t in env.tasks}
    assert (rollouts["raw-two"].score, rollouts["raw-two"].infrastructure_failure) == (2.0, False)
    assert (rollouts["half-json"].score, rollouts["half-json"].infrastructure_failure) == (0.5, False)
    for name, why in (("no-reward", "wrote no reward file"), ("empty-reward", "reward.txt is empty")):
        lost = rollouts[name]
        assert lost.infrastructure_failure and lost.score is None, lost
        assert f"{name}: the verifier gave no reward" in (lost.error or "") and why in (lost.error or "")
