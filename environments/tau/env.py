"""τ²-bench (sierra-research/tau2-bench) domains: policy-following customer service with a simulated user.

    python -m environments.tau_env process --env.total_steps 2 --env.group_size 2
    python -m environments.tau_env evaluate --env.data_dir ~/tau2-bench/data/tau2 --env.task_split test
    python -m environments.tau_env process --env.user_model.base_url http://127.0.0.1:8001/v1 \\
        --env.user_model.model gpt-4.1 --env.judge.base_url http://127.0.0.1:8002/v1

Each item is one task of the domain's tasks.json. The agent gets the domain's policy as its
system prompt and the domain's tools (pure functions on the episode's own copy of the database,
run in-process: no model code runs, so no sandbox is needed); a user simulator on its own model
plays the task's customer (environments/tau/user_sim.py). The reward is the benchmark's
evaluation of the conversation (environments/tau/scoring.py). Implemented domains: retail, airline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any


from environments.agent_loop import AgentLoopConfig, AgentResult
from environments.hermes_base_env import EMBEDDED, HermesAgentBaseEnv, HermesEnvError, Rollout
from environments.tau.config import ENTRY, TauEnvConfig
from environments.models.base import ChatModel
from environments.models.chat_mode import OpenAIChatConfig, OpenAIChatModel
from environments.runtime import AgentFactory
from environments.tau.conversation import TauConversation, TauResult, domain_tools
from environments.tau.domain import Domain, get_domain
from environments.tau.scoring import GoldHashes, needs_judge, score_episode
from environments.tau.tasks import BUNDLED_DATA_DIR, DomainData, RewardType, Task, load_domain_data
from environments.tau.user_sim import GREETING, UserSimulator, judge_nl_assertions
from environments.tool_backend import LocalToolBackend, ToolBackend
from tools.context import ToolContext
from tools.registry import ToolRegistry

__all__ = ["AGENT_INSTRUCTIONS", "TauEnv", "TauEnvConfig"]

logger = logging.getLogger(__name__)

AGENT_INSTRUCTIONS = (
    "You are a customer service agent. Help the user as the policy below allows. In each turn either "
    "send the user a message or make one tool call, never both. Follow the policy at all times."
)


class TauEnv(HermesAgentBaseEnv):
    name = ENTRY.name
    env_config_cls = TauEnvConfig
    default_system_prompt = None  # the domain's policy, per task (format_prompt)

    def __init__(self, config: TauEnvConfig, server_configs, slurm: bool = False, testing: bool = False) -> None:
        try:
            self.domain: Domain = get_domain(config.domain)
        except ValueError as exc:
            raise HermesEnvError(f"--env.domain: {exc}") from None
        self._data: DomainData | None = None
        self._gold: GoldHashes | None = None  # with the data: each task's gold database hashed once
        self._user_client: Any = None  # the simulator's openai client, opened with the runtime
        self._user_url = ""
        self._judge_client: Any = None
        self._judge_url = ""
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self.config: TauEnvConfig = config

    def tool_registry(self) -> ToolRegistry:
        return ToolRegistry(domain_tools(self.domain, None))  # schemas; each conversation binds its own db

    def make_tool_backend(self) -> ToolBackend:
        # The domain's tools are pure functions on an in-memory dict and no other toolset exists in
        # this env's registry, so no model code ever runs: the workspace is an unused temp dir.
        return LocalToolBackend()

    def data(self) -> DomainData:
        if self._data is None:
            raise HermesEnvError("the τ² data loads with the items; call setup() first")
        return self._data

    async def items(self) -> list[Task]:
        c = self.config
        root = Path(c.data_dir).expanduser() if c.data_dir else BUNDLED_DATA_DIR
        try:
            self._data = await asyncio.to_thread(load_domain_data, root, c.domain, c.task_split)
        except (ValueError, OSError) as exc:
            raise HermesEnvError(f"--env.data_dir {c.data_dir or '(bundled)'}: {exc}") from None
        judged = []
        for task in self._data.tasks:
            criteria = task.evaluation_criteria
            if criteria and RewardType.ENV_ASSERTION in criteria.reward_basis and criteria.env_assertions:
                missing = {a.func_name for a in criteria.env_assertions} - set(self.domain.assertions)
                if missing:
                    raise HermesEnvError(f"task {task.id}: env assertions {sorted(missing)} are not implemented")
            if needs_judge(task):
                judged.append(task.id)
        if judged and not c.judge.base_url:  # the benchmark raises rather than score such a task without one
            kept = [t for t in self._data.tasks if t.id not in set(judged)]
            if not kept:
                raise HermesEnvError(
                    f"every {c.domain} task scores on NL_ASSERTION, which needs a judge: pass --env.judge.base_url"
                )
            logger.warning(
                "τ² %s: left out %d tasks that score on NL_ASSERTION (%s): no judge (--env.judge.base_url)",
                c.domain,
                len(judged),
                ", ".join(judged),
            )
            self._data = dataclasses.replace(self._data, tasks=kept)
        self._gold = GoldHashes(self.domain, self._data.db)
        return self._data.tasks

    async def eval_items(self) -> list[Task]:
        return self.data().tasks

    def format_prompt(self, item: Task) -> list[dict[str, Any]]:
        head = self.config.system_prompt or AGENT_INSTRUCTIONS
        system = f"<instructions>\n{head}\n</instructions>\n<policy>\n{self.data().policy}\n</policy>"
        prompt = [{"role": "system", "content": system}]
        if not self.config.rules.hide_greeting:  # the benchmark's agent has its fixed greeting in its context
            prompt.append({"role": "assistant", "content": GREETING})
        return prompt

    # ---- the user simulator's and judge's clients, alive as long as the runtime ------------------

    @asynccontextmanager
    async def runtime(self, model: Callable[[], ChatModel] | None = None) -> AsyncIterator[TauEnv]:
        async with super().runtime(model):
            u = self.config.user_model
            self._user_url = self._server_url(u.base_url, "--env.user_model.base_url")
            self._user_client = OpenAIChatModel.make_client(self._user_url, u.api_key, u.timeout_s, u.max_retries)
            j = self.config.judge
            if j.base_url:
                self._judge_url = self._server_url(j.base_url, "--env.judge.base_url")
                self._judge_client = OpenAIChatModel.make_client(self._judge_url, j.api_key, j.timeout_s)
            try:
                yield self
            finally:
                for client in (self._user_client, self._judge_client):
                    if client is not None:
                        await client.close()
                self._user_client = self._judge_client = None

    def _server_url(self, url: str, flag: str) -> str:
        if url != EMBEDDED:
            return url
        servers = self.agent_runtime.servers
        for i, server in enumerate(servers):
            if server.base_url == EMBEDDED and i < len(self.agent_runtime.base_urls):
                return self.agent_runtime.base_urls[i]
        raise HermesEnvError(
            f"{flag} embedded: the agent's model is not the embedded server here, so none runs; "
            "pass the URL of an OpenAI-compatible server for it"
        )

    def _chat_client(self, client: Any, base_url: str, model: str, seed: int | None) -> ChatModel:
        return OpenAIChatModel(
            OpenAIChatConfig(
                base_url=base_url,
                model=model,
                text_tool_parser=None,
                extra_body={"seed": seed} if seed is not None else {},
            ),
            client=client,
        )

    # ---- one conversation ----------------------------------------------------------------------

    def agent_factory(self, item: Task, for_eval: bool = False) -> AgentFactory:
        if self._user_client is None:
            raise HermesEnvError("τ² conversations run inside the env's runtime (process/serve/evaluate)")
        u, data, client, url = self.config.user_model, self.data(), self._user_client, self._user_url

        def make(model: ChatModel, tools: list[dict[str, Any]], ctx: ToolContext, loop: AgentLoopConfig, registry):
            # A fresh simulated user per conversation (also per retried attempt): it holds the dialogue.
            user = UserSimulator(
                self._chat_client(client, url, u.model, u.seed), data.user_guidelines, item.user_scenario.text(), u
            )
            return TauConversation(
                model=model,
                tools=tools,
                context=ctx,
                loop=loop,
                task=item,
                domain=self.domain,
                data=data,
                user=user,
                rules=self.config.rules,
                max_user_turns=u.max_user_turns,
                checked=registry,  # this env's registry (tool_registry): the same schemas, checked once
            )

        return make

    async def compute_reward(self, item: Task, result: AgentResult, ctx: ToolContext) -> float:
        if not isinstance(result, TauResult):
            raise HermesEnvError("a τ² task was run by another agent than TauConversation; its database is unknown")
        verdicts = None
        criteria = item.evaluation_criteria
        if (
            criteria
            and criteria.nl_assertions
            and self._judge_client is not None
            and result.ended in ("user_stop", "agent_stop")
        ):
            j = self.config.judge
            judge = self._chat_client(self._judge_client, self._judge_url, j.model, None)
            verdicts = await judge_nl_assertions(judge, result.messages, criteria.nl_assertions)
        # Gold replay on a fresh copy and two hashes of the whole database: off the event loop.
        result.score_detail = await asyncio.to_thread(
            partial(score_episode, ended=result.ended, nl_verdicts=verdicts, gold=self._gold),
            item,
            self.domain,
            self.data().db,
            result.db,
            result.messages,
        )
        return result.score_detail.reward

    def _details(self, r: Rollout) -> dict[str, Any]:
        result = r.result
        assert isinstance(result, TauResult)
        s = result.score_detail
        return {
            "task_id": f"tau2-{self.domain.name}-{r.item.id}",
            "domain": f"tau2_{self.domain.name}",
            "ended": result.ended,
            "stop_token": result.stop_token,
            "user_turns": result.user_turns,
            "db_match": s.db_match if s else None,
            "communicate": s.communicate if s else None,
            "actions_matched": s.actions if s else None,
            "nl_assertions": s.nl if s else None,
            "reward_breakdown": s.breakdown if s else None,
        }

    def build_group(self, rollouts: list[Rollout]):
        group = super().build_group(rollouts)
        for info in group["rollout_info"]:
            info.update(self._details(rollouts[info["rollout"]]))
        return group

    def eval_sample(self, rollout: Rollout) -> dict[str, Any]:
        result = rollout.result
        return {
            "item": {"id": rollout.item.id, "domain": self.domain.name},
            "score": rollout.score,
            "stop_reason": result.stop_reason if result else None,
            "error": rollout.error,
            "messages": result.messages if result else None,
            **(self._details(rollout) if isinstance(result, TauResult) else {}),
        }

    def eval_metrics(self, rollouts: list[Rollout]) -> dict[str, float]:
        out = super().eval_metrics(rollouts)
        done = [r.result.score_detail for r in rollouts if isinstance(r.result, TauResult) and r.result.score_detail]
        out["eval/db_match"] = sum(bool(s.db_match) for s in done) / len(done) if done else 0.0
        return out
