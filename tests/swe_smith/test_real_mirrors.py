"""Real SWE-smith task branches, scored with the documented way to run them without their image
(`--env.deps.mode venv`, nothing else set): oracle 5/5, no-op 0/5, and the no-op fails exactly FAIL_TO_PASS.

The data (tests/swe_smith/data/real/) is five task branches of each of two real mirrors,
github.com/swesmith/jawah__charset_normalizer.1fdd6463 and swesmith/marshmallow-code__apispec.8b421526
(a git bundle of main and those branches, as fetched), and their rows, built by
`python -m scripts.swe_smith_rows`: the whole suite run at each "Bug Patch" commit and at main in the
prepared environment. charset_normalizer's pytest addopts name `--cov` (pytest-cov, from its dev-requirements)
and its legacy tests use unittest's subTest.

Slow and online: the environment is prepared with pip from the package index, as `--env.deps.mode venv` does.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
from atroposlib.envs.base import APIServerConfig

from backends import LocalBackendConfig
from environments.check_agents import NoOpAgent
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.swe_smith.deps import RepoEnvConfig
from environments.swe_smith.env import OracleAgent, SweSmithOracleEnv, SweSmithOracleEnvConfig
from slots.pool import SlotPoolConfig
from tests.support.scripted_openai import ScriptedOpenAIServer
from tests.support.embedded import embedded_tokenizer

REAL = Path(__file__).parent / "data" / "real"
REPOS = ["jawah__charset_normalizer.1fdd6463", "marshmallow-code__apispec.8b421526"]


@pytest.mark.slow
@pytest.mark.parametrize("name", REPOS)
async def test_real_instances_oracle_all_noop_none(tmp_path, name):
    mirrors = tmp_path / "mirrors"
    bare = mirrors / "swesmith" / f"{name}.git"
    subprocess.run(["git", "clone", "-q", "--mirror", str(REAL / f"{name}.bundle"), str(bare)], check=True)
    rows = [json.loads(line) for line in (REAL / f"{name}.jsonl").read_text().splitlines()]
    for row in rows:  # SWE-smith's layout: base_commit is the branch head, "Remove F2P Tests" on "Bug Patch"
        log = subprocess.run(
            ["git", f"--git-dir={bare}", "log", "--format=%H %s", row["instance_id"]], capture_output=True, text=True
        ).stdout.splitlines()
        assert [x.split(" ", 1)[1] for x in log] == ["Remove F2P Tests", "Bug Patch", "Initial commit"]
        assert log[0].split()[0] == row["base_commit"] and row["FAIL_TO_PASS"]

    pool = SlotPoolConfig(slots_per_sandbox=5, min_sandboxes=1, max_sandboxes=1, health_interval_s=30)
    config = SweSmithOracleEnvConfig(
        tokenizer_name=embedded_tokenizer(),
        use_wandb=False,
        group_size=1,
        total_steps=1,
        runtime={
            "sandbox": SandboxToolBackendConfig(backend=LocalBackendConfig(pool=pool, data_root=str(tmp_path / "sb")))
        },
        data_path_to_save_groups=str(tmp_path / "out" / "groups.jsonl"),
        ensure_scores_are_not_same=False,
        dataset=str(REAL / f"{name}.jsonl"),
        mirror_base=str(mirrors),
        cache_dir=str(tmp_path / "cache"),
        deps=RepoEnvConfig(mode="venv"),
    )
    server_config = APIServerConfig(base_url="", model_name="scripted", api_key="x")
    async with ScriptedOpenAIServer([]) as server:
        env = SweSmithOracleEnv(config, [server_config.model_copy(update={"base_url": server.base_url})])
        async with env.runtime():
            await env.setup()
            assert [i.instance_id for i in env.instances] == [r["instance_id"] for r in rows]
            fixed = await asyncio.gather(*(env.rollout(i, model=OracleAgent(env.by_id)) for i in env.instances))
            oracle_verdicts = list(env.verdicts.values())
            untouched, noop_verdicts = [], []
            for inst in env.instances:  # one at a time: each verdict is then the newest (rows share their tests)
                untouched.append(await env.rollout(inst, model=NoOpAgent()))
                noop_verdicts.append(list(env.verdicts.values())[-1])
    assert [(r.score, r.error) for r in fixed] == [(1.0, None)] * 5, [(v.error, v.flags) for v in oracle_verdicts]
    assert [r.score for r in untouched] == [0.0] * 5
    assert all(not v.flags and not v.error for v in oracle_verdicts + noop_verdicts)
    for verdict, row in zip(noop_verdicts, rows, strict=True):  # the no-op fails exactly FAIL_TO_PASS
        assert set(verdict.statuses) == set(row["FAIL_TO_PASS"] + row["PASS_TO_PASS"])
        assert {t for t, s in verdict.statuses.items() if s != "PASSED"} == set(row["FAIL_TO_PASS"])
    installed = json.loads(next((tmp_path / "cache" / "envs").glob("*/hermes-env.json")).read_text())["installed"]
    assert any(p.startswith("pytest==8.") for p in installed)  # the image's pytest major, not pytest 9
