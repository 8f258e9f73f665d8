"""The hooks a task env implements (or keeps the defaults of): its items, prompts, reward and
workspace, and optionally its own tools, agent or per-item limits. No atroposlib here: the env's
adapter (environments/hermes_base_env.py) calls these."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from environments.agent_loop import AgentLoopConfig, AgentResult
from environments.models.base import ChatModel
from environments.runtime import AgentFactory, AgentRuntime, Rollout
from environments.tool_backend import ToolBackend
from tools.context import ToolContext
from tools.executor import ToolExecutor
from tools.registry import ToolRegistry

__all__ = ["TaskHooks"]


class TaskHooks:
    """What a task author overrides; the defaults here are what an env gets without doing so."""

    default_toolsets: list[str] | None = None  # subclasses name the toolsets their task needs
    default_system_prompt: str | None = None
    agent_runtime: AgentRuntime  # built by HermesAgentBaseEnv.__init__

    async def items(self) -> Sequence[Any]:
        """The training items, loaded once by `setup`; `get_next_item` cycles through them."""
        raise NotImplementedError(f"{type(self).__name__} must implement items() (or setup and get_next_item)")

    def check_data(self) -> None:
        """Refuse, as a HermesEnvError, data that cannot be read (missing, unparsable, empty): called before
        any model server, file or process starts (default: nothing to check). A local file read here
        may be kept for `items()`."""

    async def eval_items(self) -> Sequence[Any]:
        """The items `evaluate` runs at temperature 0 (default: none)."""
        return []

    def format_prompt(self, item: Any) -> str | list[dict[str, Any]]:
        """The user turn(s) for this item."""
        raise NotImplementedError

    async def compute_reward(self, item: Any, result: AgentResult, ctx: ToolContext) -> float:
        """Score one finished trajectory in [0, 1]; ctx reaches its workspace."""
        raise NotImplementedError

    async def setup_trajectory_workspace(self, item: Any, ctx: ToolContext) -> None:
        """Prepare the trajectory's workspace before the agent starts (default: nothing)."""

    def make_tool_backend(self) -> ToolBackend | None:
        """The env's own tool backend (None: the runtime builds one from --env.runtime.tool_backend)."""
        return None

    def open_workspace(self, item: Any, task_id: str) -> AbstractAsyncContextManager[ToolExecutor]:
        """This trajectory's executor (default: a workspace of the tool backend; e.g. a slot of the item's image)."""
        backend = self.agent_runtime.tool_backend
        if backend is None:
            raise RuntimeError("rollout() outside the env's runtime; use process/serve/evaluate or `env.runtime()`")
        return backend.trajectory(task_id)

    def eval_sample(self, rollout: Rollout) -> dict[str, Any]:
        """One line of the saved evaluation samples."""
        result = rollout.result
        return {
            "item": rollout.item,
            "response": result.final_response if result else None,
            "score": rollout.score,
            "stop_reason": result.stop_reason if result else None,
            "error": rollout.error,
            "messages": result.messages if result else None,
        }

    def eval_metrics(self, rollouts: list[Rollout]) -> dict[str, float]:
        """The score metrics of one evaluation (default: mean score, and the share scoring 1.0)."""
        scores = [r.score for r in rollouts if r.score is not None]
        return {
            "eval/accuracy": sum(scores) / len(scores) if scores else 0.0,
            "eval/solved": sum(s == 1.0 for s in scores) / len(scores) if scores else 0.0,  # partial credit aside
        }

    def tool_registry(self) -> ToolRegistry | None:
        """The tools offered (None: the built-in toolsets, plus `web` when it is enabled)."""
        return None

    def item_loop_config(self, item: Any, loop: AgentLoopConfig) -> AgentLoopConfig:
        """The loop settings for one item (default: the env's); a task may carry its own limits."""
        return loop

    def agent_factory(self, item: Any, for_eval: bool = False) -> AgentFactory | None:
        """The agent that runs this item's trajectory (None: the built-in tool-calling loop)."""
        return None

    def scripted_agent(self) -> Callable[[], ChatModel] | None:
        """A scripted check agent (e.g. an oracle) that stands in for the model servers; None: the model."""
        return None
