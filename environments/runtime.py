"""The composition root: everything a rollout needs, wired once, used by every entry point.

The env's `process` / `serve` / `evaluate`, `batch_runner.py` and tests each build one
`AgentRuntime` from a `RuntimeConfig`. Entering it starts what the config asks for — the
embedded model server, chat-mode clients or token-mode clients, the web backend, the tool
backend — and leaving it stops them, also on errors. `rollout(...)` runs one trajectory:
workspace -> agent loop -> score, retrying infrastructure failures when asked.

Tests pass `model=` (a `ChatModel` factory) and run with no HTTP server at all.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field, field_validator

from environments.agent_loop import AgentLoopConfig, AgentResult, HermesAgentLoop
from environments.errors import HermesEnvError
from environments.models.base import ChatModel, ModelError, ModelRequestError
from environments.models.chat_mode import OpenAIChatConfig, OpenAIChatModel
from environments.models.tool_choice import check_tool_choice
from environments.models.token_mode.chat_model import TokenChatConfig
from environments.models.token_mode.servers import TokenServerConfig, TokenServerKind
from environments.models.token_mode.wiring import (
    CHAT_MODE_NOTE,
    TokenModeModels,
    TokenServerChoice,
    resolve_token_server,
)
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.model_server import EMBEDDED, EMBEDDED_MODEL_NAME, ModelServer, check_server, resolve_tokenizer_name
from environments.server_options import ServerRouter
from environments.tool_backend import ConfinementError, LocalToolBackendConfig, ToolBackend, select_tool_backend
from model_tools import builtin_tools
from tools.context import ToolContext, ToolLimits
from tools.executor import ToolExecutor
from tools.registry import ToolRegistry
from tools.web import WebBackend, WebConfig, make_web_backend, web_tools

__all__ = [
    "EMBEDDED",
    "EMBEDDED_MODEL_NAME",
    "AgentRuntime",
    "HermesEnvError",
    "ModelServer",
    "Rollout",
    "RuntimeConfig",
    "check_server",
    "resolve_tokenizer_name",
]

logger = logging.getLogger(__name__)


class RuntimeConfig(BaseModel):
    """How one command runs its rollouts: model clients, agent loop, tools and where they run.

    One class, embedded unchanged in every entry point's config: the env's (`--env.runtime.*`) and
    batch_runner's (`--runtime.*`). The model servers themselves come from each entry point (`--openai.*`,
    batch_runner's `--base_url`), so they are an argument of `AgentRuntime`, not a field here.
    """

    token_server: TokenServerChoice = Field(
        "auto",
        description="Token mode (exact ids + logprobs): the model server's token protocol, vllm | vllm_openai | "
        "sglang | llamacpp | tinker; auto = llamacpp for the embedded model, else from the server type (vllm, "
        "sglang), else chat mode; off = chat mode (OpenAI chat; tokens re-rendered, no logprobs)",
    )
    tool_call_parser: str | None = Field(
        "hermes", description="Parser for tool calls a server returns as text (None: not read)"
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
    max_context_tokens: int | None = Field(
        None, ge=1, description="Token mode: prompt + generation cap (an env also stays under max_token_length)"
    )
    model_max_retries: int = Field(2, ge=0, description="Retries of a failed model request (5xx, 429, connection)")
    loop: AgentLoopConfig = Field(
        default_factory=AgentLoopConfig, description="The agent loop: turns, budget, sampling"
    )
    tool_limits: ToolLimits = Field(default_factory=ToolLimits, description="Per-call tool timeouts and output cap")
    tool_backend: Literal["local", "sandbox"] = Field(
        "sandbox", description="Where tools run: isolated sandbox slots, or local processes (needs unconfined_tools)"
    )
    unconfined_tools: bool = Field(
        False,
        description="Run model code as this user with this machine's files and network where it cannot be "
        "confined (no bubblewrap) or with tool_backend local; see docs/security.md for what that costs",
    )
    workspace: LocalToolBackendConfig = Field(
        default_factory=LocalToolBackendConfig, description="Local workspaces (tool_backend local)"
    )
    sandbox: SandboxToolBackendConfig = Field(
        default_factory=SandboxToolBackendConfig,
        description="Sandbox slots: backend (local | docker | nomad | modal) and pool",
    )
    web: WebConfig = Field(default_factory=WebConfig, description="Backend of the web toolset, when it is offered")
    embedded_threads: int = Field(2, ge=1, description="CPU threads of the embedded llama.cpp server")
    embedded_parallel: int = Field(4, ge=1, description="Concurrent sequences of the embedded llama.cpp server")

    @field_validator("tool_call_parser", mode="before")
    @classmethod
    def _none_spelled(cls, value: Any) -> Any:
        return None if isinstance(value, str) and value.lower() == "none" else value


@dataclass
class Rollout:
    """One trajectory: the loop's result, its score, and why it might not be usable."""

    item: Any
    result: AgentResult | None
    score: float | None
    error: str | None = None
    infrastructure_failure: bool = False
    duration_s: float = 0.0
    attempts: int = 1
    extras: dict[str, Any] = field(default_factory=dict)


