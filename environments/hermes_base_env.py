"""HermesAgentBaseEnv: atroposlib's BaseEnv for tool-using agents.

A task env subclasses it and implements `items()`, `format_prompt(item)` and
`compute_reward(item, result, ctx)` (optionally `eval_items()` and
`setup_trajectory_workspace(item, ctx)`); it gets atroposlib's `process`, `serve` and
`evaluate` commands with `--env.*` / `--openai.*` flags. The smallest one is
environments/examples/count_files.py. Models, tools and rollouts live in the composition
root (environments/runtime.py); this class is the atroposlib glue around it.

What this class adds around atroposlib 0.4.0 (each a trap a user must not hit):
- the default model is the embedded llama.cpp server (`--openai.base_url embedded`),
  started and stopped with the command; its tokenizer is built from the GGUF, offline;
- wandb is switched off when nobody is logged in (atroposlib's `process` forces it on);
- placeholder API keys for local servers (openai>=1 refuses an empty key), and no
  atroposlib health-check traffic (we never route requests through its ServerManager);
- an unreachable model server fails the command at once, naming the URL, with no
  half-written output; infrastructure failures are never scored as the model's.
"""

from __future__ import annotations

import asyncio
import logging
import netrc
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Literal, final

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from pydantic import Field

from environments.agent_loop import AgentLoopConfig, AgentResult
from environments.models.base import ChatModel
from environments.models.chat_mode import PLACEHOLDER_API_KEY
from environments.models.chat_tokens import tokenize_conversation
from environments.models.token_mode.wiring import TokenServerChoice, trace_items
from environments.runtime import (
    EMBEDDED,
    EMBEDDED_MODEL_NAME,
    AgentRuntime,
    HermesEnvError,
    ModelServer,
    Rollout,
    RuntimeConfig,
    resolve_tokenizer_name,
)
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.tool_backend import LocalToolBackendConfig, ToolBackend
from tools.context import ToolContext, ToolLimits
from tools.executor import ToolExecutor
from tools.registry import ToolRegistry
from tools.web import WebConfig

__all__ = ["EMBEDDED", "HermesAgentEnvConfig", "HermesAgentBaseEnv", "HermesEnvError", "Rollout", "embedded_server_configs"]

logger = logging.getLogger(__name__)

_LOOP_DEFAULTS = AgentLoopConfig()  # one set of loop defaults for the env and batch_runner


