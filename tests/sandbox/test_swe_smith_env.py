"""The SWE-smith env on sandbox slots: oracle fixes score 1.0, doing nothing scores 0.0."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from atroposlib.envs.base import APIServerConfig

from backends import LocalBackendConfig
from environments.models.base import ModelTurn
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.swe_smith.env import (
    NoOpAgent,
    OracleAgent,
    SweSmithOracleEnv,
    SweSmithOracleEnvConfig,
)
from environments.swe_smith.instances import load_offline_instances
from slots.pool import SlotPoolConfig
from tests.support.scripted_openai import ScriptedOpenAIServer
from tests.support.cli import run_cli
from tests.support.embedded import embedded_model_flags, embedded_tokenizer, small_group_flags


def make_env(base_url: str, tmp_path, runtime=None, **overrides) -> SweSmithOracleEnv:
    pool = SlotPoolConfig(slots_per_sandbox=4, min_sandboxes=2, max_sandboxes=2, health_interval_s=30)
    settings = dict(tokenizer_name=embedded_tokenizer(), use_wandb=False, group_size=2, total_steps=1) | overrides
    config = SweSmithOracleEnvConfig(
        runtime={
            "tool_backend": "sandbox",
            "sandbox": SandboxToolBackendConfig(
                backend=LocalBackendConfig(pool=pool, data_root=str(tmp_path / "sandboxes"))
            ),
            **(runtime or {}),
        },
        data_path_to_save_groups=str(tmp_path / "groups.jsonl"),
        ensure_scores_are_not_same=False,
        **settings,
    )
    return SweSmithOracleEnv(config, [APIServerConfig(base_url=base_url, model_name="scripted", api_key="")])


def test_offline_instances_are_in_swe_smith_format(tmp_path):
    mirror_base, instances = load_offline_instances(cache_dir=tmp_path)
    assert len(instances) >= 5 and len({i.repo for i in instances}) >= 4
    for inst in instances:
        assert re.fullmatch(r"swesmith/hermes-rl__\w+\.[0-9a-f]{8}", inst.repo)
        assert inst.instance_id.startswith(inst.repo_name + ".")
        assert inst.patch.startswith("diff --git a/") and inst.FAIL_TO_PASS and inst.PASS_TO_PASS
        assert set(inst.FAIL_TO_PASS).isdisjoint(inst.PASS_TO_PASS)
        bare = Path(inst.source(str(mirror_base)))
        branch = subprocess.run(
            ["git", "-C", str(bare), "rev-parse", f"refs/heads/{inst.instance_id}"], capture_output=True, text=True
        )
        assert branch.stdout.strip() == inst.base_commit  # one branch per instance, the bug committed
    assert load_offline_instances(cache_dir=tmp_path) == (mirror_base, instances)  # reproducible, built once


class EditsTheTests:
    """Reward hacking: writes the hidden failing test file back, expecting the buggy behaviour, instead of
    fixing the code (the published head has no tests/test_calc.py; the verifier restores the real one)."""

    async def chat(self, messages, tools, options) -> ModelTurn:
        if any(m.get("role") == "tool" for m in messages):
            return ModelTurn(content="done")
        test = "from tinycalc import div\n\n\ndef test_div():\n    assert div(7, 2) == 3\n"
        command = (
            f"cd tinycalc && test ! -e tests/test_calc.py && mkdir -p tests && printf '{test}' > tests/test_calc.py"
            " && python -m pytest -q tests/test_calc.py::test_div"
        )
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "terminal", "arguments": json.dumps({"command": command})},
        }
        return ModelTurn(content=None, tool_calls=[call])


@pytest.mark.slow
async def test_oracle_resolves_every_instance_and_noop_none(tmp_path):
    async with ScriptedOpenAIServer([]) as server:
        env = make_env(server.base_url, tmp_path)
        async with env.runtime():
            await env.setup()
            oracle = OracleAgent(env.by_id)
            rollouts = await __import__("asyncio").gather(
                *(env.rollout(item, model=oracle) for item in env.instances),
                *(env.rollout(item, model=NoOpAgent()) for item in env.instances),
            )
            n = len(env.instances)
            assert [r.error for r in rollouts] == [None] * 2 * n
            assert [r.score for r in rollouts[:n]] == [1.0] * n
            assert [r.score for r in rollouts[n:]] == [0.0] * n
            # the oracle really went through the terminal tool in the slot
            tool_out = json.loads(next(m for m in rollouts[0].result.messages if m["role"] == "tool")["content"])
            assert tool_out["exit_code"] == 0
            hack = await env.rollout(env.instances[0], model=EditsTheTests())
            assert (
                "1 passed"
                in json.loads(next(m for m in hack.result.messages if m["role"] == "tool")["content"])["output"]
            )
            assert hack.score == 0.0  # the tests are restored before scoring
            assert all(s.state.value == "free" for s in env.agent_runtime.tool_backend.slots())
            # Workspaces are built from snapshots this process keeps: nothing in the slots' shared cache.
            assert list((tmp_path / "sandboxes").glob("sb-*/cache/**/*.git")) == []
            # Every scored trajectory was verified, and the test edit was seen and left out.
            dropped = [(f.path, f.reason) for v in env.verdicts.values() for f in v.dropped]
            assert ("tests/test_calc.py", "test file") in dropped
            assert all(why == "cache or bytecode" for path, why in dropped if path != "tests/test_calc.py")
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert leftover == []


@pytest.mark.slow
async def test_process_with_the_oracle_writes_groups_scored_one(tmp_path):
    async with ScriptedOpenAIServer([]) as server:
        env = make_env(server.base_url, tmp_path, agent="oracle", total_steps=2, include_messages=True)
        env.process_mode = True
        env.n_groups_to_process = 2
        env.group_size_to_process = 2
        await env.process_manager()
    groups = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 2 and all(g["scores"] == [1.0, 1.0] for g in groups)


@pytest.mark.llm
@pytest.mark.slow
def test_process_cli_runs_on_the_local_sandbox_backend_against_the_embedded_model(embedded_llm, tmp_path):
    out = tmp_path / "groups.jsonl"
    proc = run_cli(
        SweSmithOracleEnv,
        "process",
        *embedded_model_flags(embedded_llm),
        "--env.total_steps",
        "1",
        "--env.ensure_scores_are_not_same",
        "False",
        *small_group_flags(out, max_turns=1, max_tokens=32),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 1 and len(groups[0]["scores"]) == 2
    assert all(s in (0.0, 1.0) for s in groups[0]["scores"])
    first_user = next(m for m in groups[0]["messages"][0] if m["role"] == "user")["content"]
    assert "Repository path:" in first_user


async def test_oracle_also_scores_on_the_plain_local_tool_backend(tmp_path):
    async with ScriptedOpenAIServer([]) as server:
        env = make_env(
            server.base_url,
            tmp_path,
            runtime={  # the local backend needs the opt-out; the oracle's diff is not model code
                "tool_backend": "local",
                "unconfined_tools": True,
                "workspace": {"workspace_root": str(tmp_path / "ws")},
            },
            limit=1,
        )
        async with env.runtime():
            await env.setup()
            fixed = await env.rollout(env.instances[0], model=OracleAgent(env.by_id))
            untouched = await env.rollout(env.instances[0], model=NoOpAgent())
    assert (fixed.error, fixed.score) == (None, 1.0)
    assert (untouched.error, untouched.score) == (None, 0.0)
