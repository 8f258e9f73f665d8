"""smolagents' CodeAgent on GAIA, driven by a scripted model that writes code actions: the code runs in a
real sandbox slot (bubblewrap, sandbox_server), its output is the next observation, `final_answer`
is scored by GAIA's scorer, and web search is a host call-out answered by the offline engine."""

from __future__ import annotations

from tests.support.embedded import embedded_tokenizer
import socket
from pathlib import Path
from typing import Any

import pytest
from atroposlib.envs.base import APIServerConfig

pytest.importorskip("smolagents")

from backends import LocalBackendConfig  # noqa: E402
from environments.models.base import ModelTurn  # noqa: E402
from environments.sandbox_backend import SandboxToolBackendConfig  # noqa: E402
from environments.smolagents_gaia_env import SmolagentsGaiaEnv, SmolagentsGaiaEnvConfig  # noqa: E402
from slots.pool import SlotPoolConfig  # noqa: E402
from tests.support.scripted_openai import ScriptedOpenAIServer  # noqa: E402

pytestmark = pytest.mark.slow


class ScriptedCoder:
    """Writes one code action per call (with text past the closing tag, which must be cut off)."""

    def __init__(self, actions: list[str]) -> None:
        self.actions = list(actions)
        self.prompts: list[list[dict[str, Any]]] = []

    async def chat(self, messages, tools, options) -> ModelTurn:
        self.prompts.append(messages)
        code = self.actions.pop(0)
        return ModelTurn(content=f"Thought: next step.\n<code>\n{code}\n</code>\nObservation: invented by the model")


def make_env(
    tmp_path: Path, base_url: str, runtime: dict[str, Any] | None = None, **overrides: Any
) -> SmolagentsGaiaEnv:
    pool = SlotPoolConfig(slots_per_sandbox=2, min_sandboxes=1, max_sandboxes=1, health_interval_s=30)
    config = SmolagentsGaiaEnvConfig(
        tokenizer_name=embedded_tokenizer(),
        use_wandb=False,
        data_path_to_save_groups=None,
        runtime={
            "sandbox": SandboxToolBackendConfig(backend=LocalBackendConfig(pool=pool, data_root=str(tmp_path / "sb"))),
            **(runtime or {}),
        },
        **overrides,
    )
    return SmolagentsGaiaEnv(config, [APIServerConfig(base_url=base_url, model_name="scripted", api_key="x")])


def task(env: SmolagentsGaiaEnv, task_id: str) -> dict[str, Any]:
    return next(t for t in env.tasks if t["task_id"] == task_id)


async def test_code_runs_in_the_slot_and_final_answer_is_scored(tmp_path: Path) -> None:
    secret = tmp_path / "host_secret.txt"
    secret.write_text("host only")
    listener = socket.create_server(("127.0.0.1", 0))  # a host port the slot must not reach
    port = listener.getsockname()[1]
    probe = f"""
import os, socket
print("uid", os.getuid())
print("host file visible:", os.path.exists({str(secret)!r}))
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3)
    print("network: open")
except OSError:
    print("network: blocked")
lines = [l for l in open("worker_log.txt") if " ERROR " in l and "10:00:00" <= l.split()[1] <= "11:59:59"]
count = len(lines)
"""
    try:
        # Efficiency by steps: one code action is free, five cost the whole efficiency weight.
        async with ScriptedOpenAIServer([]) as server:
            env = make_env(tmp_path, server.base_url, efficiency_free_calls=1, efficiency_max_calls=5)
            async with env.runtime():
                await env.setup()
                log_task = task(env, "offline-txt-log")
                right = ScriptedCoder([probe, "print('carried:', count)", "final_answer(count)"])
                good = await env.rollout(log_task, model=right)
                wrong = await env.rollout(log_task, model=ScriptedCoder(["final_answer(count_wrong := 4)"]))
                direct = await env.rollout(log_task, model=ScriptedCoder(["final_answer('5')"]))
                group = env.build_group([good, wrong])
    finally:
        listener.close()
    assert good.error is None and not good.infrastructure_failure, good.error
    # The first observation, as smolagents shows it in the next prompt.
    second_prompt = "\n".join(str(m["content"]) for m in right.prompts[1])
    assert "uid " in second_prompt and "uid 0" not in second_prompt
    assert "host file visible: False" in second_prompt
    assert "network: blocked" in second_prompt
    assert "invented by the model" not in second_prompt  # cut at the stop string `</code>`
    third_prompt = "\n".join(str(m["content"]) for m in right.prompts[2])
    assert "carried: 5" in third_prompt  # state carried between actions, inside the slot
    assert good.result.final_answer == 5
    assert good.score == pytest.approx(0.9 + 0.1 * (1 - (3 - 1) / (5 - 1)))
    assert direct.score == 1.0 and direct.result.steps == 1
    assert good.result.steps == 3 and good.result.stop_reason == "finished"
    assert wrong.score == 0.0 and wrong.result.final_answer == 4
    assert group["generation_params"]["agent"].startswith("smolagents 1.")
    assert group["rollout_info"][0]["code_actions"][2] == "final_answer(count)"
    assert [i["correct"] for i in group["rollout_info"]] == [True, False]


