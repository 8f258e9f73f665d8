from __future__ import annotations

import pytest
from atroposlib.envs.base import APIServerConfig

from backends import LocalBackendConfig
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.terminal_tasks import TerminalTasksEnv, TerminalTasksEnvConfig
from slots.pool import SlotPoolConfig
from tests.support.scripted_openai import ScriptedOpenAIServer
from tests.support.embedded import embedded_tokenizer

# Task directories in their published shapes: their tests run inside sandboxes, not in this session.
collect_ignore_glob = ["fixtures/*"]


def make_env(
    base_url: str, tmp_path, backend=None, env_cls=TerminalTasksEnv, loop=None, **overrides
) -> TerminalTasksEnv:
    pool = SlotPoolConfig(slots_per_sandbox=6, min_sandboxes=1, max_sandboxes=2, health_interval_s=30)
    backend = backend or LocalBackendConfig(pool=pool, data_root=str(tmp_path / "sandboxes"))
    # The suites written for the slot path keep it on docker; task-container tests ask for theirs.
    settings = (
        dict(
            tokenizer_name=embedded_tokenizer(),
            use_wandb=False,
            group_size=2,
            total_steps=1,
            harbor_runtime="slots",
        )
        | overrides
    )
    config = TerminalTasksEnvConfig(
        runtime={"tool_backend": "sandbox", "sandbox": SandboxToolBackendConfig(backend=backend), "loop": loop or {}},
        data_path_to_save_groups=str(tmp_path / "groups.jsonl"),
        ensure_scores_are_not_same=False,
        **settings,
    )
    return env_cls(config, [APIServerConfig(base_url=base_url, model_name="scripted", api_key="")])


@pytest.fixture
async def scripted_server():
    async with ScriptedOpenAIServer([]) as server:
        yield server