class HermesAgentEnvConfig(BaseEnvConfig):
    enabled_toolsets: list[str] | None = Field(None, description="Toolsets offered to the model (None: the env's default)")
    disabled_toolsets: list[str] = Field(default_factory=list, description="Toolsets never offered")
    max_agent_turns: int = Field(_LOOP_DEFAULTS.max_turns, ge=1, description="Model calls per trajectory")
    agent_time_budget_s: float = Field(
        _LOOP_DEFAULTS.time_budget_s, gt=0, description="Wall-clock budget of one trajectory"
    )
    system_prompt: str | None = Field(None, description="System prompt (None: the env's default)")
    agent_temperature: float = Field(_LOOP_DEFAULTS.temperature, ge=0, description="Sampling temperature of agent turns")
    agent_max_tokens: int | None = Field(_LOOP_DEFAULTS.max_tokens, ge=1, description="Cap on tokens per agent turn")
    tool_timeout_s: float = Field(30.0, gt=0, description="Default timeout of a terminal command")
    tool_max_timeout_s: float = Field(300.0, gt=0, description="Largest timeout a model may ask for")
    tool_max_output_chars: int = Field(20_000, gt=0, description="Cap on a tool's output")
    python_timeout_s: float = Field(30.0, gt=0, description="Timeout of one python tool call")
    tool_call_parser: str = Field("hermes", description="Parser for tool calls a server returns as text")
    token_server: TokenServerChoice = Field(
        "auto",
        description="Token mode (exact ids + logprobs): the model server's token protocol, vllm | vllm_openai | "
        "sglang | llamacpp; auto = llamacpp for the embedded model, else from --openai.server_type (vllm, sglang); "
        "off = chat mode (OpenAI chat; tokens re-rendered, no logprobs)",
    )
    chat_template_path: str | None = Field(
        None, description="Token mode: the model's chat template (.jinja) when the tokenizer has none or another one"
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="Extra fields for every chat request (e.g. a llama.cpp 'grammar')"
    )
    tools_in: Literal["request", "system_prompt"] = Field(
        "request", description="How tools reach the model: tools= in the request, or Hermes text in the system prompt"
    )
    workspace_root: str | None = Field(None, description="Where per-trajectory workspaces go (default: a temp dir)")
    tool_backend: Literal["local", "sandbox"] = Field(
        "local", description="Where tools run: local processes (trusted tasks), or isolated sandbox slots"
    )
    sandbox: SandboxToolBackendConfig = Field(
        default_factory=SandboxToolBackendConfig, description="Sandbox slots: backend (local | nomad | modal) and pool"
    )
    model_max_retries: int = Field(2, ge=0, description="Retries of a failed model request (5xx, 429, connection)")
    rollout_infra_retries: int = Field(
        1, ge=0, description="Times a rollout lost to an infrastructure error is run again to fill its group"
    )
    max_consecutive_infra_failures: int = Field(
        3, ge=1, description="Groups in a row lost to infrastructure errors before the command stops"
    )
    embedded_threads: int = Field(2, ge=1, description="CPU threads of the embedded llama.cpp server")
    embedded_parallel: int = Field(4, ge=1, description="Concurrent sequences of the embedded llama.cpp server")
    web: WebConfig = Field(default_factory=WebConfig, description="Backend of the web toolset, when it is enabled")
    eval_size: int | None = Field(None, ge=1, description="Eval items used by evaluate (None: all)")


def embedded_server_configs() -> list[APIServerConfig]:
    """The default server list: the embedded model, as a list (atroposlib 0.4 replaces a bare config)."""
    return [
        APIServerConfig(
            base_url=EMBEDDED,
            model_name=EMBEDDED_MODEL_NAME,
            api_key=PLACEHOLDER_API_KEY,
            server_type="openai",
            health_check=False,
            num_requests_for_eval=8,
            timeout=600,
        )
    ]