async def test_web_search_is_a_host_call_out(tmp_path: Path) -> None:
    """The offline engine answers from the host; the slot only sees the answer."""
    search = """
import json
hits = json.loads(web_search("Halvorsen Point Lighthouse first lit"))
print(hits["results"][0]["title"])
page = json.loads(web_extract([hits["results"][0]["url"]]))
text = page["results"][0]["content"]
print("1887" in text)
"""
    async with ScriptedOpenAIServer([]) as server, make_env(tmp_path, server.base_url).runtime() as env:
        await env.setup()
        coder = ScriptedCoder([search, "final_answer('1887')"])
        r = await env.rollout(task(env, "offline-web-lighthouse-year"), model=coder)
    assert r.error is None, r.error
    observation = "\n".join(str(m["content"]) for m in coder.prompts[1])
    assert "Lighthouse" in observation and "True" in observation
    assert [c["tool"] for c in r.result.callouts] == ["web_search", "web_extract"]
    assert r.score == 1.0


async def test_tavily_key_never_reaches_the_slot(tmp_path: Path) -> None:
    from pydantic import SecretStr

    from tools.web import TavilyConfig, WebConfig
    from tests.support.tavily_double import FakePage, FakeTavilyServer

    page = FakePage("https://example.org/lighthouse", "Halvorsen Point Lighthouse", "It was first lit in 1887.")
    look = """
import json, os
r = json.loads(web_search("lighthouse"))
print(r["results"][0]["url"])
seen = [open("/proc/self/environ", "rb").read(), open("/proc/self/cmdline", "rb").read()]
for root, dirs, files in os.walk("."):
    seen += [open(os.path.join(root, f), "rb").read() for f in files]
print("key in slot:", any(KEY.encode() in blob for blob in seen))
""".replace("KEY", "KEY_FROM_TEST")
    async with FakeTavilyServer([page]) as tavily, ScriptedOpenAIServer([]) as server:
        web = WebConfig(
            backend="tavily", tavily=TavilyConfig(api_key=SecretStr(tavily.api_key), base_url=tavily.base_url)
        )
        env = make_env(tmp_path, server.base_url, runtime={"web": web})
        async with env.runtime():
            await env.setup()
            # The key string is built in the slot from pieces, so the check itself does not carry it whole.
            key = tavily.api_key
            half = len(key) // 2
            code = look.replace("KEY_FROM_TEST", f"({key[:half]!r} + {key[half:]!r})")
            coder = ScriptedCoder([code, "final_answer(1887)"])
            r = await env.rollout(task(env, "offline-web-lighthouse-year"), model=coder)
    assert r.error is None, r.error
    observation = "\n".join(str(m["content"]) for m in coder.prompts[1])
    assert page.url in observation
    assert "key in slot: False" in observation
    assert tavily.requests[0][0] == "/search"
    assert r.score == 1.0


async def test_evaluation_tasks_are_held_out_from_training(tmp_path: Path) -> None:
    env = make_env(tmp_path, "http://127.0.0.1:9/v1", eval_holdout=0.3)
    await env.setup()
    train = {t["task_id"] for t in env._train_items}
    held = {t["task_id"] for t in env._eval_items}
    assert held and train and not (train & held)
    assert train | held == {t["task_id"] for t in env.tasks}


async def test_time_budget_ends_the_trajectory_without_blame(tmp_path: Path) -> None:
    async with ScriptedOpenAIServer([]) as server:
        env = make_env(
            tmp_path,
            server.base_url,
            runtime={
                "tool_backend": "local",
                "unconfined_tools": True,
                "workspace": {"workspace_root": str(tmp_path / "ws")},
                "loop": {"time_budget_s": 1e-6},
            },
        )
        async with env.runtime():
            await env.setup()
            coder = ScriptedCoder(["final_answer(5)"])
            r = await env.rollout(task(env, "offline-txt-log"), model=coder)
    assert r.result.stop_reason == "time_budget" and r.score == 0.0 and not r.infrastructure_failure
    assert coder.prompts == []  # the budget was spent before the first call
