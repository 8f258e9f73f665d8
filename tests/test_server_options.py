"""atroposlib's server options, as atroposlib documents them or refused in one line: --slurm,
--testing, server_type trl; health checks and least-loaded routing across several servers."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from atroposlib.envs.base import APIServerConfig

from environments.hermes_base_env import HermesAgentEnvConfig
from tests.support.cli import run_cli
from tests.support.scripted_openai import ScriptedOpenAIServer
from tests.support.tiny_env import WriteWordEnv
from tests.support.embedded import embedded_tokenizer


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--slurm", "true"], "error: --slurm is not supported: hermes-rl does not read SLURM_JOB_NODELIST"),
        (["--testing", "true"], "error: --testing is not supported: atroposlib's mock ServerHarness"),
        (
            ["--openai.server_type", "trl", "--openai.base_url", "http://127.0.0.1:9/v1"],
            "error: --openai.server_type trl (http://127.0.0.1:9/v1) is not supported",
        ),
    ],
)
def test_options_hermes_rl_cannot_honour_are_refused_in_one_line(args, expected):
    run = run_cli(WriteWordEnv, "process", *args)
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line.strip() and "PyTorch was not found" not in line]
    assert len(lines) == 1 and lines[0].startswith(expected), run.stderr


class Switchable(ScriptedOpenAIServer):
    """A model server that can go down (503 on every route) and come back."""

    def __init__(self) -> None:
        super().__init__([])
        self.down = False
        self.probes = 0  # GET /models: the start check, then health checks

    async def _models(self, request: web.Request) -> web.Response:
        self.probes += 1
        if self.down:
            return web.json_response({"error": "down"}, status=503)
        return await super()._models(request)

    async def _answer(self, request: web.Request) -> web.Response:
        if self.down:
            self.requests.append(await request.json())
            return web.json_response({"error": {"message": "down"}}, status=503)
        self.script.append({"content": "done"})
        return await super()._answer(request)


def _env(tmp_path, servers: list[Switchable], **server_options) -> WriteWordEnv:
    config = HermesAgentEnvConfig(
        tokenizer_name=embedded_tokenizer(),
        use_wandb=False,
        group_size=4,
        runtime={"model_max_retries": 0},
        data_path_to_save_groups=None,
    )
    configs = [
        APIServerConfig(base_url=s.base_url, model_name="scripted", api_key="x", **server_options) for s in servers
    ]
    return WriteWordEnv(config, configs)


async def _until(condition, what: str) -> None:
    for _ in range(300):  # the router probes each server once a second
        if condition():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never: {what}")


async def _rollouts(env: WriteWordEnv, n: int) -> None:
    await asyncio.gather(*(env.rollout({"word": "apple"}) for _ in range(n)))


async def test_a_dead_server_stops_getting_work_and_gets_it_again_once_healthy(tmp_path):
    async with Switchable() as a, Switchable() as b:
        env = _env(tmp_path, [a, b])  # atroposlib's default: health_check true
        async with env.runtime():
            assert env.agent_runtime.router is not None and env.agent_runtime.router.checked == [True, True]
            await _until(lambda: a.probes > 1, "a health check of server a")
            a.down = True
            await _until(lambda: env.agent_runtime.router.healthy == [False, True], "the router saw server a go down")
            before = len(a.requests)
            await _rollouts(env, 4)
            assert len(a.requests) == before and len(b.requests) == 4  # no trajectory sent to the dead server
            a.down = False
            await _until(lambda: env.agent_runtime.router.healthy == [True, True], "the router saw server a come back")
            await _rollouts(env, 4)
            assert len(a.requests) - before == 2 and len(b.requests) == 6  # equal slots: shared again


async def test_health_check_false_is_honoured_no_probes_and_no_rerouting(tmp_path):
    async with Switchable() as a, Switchable() as b:
        env = _env(tmp_path, [a, b], health_check=False)
        async with env.runtime():
            assert env.agent_runtime.router is not None and env.agent_runtime.router.checked == [False, False]
            a.down = True
            await asyncio.sleep(1.5)  # probes would have run by now; none may
            await _rollouts(env, 4)
        assert env.agent_runtime.router is None
    assert a.probes == b.probes == 1  # the start check only
    assert len(a.requests) == 2 and len(b.requests) == 2  # the dead server still got its share


async def test_trajectories_go_to_the_server_with_the_most_free_slots(tmp_path):
    async with Switchable() as a, Switchable() as b:
        config = HermesAgentEnvConfig(
            tokenizer_name=embedded_tokenizer(), use_wandb=False, data_path_to_save_groups=None
        )
        configs = [
            APIServerConfig(base_url=a.base_url, model_name="scripted", api_key="x", num_max_requests_at_once=1),
            APIServerConfig(base_url=b.base_url, model_name="scripted", api_key="x", num_max_requests_at_once=3),
        ]
        env = WriteWordEnv(config, configs)
        async with env.runtime():
            await _rollouts(env, 4)  # free slots 1 vs 3: b, b, then a (tie, lower index), then b
            assert env.agent_runtime.router is not None and env.agent_runtime.router.in_flight == [
                0,
                0,
            ]  # every trajectory released
    assert (len(a.requests), len(b.requests)) == (1, 3)  # round-robin would have split 2 / 2