def _wandb_logged_in() -> bool:
    """Whether wandb has credentials, checked the way wandb finds them (key or netrc), without prompting."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return True
    try:
        auth = netrc.netrc().authenticators("api.wandb.ai")
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return bool(auth and auth[2])


class HermesAgentBaseEnv(BaseEnv):
    env_config_cls = HermesAgentEnvConfig
    default_toolsets: list[str] | None = None  # subclasses name the toolsets their task needs
    default_system_prompt: str | None = None

    def __init__(
        self,
        config: HermesAgentEnvConfig,
        server_configs: list[APIServerConfig],
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        if not isinstance(server_configs, list) or not server_configs:
            raise HermesEnvError(
                "HermesAgentBaseEnv needs a non-empty list of APIServerConfig (atroposlib 0.4 replaces a "
                "single config with localhost:9004-9007); return a list from config_init"
            )
        for cfg in server_configs:
            if not cfg.api_key:
                cfg.api_key = PLACEHOLDER_API_KEY
            # We send requests through our own client; atroposlib's checks would only add load.
            cfg.health_check = False
            if cfg.base_url != EMBEDDED and not str(cfg.base_url).startswith(("http://", "https://")):
                raise HermesEnvError(
                    f"--openai.base_url {cfg.base_url!r} is not an http(s) URL; pass e.g. "
                    f"http://127.0.0.1:8000/v1, or '{EMBEDDED}' for the bundled model"
                )
        config.tokenizer_name = resolve_tokenizer_name(config.tokenizer_name, _model_servers(server_configs))
        if config.use_wandb and not _wandb_logged_in():
            logger.warning("wandb is not logged in: running without wandb (run `wandb login` to enable it)")
            config.use_wandb = False
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self.config: HermesAgentEnvConfig = config
        self.server_configs = server_configs
        self._consecutive_infra_failures = 0
        self.rollouts_done = 0
        self._train_items: list[Any] = []
        self._eval_items: list[Any] = []
        self._next_item = 0
        self.agent_runtime = AgentRuntime(self.runtime_config(), tokenizer=self.tokenizer, tools=self.tool_registry())

    @classmethod
    def config_init(cls) -> tuple[HermesAgentEnvConfig, list[APIServerConfig]]:
        """Defaults for the CLI: the env's config class on the embedded model, output under out/<name>."""
        config = cls.env_config_cls(
            tokenizer_name=EMBEDDED,
            group_size=2,
            total_steps=2,
            max_token_length=4096,
            use_wandb=False,
            data_path_to_save_groups=f"out/{cls.name}.jsonl",
            data_dir_to_save_evals=f"out/{cls.name}_eval",
        )
        return config, embedded_server_configs()

    # ---- hooks for task envs -------------------------------------------------------------

    async def items(self) -> Sequence[Any]:
        """The training items, loaded once by `setup`; `get_next_item` cycles through them."""
        raise NotImplementedError(f"{type(self).__name__} must implement items() (or setup and get_next_item)")

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
        """The env's own tool backend (None: the runtime builds one from --env.tool_backend)."""
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

    def tool_registry(self) -> ToolRegistry | None:
        """The tools offered (None: the built-in toolsets, plus `web` when it is enabled)."""
        return None

    # ---- defaults atroposlib asks for ------------------------------------------------------

    async def setup(self) -> None:
        self._train_items = list(await self.items())
        self._eval_items = list(await self.eval_items())[: self.config.eval_size]
        if not self._train_items:
            raise HermesEnvError(f"{type(self).__name__}.items() returned no items")
        self._next_item = 0

    async def get_next_item(self) -> Any:
        item = self._train_items[self._next_item % len(self._train_items)]
        self._next_item += 1
        return item

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Every eval item once at temperature 0; mean score as eval/accuracy; samples saved."""
        loop_config = self.loop_config().model_copy(update={"temperature": 0.0})
        start = time.time()
        rollouts = await asyncio.gather(*(self.rollout(item, loop_config=loop_config) for item in self._eval_items))
        scores = [r.score for r in rollouts if r.score is not None]
        metrics = {
            "eval/accuracy": sum(scores) / len(scores) if scores else 0.0,
            "eval/infrastructure_failures": sum(r.infrastructure_failure for r in rollouts),
            "eval/n": len(rollouts),
        }
        print(f"[hermes-rl] evaluation: {metrics}")
        await self.evaluate_log(
            metrics=metrics,
            samples=[self.eval_sample(r) for r in rollouts],
            start_time=start,
            end_time=time.time(),
            generation_parameters={"temperature": 0.0, "max_tokens": loop_config.max_tokens},
        )

    # ---- the rollout ---------------------------------------------------------------------

    def enabled_toolsets(self) -> list[str] | None:
        return self.config.enabled_toolsets if self.config.enabled_toolsets is not None else self.default_toolsets

    def tool_schemas(self) -> list[dict[str, Any]]:
        try:
            return self.agent_runtime.tool_schemas(self.enabled_toolsets(), self.config.disabled_toolsets)
        except HermesEnvError as exc:
            raise HermesEnvError(f"--env.enabled_toolsets/--env.disabled_toolsets: {exc}") from exc

    def tool_limits(self) -> ToolLimits:
        c = self.config
        return ToolLimits(
            default_timeout_s=c.tool_timeout_s,
            max_timeout_s=c.tool_max_timeout_s,
            max_output_chars=c.tool_max_output_chars,
            python_timeout_s=c.python_timeout_s,
        )

    def loop_config(self) -> AgentLoopConfig:
        c = self.config
        return AgentLoopConfig(
            max_turns=c.max_agent_turns,
            time_budget_s=c.agent_time_budget_s,
            temperature=c.agent_temperature,
            max_tokens=c.agent_max_tokens,
        )

    def runtime_config(self) -> RuntimeConfig:
        """The env config, as the composition root's config."""
        c = self.config
        enabled = self.enabled_toolsets()
        web_on = (enabled is None or "web" in enabled) and "web" not in c.disabled_toolsets
        return RuntimeConfig(
            servers=_model_servers(self.server_configs),
            token_server=c.token_server,
            tool_call_parser=c.tool_call_parser,
            chat_template_path=c.chat_template_path,
            extra_body=c.extra_body,
            tools_in=c.tools_in,
            # Stay under the trainer's length: longer groups would be dropped by atroposlib.
            max_context_tokens=c.max_token_length - 1 if c.max_token_length > 1 else None,
            model_max_retries=c.model_max_retries,
            loop=self.loop_config(),
            tool_limits=self.tool_limits(),
            tool_backend=c.tool_backend,
            workspace=LocalToolBackendConfig(workspace_root=c.workspace_root),
            sandbox=c.sandbox,
            web=c.web if web_on else None,
            embedded_threads=c.embedded_threads,
            embedded_parallel=c.embedded_parallel,
        )

    def make_model(self) -> ChatModel:
        """A model client for one trajectory (servers are used round-robin)."""
        return self.agent_runtime.make_model()

    def initial_messages(self, item: Any) -> list[dict[str, Any]]:
        prompt = self.format_prompt(item)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        system = self.config.system_prompt or self.default_system_prompt
        if system and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": system})
        return messages

    @final
    async def rollout(self, item: Any, *, model: ChatModel | None = None, loop_config: AgentLoopConfig | None = None) -> Rollout:
        """One trajectory through the runtime: workspace -> agent loop -> compute_reward."""

        async def setup(ctx: ToolContext) -> None:
            await self.setup_trajectory_workspace(item, ctx)

        async def score(result: AgentResult, ctx: ToolContext) -> float:
            return await self.compute_reward(item, result, ctx)

        rollout = await self.agent_runtime.rollout(
            self.initial_messages(item),
            self.tool_schemas(),
            item=item,
            setup=setup,
            score=score,
            loop=loop_config or self.loop_config(),
            model=model or self.make_model(),
            task_id=f"{type(self).__name__}-{uuid.uuid4().hex[:10]}",
            workspace=lambda task_id: self.open_workspace(item, task_id),
        )
        if not rollout.infrastructure_failure:
            self.rollouts_done += 1
        return rollout

    async def collect_trajectories(self, item: Any) -> tuple[ScoredDataGroup | None, list[Any]]:
        rollouts = list(await asyncio.gather(*(self.rollout(item) for _ in range(self.config.group_size))))
        for _ in range(self.config.rollout_infra_retries):
            redo = [i for i, r in enumerate(rollouts) if r.infrastructure_failure]
            if not redo or len(redo) == len(rollouts):  # all failed: likely down; the group is retried later
                break
            for i, r in zip(redo, await asyncio.gather(*(self.rollout(item) for _ in redo))):
                rollouts[i] = r
        usable = [r for r in rollouts if not r.infrastructure_failure]
        failed = [r for r in rollouts if r.infrastructure_failure]
        if failed:
            logger.warning("%d/%d rollouts hit infrastructure errors: %s", len(failed), len(rollouts), failed[0].error)
        if not usable:
            self._consecutive_infra_failures += 1
            if self._consecutive_infra_failures >= self.config.max_consecutive_infra_failures:
                raise HermesEnvError(
                    f"{self._consecutive_infra_failures} groups in a row failed on infrastructure errors; last: {failed[0].error}"
                )
            return None, [item]  # retried later, never scored as the model's failure
        self._consecutive_infra_failures = 0
        if getattr(self, "process_mode", False):
            # atroposlib logs progress at INFO, which is off by default; long runs must show life.
            total = getattr(self, "n_groups_to_process", "?")
            scores = ", ".join(f"{r.score:.2f}" for r in usable)
            slowest = max(r.duration_s for r in usable)
            print(f"[hermes-rl] group {self.curr_step + 1}/{total}: scores [{scores}] ({slowest:.1f}s)", file=sys.stderr)
        return self.build_group(usable), []

    def build_group(self, rollouts: list[Rollout]) -> ScoredDataGroup:
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        info: list[dict[str, Any]] = []
        logprobs: list[list[float]] = []
        tools = self.tool_schemas()
        for r in rollouts:
            assert r.result is not None and r.score is not None
            trace = r.extras.get("token_trace")
            if trace is not None:  # token mode: exact ids; one item per token sequence
                items = trace_items(trace)
            else:
                items = [(*tokenize_conversation(self.tokenizer, r.result.messages, tools), None)]
            for tokens, masks, item_logprobs in items:
                if item_logprobs is not None:
                    logprobs.append(item_logprobs)
                group["tokens"].append(tokens)
                group["masks"].append(masks)
                group["scores"].append(r.score)
                group["messages"].append(r.result.messages)
                info.append(
                    {
                        "stop_reason": r.result.stop_reason,
                        "turns": r.result.turns_used,
                        "tool_calls": r.result.tool_call_count,
                        "tool_errors": len(r.result.tool_errors),
                        "duration_s": round(r.duration_s, 3),
                        "token_sequences": len(items),
                    }
                )
        # Not `overrides`: trainers read that key as per-item training overrides.
        group["rollout_info"] = info
        if logprobs and len(logprobs) == len(group["tokens"]):
            group["inference_logprobs"] = logprobs
        if len(group["tokens"]) != self.config.group_size:
            # Sequences split by a non-append-only template, or rollouts lost to infrastructure:
            # tell atroposlib the real size, or it drops the group as malformed.
            group["group_overrides"] = {"group_size": len(group["tokens"])}
        return group

    # ---- runtime: model server, tool backend, clean shutdown -------------------------------

    @asynccontextmanager
    async def runtime(self, model: Callable[[], ChatModel] | None = None) -> AsyncIterator[HermesAgentBaseEnv]:
        """Start what the env needs (model server, tool backend) and always stop it.

        `model` replaces the configured servers with a `ChatModel` factory (tests: no HTTP server).
        """
        self.agent_runtime = AgentRuntime(
            self.runtime_config(),
            tokenizer=self.tokenizer,
            tools=self.tool_registry(),
            model=model,
            tool_backend=self.make_tool_backend(),
        )
        async with self.agent_runtime:
            yield self

    # atroposlib's three entry points, each inside the runtime. BaseEnv opens the groups file
    # in every mode (evaluate writes none), so each one closes it and removes it when empty.
    async def process_manager(self):
        await self._in_runtime(super().process_manager, report=True)

    async def env_manager(self):
        await self._in_runtime(super().env_manager, report=False)

    async def _run_evaluate(self):
        await self._in_runtime(super()._run_evaluate, report=False)

    async def _in_runtime(self, entry: Any, *, report: bool) -> None:
        ok = False
        try:
            async with self.runtime():
                await entry()
                ok = True
        finally:
            self._finish_output(report and ok)

    def _finish_output(self, report: bool) -> None:
        path = self.config.data_path_to_save_groups
        if self.jsonl_writer is not None and not getattr(self.jsonl_writer, "closed", False):
            self.jsonl_writer.close()
        if path is None:
            return
        jsonl = Path(path)
        if jsonl.exists() and jsonl.stat().st_size == 0:
            jsonl.unlink()  # never leave an empty output that looks like a result
            return
        if not report:
            return
        html = jsonl.with_suffix(".html")
        print(f"[hermes-rl] wrote {self.curr_step} groups to {jsonl.resolve()}")
        if html.exists():
            print(f"[hermes-rl] HTML view: {html.resolve()}")

    @classmethod
    def cli(cls):
        try:
            super().cli()
        except HermesEnvError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None


def _model_servers(server_configs: list[APIServerConfig]) -> list[ModelServer]:
    """atroposlib's server configs, as the runtime's."""
    return [
        ModelServer(
            base_url=c.base_url,
            model=c.model_name,
            api_key=c.api_key,
            timeout_s=float(c.timeout),
            server_type=c.server_type,
            tokenizer=c.tokenizer_name if c.tokenizer_name not in ("", "none") else None,
        )
        for c in server_configs
    ]
