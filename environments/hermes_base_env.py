"""HermesAgentBaseEnv: atroposlib's BaseEnv for tool-using agents.

A task env subclasses it and implements `setup`, `get_next_item`, `format_prompt`,
`compute_reward(item, result, ctx)` and `evaluate`; it gets atroposlib's `process`,
`serve` and `evaluate` commands with `--env.*` / `--openai.*` flags.

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
import itertools
import logging
import netrc
import os
import re
import sys
import time
import uuid
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Literal, final

import httpx
from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from pydantic import Field

from environments.agent_loop import AgentLoopConfig, AgentResult, HermesAgentLoop
from environments.models.base import ChatModel, ModelError
from environments.models.chat_mode import PLACEHOLDER_API_KEY, OpenAIChatConfig, OpenAIChatModel
from environments.models.chat_tokens import tokenize_conversation
from environments.models.token_mode.chat_model import TokenChatConfig
from environments.models.token_mode.wiring import PHASE1_NOTE, TokenLevelModels, TokenServerChoice, resolve_token_server, trace_items
from environments.tool_backend import LocalToolBackend, LocalToolBackendConfig, ToolBackend
from environments.sandbox_backend import SandboxToolBackend, SandboxToolBackendConfig
from model_tools import default_registry
from tools.context import ToolContext, ToolLimits
from tools.registry import ToolRegistry

__all__ = ["EMBEDDED", "HermesAgentEnvConfig", "HermesAgentBaseEnv", "HermesEnvError", "Rollout", "embedded_server_configs"]

logger = logging.getLogger(__name__)

# `--openai.base_url embedded` / `--env.tokenizer_name embedded`: the bundled SmolLM2 model.
EMBEDDED = "embedded"


class HermesEnvError(RuntimeError):
    """A problem the user must fix (bad URL, unreachable server, bad config): printed without a traceback."""


class HermesAgentEnvConfig(BaseEnvConfig):
    enabled_toolsets: list[str] | None = Field(None, description="Toolsets offered to the model (None: the env's default)")
    disabled_toolsets: list[str] = Field(default_factory=list, description="Toolsets never offered")
    max_agent_turns: int = Field(8, ge=1, description="Model calls per trajectory")
    agent_time_budget_s: float = Field(300.0, gt=0, description="Wall-clock budget of one trajectory")
    system_prompt: str | None = Field(None, description="System prompt (None: the env's default)")
    agent_temperature: float = Field(0.7, ge=0, description="Sampling temperature of agent turns")
    agent_max_tokens: int | None = Field(512, ge=1, description="Cap on tokens per agent turn")
    tool_timeout_s: float = Field(30.0, gt=0, description="Default timeout of a terminal command")
    tool_max_timeout_s: float = Field(300.0, gt=0, description="Largest timeout a model may ask for")
    tool_max_output_chars: int = Field(20_000, gt=0, description="Cap on a tool's output")
    python_timeout_s: float = Field(30.0, gt=0, description="Timeout of one python tool call")
    tool_call_parser: str = Field("hermes", description="Parser for tool calls a server returns as text")
    token_server: TokenServerChoice = Field(
        "auto",
        description="Exact tokens (Phase 2): the model server's token protocol, vllm | vllm_openai | sglang | llamacpp; "
        "auto = llamacpp for the embedded model, else from --openai.server_type (vllm, sglang); off = Phase 1 chat (re-rendered tokens, no logprobs)",
    )
    chat_template_path: str | None = Field(
        None, description="Phase 2: the model's chat template (.jinja) when the tokenizer has none or another one"
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


def embedded_server_configs() -> list[APIServerConfig]:
    """The default server list: the embedded model, as a list (atroposlib 0.4 replaces a bare config)."""
    return [
        APIServerConfig(
            base_url=EMBEDDED,
            model_name="SmolLM2-135M-Instruct",
            api_key=PLACEHOLDER_API_KEY,
            server_type="openai",
            health_check=False,
            num_requests_for_eval=8,
            timeout=600,
        )
    ]


@dataclass
class Rollout:
    """One trajectory: the loop's result, its score, and why it might not be usable."""

    item: Any
    result: AgentResult | None
    score: float | None
    error: str | None = None
    infrastructure_failure: bool = False
    duration_s: float = 0.0
    extras: dict[str, Any] = field(default_factory=dict)


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
        config.tokenizer_name = self._resolve_tokenizer(config.tokenizer_name, server_configs)
        if config.use_wandb and not _wandb_logged_in():
            logger.warning("wandb is not logged in: running without wandb (run `wandb login` to enable it)")
            config.use_wandb = False
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self.config: HermesAgentEnvConfig = config
        self.server_configs = server_configs
        self._base_urls: list[str] = [c.base_url for c in server_configs]
        self._clients: list[Any] = []
        self._server_cycle = itertools.cycle(range(len(server_configs)))
        self._tool_backend: ToolBackend | None = None
        self._consecutive_infra_failures = 0
        self.rollouts_done = 0
        self._token_models: TokenLevelModels | None = None  # Phase 2, while the runtime is up

    @staticmethod
    def _resolve_tokenizer(name: str, server_configs: list[APIServerConfig]) -> str:
        """'embedded' -> the GGUF's own tokenizer, built locally (BaseEnv would ask the hub)."""
        if name != EMBEDDED:
            return name
        if any(c.base_url != EMBEDDED for c in server_configs):
            # Another server with the default tokenizer: prefer that model's own tokenizer.
            cfg = next(c for c in server_configs if c.base_url != EMBEDDED)
            candidate = cfg.tokenizer_name if cfg.tokenizer_name not in ("", "none") else cfg.model_name
            # Only names that can be a hub repo ("org/name") or a local directory are worth a lookup;
            # an API model name such as "gpt-4o" would only stall on the hub's retries.
            looks_loadable = Path(candidate).is_dir() or re.fullmatch(r"[\w.-]+/[\w.-]+", candidate)
            try:
                if not looks_loadable:
                    raise LookupError(f"{candidate!r} names no tokenizer repository")
                from transformers import AutoTokenizer

                AutoTokenizer.from_pretrained(candidate)
                return candidate
            except Exception as exc:  # offline, or a closed model such as gpt-4o
                logger.warning(
                    "could not load tokenizer %r (%s); Phase 1 tokens will use the embedded model's tokenizer. "
                    "Pass --env.tokenizer_name to choose one.", candidate, type(exc).__name__
                )
        from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer

        embedded = EmbeddedLLMConfig()
        return str(ensure_gguf_tokenizer(embedded.model_path, chat_template=embedded.resolved_chat_template()))

    # ---- hooks for task envs -------------------------------------------------------------

    def format_prompt(self, item: Any) -> str | list[dict[str, Any]]:
        """The user turn(s) for this item."""
        raise NotImplementedError

    async def compute_reward(self, item: Any, result: AgentResult, ctx: ToolContext) -> float:
        """Score one finished trajectory in [0, 1]; ctx reaches its workspace."""
        raise NotImplementedError

    async def setup_trajectory_workspace(self, item: Any, ctx: ToolContext) -> None:
        """Prepare the trajectory's workspace before the agent starts (default: nothing)."""

    def open_workspace(self, item: Any, task_id: str) -> Any:
        """The async context manager giving this trajectory its executor (e.g. a slot of the item's image)."""
        return self._tool_backend.trajectory(task_id)

    async def verify_and_score_trajectory(self, item: Any, result: AgentResult, ctx: ToolContext) -> float:
        return await self.compute_reward(item, result, ctx)

    def tool_registry(self) -> ToolRegistry:
        return default_registry()

    def make_tool_backend(self) -> ToolBackend:
        if self.config.tool_backend == "sandbox":
            return SandboxToolBackend(self.config.sandbox)
        return LocalToolBackend(LocalToolBackendConfig(workspace_root=self.config.workspace_root))

    def make_model(self) -> ChatModel:
        """A model client for one trajectory (servers are used round-robin)."""
        index = next(self._server_cycle)
        cfg = self.server_configs[index]
        if self._token_models is not None:
            return self._token_models.make_model(index)
        return OpenAIChatModel(
            OpenAIChatConfig(
                base_url=self._base_urls[index],
                model=cfg.model_name,
                api_key=cfg.api_key,
                timeout_s=float(cfg.timeout),
                text_tool_parser=self.config.tool_call_parser,
                extra_body=self.config.extra_body,
                tools_in=self.config.tools_in,
            ),
            client=self._clients[index] if self._clients else None,
        )

    # ---- the rollout ---------------------------------------------------------------------

    def tool_schemas(self) -> list[dict[str, Any]]:
        enabled = self.config.enabled_toolsets if self.config.enabled_toolsets is not None else self.default_toolsets
        try:
            return self.tool_registry().definitions(enabled, self.config.disabled_toolsets)
        except ValueError as exc:
            raise HermesEnvError(f"bad --env.enabled_toolsets/--env.disabled_toolsets: {exc}") from exc

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

    def initial_messages(self, item: Any) -> list[dict[str, Any]]:
        prompt = self.format_prompt(item)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        system = self.config.system_prompt or self.default_system_prompt
        if system and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": system})
        return messages

    @final
    async def rollout(self, item: Any, *, model: ChatModel | None = None, loop_config: AgentLoopConfig | None = None) -> Rollout:
        """One trajectory: workspace -> agent loop -> score; the workspace is always released."""
        if self._tool_backend is None:
            raise RuntimeError("rollout() outside the env's runtime; use process/serve/evaluate or `async with env.runtime()`")
        task_id = f"{type(self).__name__}-{uuid.uuid4().hex[:10]}"
        started = time.monotonic()
        model = model or self.make_model()
        registry = self.tool_registry()
        try:
            async with self.open_workspace(item, task_id) as executor:
                ctx = ToolContext(executor=executor, limits=self.tool_limits(), task_id=task_id)
                await self.setup_trajectory_workspace(item, ctx)
                loop = HermesAgentLoop(model, self.tool_schemas(), ctx, loop_config or self.loop_config(), registry)
                result = await loop.run(self.initial_messages(item))
                if result.infrastructure_failure:
                    return Rollout(item, result, None, result.error, True, time.monotonic() - started)
                score = float(await self.verify_and_score_trajectory(item, result, ctx))
        except HermesEnvError:
            raise
        except Exception as exc:  # the workspace/sandbox or scoring broke: not the model's failure
            logger.exception("rollout %s failed outside the model", task_id)
            return Rollout(item, None, None, f"{type(exc).__name__}: {exc}", True, time.monotonic() - started)
        if not 0.0 <= score <= 1.0:
            raise HermesEnvError(f"{type(self).__name__}.compute_reward returned {score}; rewards must lie in [0, 1]")
        self.rollouts_done += 1
        rollout = Rollout(item, result, score, None, False, time.monotonic() - started)
        trace = getattr(model, "token_trace", None)
        if callable(trace):
            rollout.extras["token_trace"] = trace()
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
            if trace is not None:  # Phase 2: exact ids; one item per token sequence
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
        group["rollout_info"] = info  # type: ignore[typeddict-unknown-key]
        if logprobs and len(logprobs) == len(group["tokens"]):
            group["inference_logprobs"] = logprobs
        if len(group["tokens"]) != self.config.group_size:
            # Sequences split by a non-append-only template, or rollouts lost to infrastructure:
            # tell atroposlib the real size, or it drops the group as malformed.
            group["group_overrides"] = {"group_size": len(group["tokens"])}
        return group

    # ---- runtime: model server, tool backend, clean shutdown -------------------------------

    @asynccontextmanager
    async def runtime(self) -> AsyncIterator["HermesAgentBaseEnv"]:
        """Start what the env needs (embedded model, tool backend) and always stop it."""
        async with AsyncExitStack() as stack:
            embedded = all(url == EMBEDDED for url in self._base_urls)
            for i, url in enumerate(self._base_urls):
                if url == EMBEDDED:
                    from embedded_llm import EmbeddedLLM, EmbeddedLLMConfig

                    llm = EmbeddedLLM(
                        EmbeddedLLMConfig(threads=self.config.embedded_threads, n_parallel=self.config.embedded_parallel)
                    )
                    print(f"[hermes-rl] starting the embedded model server ({self.server_configs[i].model_name}) ...", file=sys.stderr)
                    await stack.enter_async_context(llm)
                    self._base_urls[i] = llm.base_url
                    print(f"[hermes-rl] embedded model server at {llm.base_url}", file=sys.stderr)
            kind = resolve_token_server(self.config.token_server, self.server_configs[0].server_type, embedded)
            if kind is not None:
                self._token_models = await self._start_token_models(kind, stack)
            for url in self._base_urls:
                if kind is None:
                    await check_server(url)
                    logger.warning(PHASE1_NOTE.format(url=url))
            self._clients = [
                OpenAIChatModel.make_client(url, cfg.api_key, float(cfg.timeout), self.config.model_max_retries)
                for url, cfg in zip(self._base_urls, self.server_configs)
            ]
            for client in self._clients:
                stack.push_async_callback(client.close)
            backend = self.make_tool_backend()
            await backend.start()
            stack.push_async_callback(backend.stop)
            self._tool_backend = backend
            try:
                yield self
            finally:
                self._tool_backend = None
                self._token_models = None

    async def _start_token_models(self, kind: str, stack: AsyncExitStack) -> TokenLevelModels:
        """Phase 2: token-server clients + the chat template, checked before any rollout."""
        try:
            models = TokenLevelModels(
                kind,  # type: ignore[arg-type]
                list(zip(self._base_urls, self.server_configs)),
                self.tokenizer,
                self.config.chat_template_path,
                TokenChatConfig(
                    tool_call_parser=self.config.tool_call_parser,
                    # Stay under the trainer's length: longer groups would be dropped by atroposlib.
                    max_context_tokens=self.config.max_token_length - 1 if self.config.max_token_length > 1 else None,
                ),
                extra_body=self.config.extra_body,
            )
        except (ValueError, OSError) as exc:  # TemplateError, a missing template file
            raise HermesEnvError(f"Phase 2 ({kind}) cannot render this model's chat template: {exc}") from exc
        stack.push_async_callback(models.aclose)
        try:
            await models.check()
        except ModelError as exc:
            raise HermesEnvError(str(exc)) from exc
        print(f"[hermes-rl] Phase 2: exact tokens from {kind} token server(s) {', '.join(self._base_urls)}", file=sys.stderr)
        return models

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


async def check_server(base_url: str, timeout_s: float = 10.0) -> None:
    """Fail fast, naming the URL, when an OpenAI-compatible server does not answer."""
    url = base_url.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(url)
    except httpx.HTTPError as exc:
        raise HermesEnvError(
            f"cannot reach the model server at {base_url} ({type(exc).__name__}: {exc}); "
            "check --openai.base_url, or omit it to use the embedded model"
        ) from exc
    if response.status_code in (401, 403):
        raise HermesEnvError(
            f"the model server at {base_url} rejected the API key (HTTP {response.status_code}); check --openai.api_key"
        )
    if response.status_code >= 500 or response.status_code == 404:
        raise HermesEnvError(
            f"the model server at {base_url} answered GET /models with HTTP {response.status_code}; "
            "is this an OpenAI-compatible base URL (usually ending in /v1)?"
        )
