"""HermesAgentBaseEnv in-process: rollouts, scoring through the workspace, groups, failures."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from atroposlib.envs.base import APIServerConfig

from environments.hermes_base_env import HermesAgentEnvConfig, HermesEnvError
from environments.models.base import ModelTurn
from environments.models.chat_tokens import tokenize_conversation
from environments.runtime import AgentRuntime
from tests.support.cli import run_cli
from tests.support.scripted_openai import ScriptedOpenAIServer, tool_call
from tests.support.tiny_env import WriteWordEnv
from tests.support.embedded import embedded_tokenizer


def make_env(base_url: str, tmp_path, **overrides) -> WriteWordEnv:
    config = HermesAgentEnvConfig(
        tokenizer_name=embedded_tokenizer(),
        use_wandb=False,
        group_size=2,
        total_steps=2,
        data_path_to_save_groups=str(tmp_path / "groups.jsonl"),
        include_messages=True,
        ensure_scores_are_not_same=False,
        **overrides,
    )
    env = WriteWordEnv(config, [APIServerConfig(base_url=base_url, model_name="scripted", api_key="")])
    env.process_mode = True
    env.n_groups_to_process = config.total_steps
    env.group_size_to_process = config.group_size
    return env


def writer(word: str):
    """A scripted turn that writes `word` only when the prompt asks for it (so scores differ)."""

    def reply(request):
        asked = request["messages"][1]["content"].split()[3]
        return {
            "content": None,
            "tool_calls": [
                tool_call("write_file", {"path": "answer.txt", "content": word if asked == word else "wrong"})
            ],
        }

    return reply


async def test_process_writes_scored_groups_with_workspace_rewards(tmp_path):
    script = [writer("apple"), writer("apple"), {"content": "done"}, {"content": "done"}] * 2
    async with ScriptedOpenAIServer(script) as server:
        env = make_env(server.base_url, tmp_path)
        await env.process_manager()
    groups = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 2
    assert groups[0]["scores"] == [1.0, 1.0]  # "apple" asked and written
    assert groups[1]["scores"] == [0.0, 0.0]  # "river" asked, "wrong" written
    info = groups[0]["rollout_info"][0]
    assert info["stop_reason"] == "finished" and info["tool_calls"] == 1 and info["turns"] == 2
    assert (tmp_path / "groups.html").exists()
    # each request carried only the env's toolset
    assert {t["function"]["name"] for t in server.requests[0]["tools"]} == {
        "read_file",
        "write_file",
        "patch",
        "search_files",
    }


class WritesTheWord:
    """A scripted model: writes the asked word into answer.txt, then says done."""

    async def chat(self, messages, tools, options) -> ModelTurn:
        if messages[-1]["role"] == "tool":
            return ModelTurn(content="done")
        word = messages[-1]["content"].split()[3]
        call = {"function": {"name": "write_file", "arguments": json.dumps({"path": "answer.txt", "content": word})}}
        return ModelTurn(content=None, tool_calls=[call])


def test_a_command_builds_its_runtime_once(tmp_path):
    """`process` through the real CLI: the runtime the env built in __init__ (whose tool schemas the
    CLI checked) is the one every rollout of the command runs in; none is built for the run."""
    seen: list[tuple[str, object]] = []

    class Recording(WriteWordEnv):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(("built", self.agent_runtime))

        def scripted_agent(self):
            return WritesTheWord

        async def compute_reward(self, item, result, ctx):
            seen.append(("rollout", self.agent_runtime))
            return await super().compute_reward(item, result, ctx)

    out = tmp_path / "groups.jsonl"
    run = run_cli(
        Recording,
        "process",
        "--env.total_steps",
        "2",
        "--env.group_size",
        "2",
        "--env.ensure_scores_are_not_same=False",
        "--env.runtime.tool_backend",
        "local",
        "--env.runtime.unconfined_tools",
        "true",
        "--env.data_path_to_save_groups",
        str(out),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["scores"] for g in groups] == [[1.0, 1.0], [1.0, 1.0]]
    assert [kind for kind, _ in seen] == ["built"] + ["rollout"] * 4
    built = seen[0][1]
    assert isinstance(built, AgentRuntime)
    assert all(runtime is built for _, runtime in seen)


async def test_infrastructure_failures_are_not_scored_and_stop_the_command(tmp_path):
    async with ScriptedOpenAIServer([500] * 50) as server:
        env = make_env(server.base_url, tmp_path, max_consecutive_infra_failures=2, runtime={"model_max_retries": 0})
        with pytest.raises(HermesEnvError, match="groups in a row failed on infrastructure errors"):
            await env.process_manager()
    assert not (tmp_path / "groups.jsonl").exists(), "no empty/partial output may be left behind"


def first_turn_fails(failing: set[int]):
    """A scripted model: the n-th first turn of any rollout in `failing` answers 503, other first turns
    write the word, later turns say done. Decided by the request, not the order requests arrive in."""
    first_turns = 0

    def reply(request):
        nonlocal first_turns
        if any(m["role"] == "tool" for m in request["messages"]):
            return {"content": "done"}
        first_turns += 1
        return 503 if first_turns in failing else writer("apple")(request)

    return reply


async def test_a_rollout_lost_to_infrastructure_is_run_again(tmp_path):
    async with ScriptedOpenAIServer([first_turn_fails({2})] * 5) as server:
        env = make_env(server.base_url, tmp_path, runtime={"model_max_retries": 0})
        async with env.runtime():
            await env.setup()
            group, backlog = await env.collect_trajectories(await env.get_next_item())
    assert backlog == [] and group["scores"] == [1.0, 1.0]
    assert "group_size" not in group["group_overrides"]  # complete again: run-api releases it


async def test_a_group_lost_while_the_model_server_restarts_is_redone_and_not_counted(tmp_path):
    # training.grpo --sync restarts the server between steps: chat and health both fail until the
    # env has probed it once while down; then it is back.
    state = {"down": False, "probes_while_down": 0}

    def models_status() -> int:
        if state["down"]:
            state["probes_while_down"] += 1
            state["down"] = False
            return 503
        return 200

    def chat(request):
        return 503 if state["down"] else writer("apple")(request)

    async with ScriptedOpenAIServer([chat] * 40) as server:
        server.models_status = models_status
        env = make_env(
            server.base_url,
            tmp_path,
            runtime={"model_max_retries": 0},
            max_consecutive_infra_failures=1,
            server_down_wait_s=600,
        )
        async with env.runtime():
            await env.setup()
            item = await env.get_next_item()
            state["down"] = True
            group, backlog = await env.collect_trajectories(item)
            assert group is None and backlog == [item]  # redone later, never scored
            assert state["probes_while_down"] == 1 and env._consecutive_infra_failures == 0
            group, backlog = await env.collect_trajectories(item)  # the server is back: the group is whole
    assert backlog == [] and group["scores"] == [1.0, 1.0]


async def test_partially_failed_group_keeps_only_usable_rollouts_and_says_its_size(tmp_path):
    async with ScriptedOpenAIServer([first_turn_fails({2})] * 3) as server:
        env = make_env(server.base_url, tmp_path, runtime={"model_max_retries": 0}, rollout_infra_retries=0)
        async with env.runtime():
            await env.setup()
            item = await env.get_next_item()
            group, backlog = await env.collect_trajectories(item)
    assert backlog == []
    assert group["scores"] == [1.0] and len(group["messages"]) == 1
    assert group["group_overrides"]["group_size"] == 1  # else atroposlib drops it as malformed
    assert env._skip_reason(group, True, serving=False) is None  # process writes it
    reason = env._skip_reason(group, True, serving=True)  # serve does not post it: run-api would buffer it
    assert reason is not None and reason.startswith("1 of 2 rollouts lost to infrastructure errors")


async def test_unreachable_server_fails_before_any_rollout(tmp_path):
    env = make_env("http://127.0.0.1:9/v1", tmp_path)
    with pytest.raises(HermesEnvError, match="cannot reach the model server at http://127.0.0.1:9/v1"):
        await env.process_manager()
    assert not (tmp_path / "groups.jsonl").exists()


def test_bad_server_list_and_unknown_toolsets_are_errors(tmp_path):
    with pytest.raises(HermesEnvError, match="non-empty list of APIServerConfig"):
        WriteWordEnv(HermesAgentEnvConfig(tokenizer_name=embedded_tokenizer(), use_wandb=False), APIServerConfig())
    env = make_env("http://127.0.0.1:9/v1", tmp_path, enabled_toolsets=["nope"])
    with pytest.raises(HermesEnvError, match="known toolsets"):
        env.tool_schemas()


def test_phase1_masks_cover_exactly_the_assistant_turns(tmp_path):
    env = make_env("http://127.0.0.1:9/v1", tmp_path)
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "write apple"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call("write_file", {"path": "a", "content": "apple"})],
        },
        {"role": "tool", "tool_call_id": "x", "name": "write_file", "content": '{"bytes_written": 5}'},
        {"role": "assistant", "content": "All done."},
    ]
    ids, masks = tokenize_conversation(env.tokenizer, messages, env.tool_schemas())
    assert len(ids) == len(masks)
    trained = env.tokenizer.decode([t for t, m in zip(ids, masks) if m != -100])
    assert "All done." in trained and '"name": "write_file"' in trained
    assert "write apple" not in trained and "bytes_written" not in trained and "sys" not in trained


def test_auto_token_server_is_exact_for_the_embedded_model_only():
    from environments.models.token_mode.wiring import resolve_token_server

    assert resolve_token_server("auto", "openai", embedded=True) == "llamacpp"
    assert resolve_token_server("auto", "openai") is None
    assert resolve_token_server("auto", "vllm") == "vllm"
    assert resolve_token_server("off", "vllm", embedded=True) is None


def test_default_config_init_keeps_a_task_configs_own_defaults():
    from environments.examples.count_files import CountFilesEnv
    from environments.terminal_tasks.env import TerminalTasksEnv

    class LongEnvConfig(HermesAgentEnvConfig):
        max_token_length: int = 8192

    class LongEnv(CountFilesEnv):
        name = "long_env"
        env_config_cls = LongEnvConfig

    config, servers = LongEnv.config_init()
    assert config.max_token_length == 8192  # declared by the task's config class
    assert config.group_size == 2 and config.data_path_to_save_groups == "out/long_env.jsonl"  # base defaults
    assert isinstance(servers, list)
    assert TerminalTasksEnv.config_init()[0].max_token_length == 8192
    assert CountFilesEnv.config_init()[0].max_token_length == 4096
    assert TerminalTasksEnv.config_init()[0].runtime.tool_limits.max_timeout_s == 3600.0  # its own runtime default


def test_task_defaults_keyed_like_flags_change_one_nested_value_and_a_subclass_adds_to_them():
    from environments.agent_loop import AgentLoopConfig
    from environments.env_entry import default_config

    class ShortConfig(HermesAgentEnvConfig):
        task_defaults: ClassVar[dict[str, Any]] = {
            "group_size": 3,
            "runtime.loop.max_turns": 3,
            "runtime.tool_limits.default_timeout_s": 5.0,
        }

    class ShorterConfig(ShortConfig):
        task_defaults: ClassVar[dict[str, Any]] = {**ShortConfig.task_defaults, "runtime.loop.max_turns": 2}

    config = default_config(ShorterConfig, "shorter")
    assert (config.group_size, config.runtime.loop.max_turns, config.runtime.tool_limits.default_timeout_s) == (
        3,
        2,
        5.0,
    )
    assert config.runtime.loop.temperature == AgentLoopConfig().temperature  # the loop's other defaults stay
    assert config.runtime.tool_limits.max_timeout_s == HermesAgentEnvConfig().runtime.tool_limits.max_timeout_s


def test_a_task_default_that_names_no_setting_is_refused():
    from environments.env_entry import default_config

    class TypoConfig(HermesAgentEnvConfig):
        task_defaults: ClassVar[dict[str, Any]] = {"runtime.loop.max_turn": 3}

    with pytest.raises(TypeError, match=r"'runtime.loop.max_turn' names no setting \(no 'max_turn' there\)"):
        default_config(TypoConfig, "typo")
