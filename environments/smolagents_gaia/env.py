"""GAIA with smolagents' CodeAgent: the model writes Python actions, run in the trajectory's sandbox slot.

    pip install 'hermes-rl[codeact]'
    python -m environments.smolagents_gaia_env process --env.total_steps 4 --env.group_size 2

Same tasks as environments/gaia (both published layouts, the bundled offline tasks and their
attachments) and the same quasi-exact scorer. The agent is smolagents' `CodeAgent`; every
code action runs in the slot (`SlotPythonExecutor`), web search/extract are host call-outs,
`final_answer(x)` ends the trajectory through the executor. Token mode captures every model
call's exact ids (one sequence per call;
`--env.split_sequences` chooses which reach the trainer). See docs/code_actions.md.

Reward: `correctness_weight * correct + efficiency_weight * efficiency(steps)` when correct, 0
otherwise, where steps are the code actions run (`efficiency_free_calls` free, 0 at
`efficiency_max_calls`). Evaluation uses held-out tasks (`eval_holdout`), never training ones.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from pydantic import Field

from environments.agent_loop import AgentLoopConfig, AgentResult
from environments.gaia.env import GaiaAgentEnv, GaiaAgentEnvConfig, question_scorer
from environments.hermes_base_env import HermesEnvError, Rollout
from environments.models.base import ChatModel
from environments.runtime import AgentFactory
from tools.context import ToolContext
from tools.registry import ToolRegistry

from .agent import SMOLAGENTS_VERSION, CodeActAgentRun, CodeActConfig, CodeActResult
from .executor import HostTool, WebExtractTool, WebSearchTool

__all__ = ["SmolagentsGaiaEnv", "SmolagentsGaiaEnvConfig", "INSTRUCTIONS"]


INSTRUCTIONS = (
    "Attached files are in your working directory: open them with Python. When you know the answer, call "
    "final_answer(answer) with a number, as few words as possible, or a comma separated list. Write numbers "
    "with digits only: no thousands separators and no units such as $ or % unless asked. Write strings "
    "without articles or abbreviations."
)


class SmolagentsGaiaEnvConfig(GaiaAgentEnvConfig):
    # The embedded model serves 4096 tokens per sequence; smolagents' system prompt alone is ~2.4k.
    task_defaults: ClassVar[dict[str, Any]] = {
        **GaiaAgentEnvConfig.task_defaults,
        "max_token_length": 4096,
        "runtime.loop.max_turns": 6,
    }
    eval_holdout: float = Field(
        0.25, ge=0, lt=1, description="Share of tasks held out for evaluate, chosen by a hash of the task id"
    )
    max_callouts_per_action: int = Field(8, ge=0, description="Host tool calls (web) one code action may make")
    planning_interval: int | None = Field(None, ge=1, description="smolagents' planning step every N steps (None: off)")
    agent_threads: int = Field(16, ge=1, description="Worker threads running CodeAgent (each waits on the loop)")


def _held_out(task_id: str, share: float) -> bool:
    digest = hashlib.sha256(task_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


class SmolagentsGaiaEnv(GaiaAgentEnv):
    name = "smolagents_gaia"
    env_config_cls = SmolagentsGaiaEnvConfig
    default_toolsets = ["web"]  # host call-outs; files and python are the slot's own Python
    default_system_prompt = ""  # CodeAgent writes its own; INSTRUCTIONS go in as its custom instructions

    def __init__(self, config: SmolagentsGaiaEnvConfig, server_configs, slurm: bool = False, testing: bool = False):
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self.config: SmolagentsGaiaEnvConfig = config
        self._pool: ThreadPoolExecutor | None = None

    async def items(self) -> list[dict[str, Any]]:
        tasks = await super().items()
        share = self.config.eval_holdout
        train = [t for t in tasks if not _held_out(str(t["task_id"]), share)]
        self.eval_tasks = [t for t in tasks if _held_out(str(t["task_id"]), share)]
        if not train:
            raise HermesEnvError(f"every task is held out for evaluation; lower --env.eval_holdout ({share})")
        return train

    async def eval_items(self) -> list[dict[str, Any]]:
        return self.eval_tasks

    def tool_schemas(self) -> list[dict[str, Any]]:
        super().tool_schemas()  # checks the toolset flags
        return []  # CodeAgent describes its tools in its own system prompt, never as tools= in a request

    def host_tools(self) -> list[HostTool]:
        web = self.agent_runtime.registry.get("web_search") is not None
        enabled = self.enabled_toolsets()
        if web and (enabled is None or "web" in enabled) and "web" not in self.config.disabled_toolsets:
            return [WebSearchTool(), WebExtractTool()]
        return []

    def agent_factory(self, item: Any, for_eval: bool = False) -> AgentFactory:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.config.agent_threads, thread_name_prefix="codeagent")
        pool = self._pool
        config = CodeActConfig(
            host_tools=self.host_tools(),
            instructions=INSTRUCTIONS,
            max_callouts=self.config.max_callouts_per_action,
            planning_interval=self.config.planning_interval,
        )

        def make(
            model: ChatModel, tools: list[dict[str, Any]], ctx: ToolContext, loop: AgentLoopConfig, reg: ToolRegistry
        ) -> CodeActAgentRun:
            return CodeActAgentRun(model, ctx, loop, reg, config, pool)

        return make

    async def teardown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        await super().teardown()

    # ---- scoring: the answer given to final_answer(), through the executor --------------------

    @staticmethod
    def model_answer(result: AgentResult | None) -> str | None:
        if not isinstance(result, CodeActResult) or not result.has_final_answer or result.final_answer is None:
            return None
        return str(result.final_answer)

    def is_correct(self, item: dict[str, Any], result: AgentResult) -> bool:
        answer = self.model_answer(result)
        return answer is not None and question_scorer(answer, str(item["Final answer"]))

    def build_group(self, rollouts: list[Rollout]):
        group = super().build_group(rollouts)
        group["generation_params"] = {**group["generation_params"], "agent": f"smolagents {SMOLAGENTS_VERSION}"}
        for info in group["rollout_info"]:
            result = rollouts[info["rollout"]].result
            info["model_answer"] = self.model_answer(result)
            if isinstance(result, CodeActResult):
                info["steps"] = result.steps
                info["model_calls"] = result.turns_used
                info["code_actions"] = result.code_actions
                info["callouts"] = len(result.callouts)
        return group

    def eval_sample(self, rollout: Rollout) -> dict[str, Any]:
        sample = super().eval_sample(rollout)
        sample["model_answer"] = self.model_answer(rollout.result)
        if isinstance(rollout.result, CodeActResult):
            sample["code_actions"] = rollout.result.code_actions
        return sample