Setup = Callable[[ToolContext], Awaitable[None]]
# A score may instead be an async callable, run once the workspace is released (e.g. tests in a
# fresh slot: holding the agent's slot too could exhaust the pool).
Score = Callable[[AgentResult, ToolContext], Awaitable[float | Callable[[], Awaitable[float]]]]
# task_id -> the trajectory's executor as an async context manager (default: the tool backend's).
Workspace = Callable[[str], AbstractAsyncContextManager[ToolExecutor]]


class Agent(Protocol):
    """What runs one trajectory: the built-in tool-calling loop, or another agent (e.g. smolagents' CodeAgent)."""

    async def run(self, messages: list[dict[str, Any]]) -> AgentResult: ...


# (model, tool schemas, context, loop settings, registry) -> the trajectory's agent (default: HermesAgentLoop).
AgentFactory = Callable[[ChatModel, list[dict[str, Any]], ToolContext, AgentLoopConfig, ToolRegistry], Agent]


class AgentRuntime:
    """Model servers + clients, web and tool backends, registry; `rollout()` runs one trajectory."""

    def __init__(
        self,
        config: RuntimeConfig,
        *,
        servers: list[ModelServer] | None = None,
        with_web: bool = True,
        tokenizer: Any = None,
        model: Callable[[], ChatModel] | None = None,
        tools: ToolRegistry | None = None,
        tool_backend: ToolBackend | None = None,
    ) -> None:
        self.config = config
        self.servers = servers or [ModelServer()]
        self._given_backend = tool_backend  # an env's own backend (e.g. a slot pool per task image)
        self._tokenizer = tokenizer  # token mode renders with it; loaded for the embedded model when None
        self._injected_model = model
        # Built now so tool schemas are known before the runtime starts; the web backend starts on enter.
        self.web: WebBackend | None = make_web_backend(config.web) if with_web else None
        self.registry = tools or ToolRegistry([*builtin_tools(), *(web_tools(self.web) if self.web else [])])
        self._base_urls: tuple[str, ...] = ()
        self._chat_clients: list[Any] = []
        self._token_models: TokenModeModels | None = None
        self._server_cycle = itertools.cycle(range(len(self.servers)))
        self.last_server_index = 0  # the server make_model() chose last (the env gates requests per server)
        # Health-aware, least-loaded choice among several servers while the runtime runs (None: one server).
        self.router: ServerRouter | None = None
        self._tool_backend: ToolBackend | None = None
        self._stack: AsyncExitStack | None = None
        self._embedded_serves = False  # set on start: the runtime serves the embedded model itself

    # ---- lifecycle ---------------------------------------------------------------------------

    def use(self, *, model: Callable[[], ChatModel] | None, tool_backend: ToolBackend | None) -> None:
        """What the next run uses instead of the configured servers / backend (None: the configured one);
        set when a command starts, so the runtime built with the env serves the whole command."""
        if self._stack is not None:
            raise RuntimeError("AgentRuntime.use() while the runtime runs; call it before `async with`")
        self._injected_model, self._given_backend = model, tool_backend

    async def __aenter__(self) -> AgentRuntime:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await self._start(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        self._tool_backend, self._token_models, self._chat_clients, self.router = None, None, [], None
        if stack is not None:
            await stack.aclose()

    async def _start(self, stack: AsyncExitStack) -> None:
        c = self.config
        backend = self._given_backend
        if backend is None:  # chosen first: a run that cannot confine model code stops before anything starts
            try:
                backend = await select_tool_backend(
                    c.tool_backend, c.workspace, c.sandbox, unconfined=c.unconfined_tools
                )
            except ConfinementError as exc:
                raise HermesEnvError(str(exc)) from None
        if self.web is not None:  # a missing key or corpus fails before a model server starts
            await self._start_web(self.web, stack)
        if self._injected_model is None:
            await self._start_models(stack)
            if len(self.servers) > 1:
                checked = [s.health_check and s.base_url != EMBEDDED for s in self.servers]
                probes = [partial(self.probe, i) for i in range(len(self.servers))]
                self.router = await stack.enter_async_context(ServerRouter(checked, probes))
        await backend.start()
        stack.push_async_callback(backend.stop)
        self._tool_backend = backend

    @staticmethod
    async def _start_web(web: WebBackend, stack: AsyncExitStack) -> None:
        try:
            await web.start()
        except Exception as exc:
            await web.stop()
            raise HermesEnvError(f"the web backend could not start: {exc}") from exc
        stack.push_async_callback(web.stop)

    async def _start_models(self, stack: AsyncExitStack) -> None:
        c = self.config
        urls = []
        for server in self.servers:
            if server.base_url != EMBEDDED:
                urls.append(server.base_url)
                continue
            from embedded_llm import EmbeddedLLM, EmbeddedLLMConfig

            llm = EmbeddedLLM(EmbeddedLLMConfig(threads=c.embedded_threads, n_parallel=c.embedded_parallel))
            print(f"[hermes-rl] starting the embedded model server ({server.model}) ...", file=sys.stderr)
            await stack.enter_async_context(llm)
            urls.append(llm.base_url)
            print(f"[hermes-rl] embedded model server at {llm.base_url}", file=sys.stderr)
        self._base_urls = tuple(urls)
        embedded = all(s.base_url == EMBEDDED for s in self.servers)
        kind = resolve_token_server(c.token_server, self.servers[0].server_type, embedded)
        self._embedded_serves = embedded and kind == "llamacpp"  # (llama.cpp's chat endpoint ignores tool_choice)
        loop = self.loop_for(c.loop)
        try:
            check_tool_choice([loop.tool_choice, loop.first_turn_tool_choice], kind, c.tools_in, c.extra_body)
        except ValueError as exc:
            raise HermesEnvError(str(exc)) from None
        if kind is not None:
            self._token_models = await self._start_token_mode(kind, stack)
            return
        for url, server in zip(urls, self.servers):
            await check_server(url, model=None if server.base_url == EMBEDDED else server.model)
            logger.warning(CHAT_MODE_NOTE.format(url=url))
        self._chat_clients = [
            OpenAIChatModel.make_client(url, s.api_key, s.timeout_s, c.model_max_retries)
            for url, s in zip(urls, self.servers)
        ]
        for client in self._chat_clients:
            stack.push_async_callback(client.close)

    async def _start_token_mode(self, kind: TokenServerKind, stack: AsyncExitStack) -> TokenModeModels:
        """Token mode: token-server clients + the chat template, checked before any rollout."""
        c = self.config
        if c.tool_call_parser is None:
            raise HermesEnvError(
                "token mode reads tool calls from the generated text: name a runtime.tool_call_parser (e.g. hermes)"
            )
        tokenizer = self._tokenizer
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(resolve_tokenizer_name(EMBEDDED, self.servers))
        try:
            servers = [
                TokenServerConfig(
                    kind=kind,
                    base_url=url,
                    model=s.model,
                    api_key=s.api_key,
                    timeout_s=s.timeout_s,
                    extra_body=c.extra_body,
                )
                for url, s in zip(self._base_urls, self.servers)
            ]
            models = TokenModeModels(
                servers,
                tokenizer,
                c.chat_template_path,
                TokenChatConfig(tool_call_parser=c.tool_call_parser, max_context_tokens=c.max_context_tokens),
            )
        except (ValueError, OSError) as exc:  # TemplateError, a missing template file
            raise HermesEnvError(f"token mode ({kind}) cannot render this model's chat template: {exc}") from exc
        stack.push_async_callback(models.aclose)
        try:
            await models.check()
        except ModelError as exc:
            raise HermesEnvError(str(exc)) from exc
        urls = ", ".join(self._base_urls)
        print(f"[hermes-rl] token mode: exact tokens from {kind} token server(s) {urls}", file=sys.stderr)
        return models

    # ---- parts ------------------------------------------------------------------------------

    @property
    def mode(self) -> Literal["chat", "token", "injected"]:
        if self._injected_model is not None:
            return "injected"
        return "token" if self._token_models is not None else "chat"

    @property
    def tool_backend(self) -> ToolBackend | None:
        """The started tool backend (None outside the runtime)."""
        return self._tool_backend

    @property
    def base_urls(self) -> tuple[str, ...]:
        """The servers' URLs once started (the embedded server's real address included)."""
        return self._base_urls

    def tool_schemas(self, enabled: list[str] | None, disabled: list[str] | None = None) -> list[dict[str, Any]]:
        try:
            return self.registry.definitions(enabled, disabled or [])
        except ValueError as exc:
            raise HermesEnvError(f"bad toolsets: {exc}") from exc

    def make_model(self, index: int | None = None) -> ChatModel:
        """A model client for one trajectory on server `index` (None: servers are used round-robin)."""
        if self._injected_model is not None:
            return self._injected_model()
        if index is None:
            index = next(self._server_cycle)
        self.last_server_index = index
        if self._token_models is not None:
            return self._token_models.make_model(index)
        if not self._chat_clients:
            raise RuntimeError("make_model() outside the runtime; use `async with AgentRuntime(...)`")
        server = self.servers[index]
        c = self.config
        return OpenAIChatModel(
            OpenAIChatConfig(
                base_url=self._base_urls[index],
                model=server.model,
                api_key=server.api_key,
                timeout_s=server.timeout_s,
                max_retries=c.model_max_retries,
                text_tool_parser=c.tool_call_parser,
                extra_body=c.extra_body,
                tools_in=c.tools_in,
            ),
            client=self._chat_clients[index],
        )

    async def probe(self, index: int) -> None:
        """Raise when server `index` does not answer its health endpoint (the token protocol's, or GET /models)."""
        if self._token_models is not None:
            await self._token_models.clients[index].check()
        else:
            await check_server(self._base_urls[index], timeout_s=5.0)

    def loop_for(self, loop: AgentLoopConfig) -> AgentLoopConfig:
        """`loop` with an unset first-turn tool_choice made `required` where this runtime serves the
        embedded model in token mode (a 135M model seldom calls a tool unprompted)."""
        if loop.first_turn_tool_choice is None and self._embedded_serves and self._injected_model is None:
            return loop.model_copy(update={"first_turn_tool_choice": "required"})
        return loop

    # ---- one trajectory ------------------------------------------------------------------------

    async def rollout(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        item: Any = None,
        setup: Setup | None = None,
        score: Score | None = None,
        loop: AgentLoopConfig | None = None,
        model: ChatModel | None = None,
        task_id: str | None = None,
        attempts: int = 1,
        backoff_s: float = 1.0,
        workspace: Workspace | None = None,
        agent: AgentFactory | None = None,
    ) -> Rollout:
        """Workspace -> setup -> agent loop -> score; the workspace is always released.

        An infrastructure failure (model server, workspace, sandbox) is tried again up to
        `attempts` times and, if it persists, returned with `infrastructure_failure=True`,
        never scored as the model's failure.
        """
        task_id = task_id or f"rollout-{uuid.uuid4().hex[:10]}"
        rollout = Rollout(item, None, None, "no attempt made", True)
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                await asyncio.sleep(backoff_s * 2 ** (attempt - 2))
            router, routed = self.router, None
            if model is None and router is not None and self._injected_model is None:
                routed = router.acquire([1] * len(self.servers))  # healthy, fewest trajectories in flight
                model = self.make_model(routed)
            try:
                rollout = await self._rollout_once(
                    messages, tools, item, setup, score, loop, model, task_id, workspace, agent
                )
            finally:
                if router is not None and routed is not None:
                    router.release(routed)
            rollout.attempts = attempt
            if not rollout.infrastructure_failure:
                break
            model = None  # a retry gets a fresh client (token mode holds one trajectory's ids)
        return rollout

    async def _rollout_once(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        item: Any,
        setup: Setup | None,
        score: Score | None,
        loop: AgentLoopConfig | None,
        model: ChatModel | None,
        task_id: str,
        workspace: Workspace | None = None,
        agent_factory: AgentFactory | None = None,
    ) -> Rollout:
        if self._tool_backend is None:
            raise RuntimeError("rollout() outside the runtime; use `async with AgentRuntime(...)`")
        started = time.monotonic()
        model = model or self.make_model()
        value: float | None = None
        deferred: Callable[[], Awaitable[float]] | None = None
        try:
            async with (workspace or self._tool_backend.trajectory)(task_id) as executor:
                ctx = ToolContext(executor=executor, limits=self.config.tool_limits, task_id=task_id)
                if setup is not None:
                    await setup(ctx)
                loop_config = self.loop_for(loop or self.config.loop)
                agent = (agent_factory or HermesAgentLoop)(model, tools, ctx, loop_config, self.registry)
                result = await agent.run(messages)
                if result.infrastructure_failure:
                    return Rollout(item, result, None, result.error, True, time.monotonic() - started)
                if score is not None:
                    scored = await score(result, ctx)
                    deferred, value = (scored, None) if callable(scored) else (None, float(scored))
            if deferred is not None:
                value = float(await deferred())
        except HermesEnvError:
            raise
        except ModelRequestError as exc:  # a 4xx: the request or config is wrong; retrying cannot help
            raise HermesEnvError(
                f"{exc}; fix the request options (runtime.extra_body, runtime.tools_in, the server options)"
            ) from exc
        except Exception as exc:  # the workspace/sandbox or scoring broke: not the model's failure
            logger.exception("rollout %s failed outside the model", task_id)
            return Rollout(item, None, None, f"{type(exc).__name__}: {exc}", True, time.monotonic() - started)
        # Rewards are the task's raw numbers (Harbor's reward.txt may say 2.0 or -1); only a non-number is a bug.
        if value is not None and not math.isfinite(value):
            raise HermesEnvError(f"the reward of {task_id} is {value}; rewards must be finite numbers")
        rollout = Rollout(item, result, value, None, False, time.monotonic() - started)
        # Token mode: the exact ids of this trajectory (an agent that calls the model its own way holds them).
        trace = getattr(agent, "token_trace", None) or getattr(model, "token_trace", None)
        if callable(trace):
            rollout.extras["token_trace"] = trace()
        return rollout
