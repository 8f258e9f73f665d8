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
import jsonlines
from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from pydantic import Field

from environments.agent_loop import AgentLoopConfig, AgentResult, HermesAgentLoop
from environments.models.base import ChatModel, ModelError, ModelRequestError
from environments.models.chat_mode import PLACEHOLDER_API_KEY, OpenAIChatConfig, OpenAIChatModel
from environments.models.chat_tokens import tokenize_conversation
from environments.models.token_mode.chat_model import TokenChatConfig
from environments.models.token_mode.wiring import (
    PHASE1_NOTE,
    TokenLevelModels,
    TokenServerChoice,
    finish_logprobs,
    resolve_token_server,
    sampling_setup,
    trace_items,
)
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
    inference_logprobs: Literal["raw_logits", "sampling_policy"] = Field(
        "raw_logits",
        description="Which distribution inference_logprobs describe: raw_logits = log-softmax of the model's logits "
        "(temperature 1, no truncation; every engine's default); sampling_policy = the distribution actually sampled "
        "(temperature, top-k/top-p/min-p applied; llama.cpp post_sampling_probs)",
    )
    missing_logprobs: Literal["mask", "drop", "keep"] = Field(
        "mask",
        description="Trained tokens the server reported no logprob for: mask = not trained (mask -100); "
        "drop = leave the sequence out of the group; keep = train them with 1.0 (atroposlib's 'no logprob' marker)",
    )
    require_inference_logprobs: bool = Field(
        False, description="Refuse to start without exact tokens and logprobs (set by a `tinker:` YAML section)"
    )
    embedded_threads: int = Field(2, ge=1, description="CPU threads of the embedded llama.cpp server")
    embedded_parallel: int = Field(4, ge=1, description="Concurrent sequences of the embedded llama.cpp server")


class BoundedModel:
    """A ChatModel whose requests wait for a slot of their server's gate."""

    def __init__(self, inner: ChatModel, gate: asyncio.Semaphore) -> None:
        self.inner = inner
        self.gate = gate

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], **kwargs: Any) -> Any:
        async with self.gate:
            return await self.inner.chat(messages, tools, **kwargs)

    def token_trace(self) -> Any:
        trace = getattr(self.inner, "token_trace", None)
        return trace() if callable(trace) else None


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
        if config.max_num_workers == -1 and all(c.base_url == EMBEDDED for c in server_configs):
            # atroposlib would run 8 groups at once; the embedded server serves embedded_parallel sequences.
            config.max_num_workers = max(1, config.embedded_parallel // config.group_size)
        if config.use_wandb and not _wandb_logged_in():
            logger.warning("wandb is not logged in: running without wandb (run `wandb login` to enable it)")
            config.use_wandb = False
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self.config: HermesAgentEnvConfig = config
        if self.jsonl_writer is not None:
            # Each group reaches the file as a whole line at once: a killed command leaves the
            # groups written so far readable, never a buffered half line.
            self.jsonl_writer.close()
            self.jsonl_writer = jsonlines.open(self.config.data_path_to_save_groups, "w", flush=True)
        self.server_configs = server_configs
        self._base_urls: list[str] = [c.base_url for c in server_configs]
        self._clients: list[Any] = []
        self._server_cycle = itertools.cycle(range(len(server_configs)))
        self._tool_backend: ToolBackend | None = None
        self._consecutive_infra_failures = 0
        self._fatal: HermesEnvError | None = None
        self._groups_sent = 0
        self._groups_skipped = 0
        self.rollouts_done = 0
        self._token_models: TokenLevelModels | None = None  # Phase 2, while the runtime is up
        # atroposlib's per-server knobs, applied to our own clients: (training, evaluation) gates.
        self._request_gates = [self._gates(c) for c in server_configs]

    def _gates(self, cfg: APIServerConfig) -> tuple[asyncio.Semaphore, asyncio.Semaphore]:
        train, evaluation = cfg.num_max_requests_at_once, cfg.num_requests_for_eval
        if cfg.base_url == EMBEDDED:  # more would only queue inside llama.cpp
            train, evaluation = min(train, self.config.embedded_parallel), min(evaluation, self.config.embedded_parallel)
        return asyncio.Semaphore(max(1, train)), asyncio.Semaphore(max(1, evaluation))

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

    async def verify_and_score_trajectory(self, item: Any, result: AgentResult, ctx: ToolContext) -> float:
        return await self.compute_reward(item, result, ctx)

    def tool_registry(self) -> ToolRegistry:
        return default_registry()

    def make_tool_backend(self) -> ToolBackend:
        if self.config.tool_backend == "sandbox":
            return SandboxToolBackend(self.config.sandbox)
        return LocalToolBackend(LocalToolBackendConfig(workspace_root=self.config.workspace_root))

    def make_model(self, for_eval: bool = False) -> ChatModel:
        """A model client for one trajectory (servers are used round-robin), bounded by the server's
        `num_max_requests_at_once` (`num_requests_for_eval` for evaluation) concurrent requests."""
        index = next(self._server_cycle)
        cfg = self.server_configs[index]
        gate = self._request_gates[index][1 if for_eval else 0]
        if self._token_models is not None:
            return BoundedModel(self._token_models.make_model(index), gate)
        return BoundedModel(self._chat_model(index, cfg), gate)

    def _chat_model(self, index: int, cfg: APIServerConfig) -> OpenAIChatModel:
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
            model_timeout_s=float(max(s.timeout for s in self.server_configs)),
        )

    def initial_messages(self, item: Any) -> list[dict[str, Any]]:
        prompt = self.format_prompt(item)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        system = self.config.system_prompt or self.default_system_prompt
        if system and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": system})
        return messages

    @final
    async def rollout(
        self,
        item: Any,
        *,
        model: ChatModel | None = None,
        loop_config: AgentLoopConfig | None = None,
        for_eval: bool = False,
    ) -> Rollout:
        """One trajectory: workspace -> agent loop -> score; the workspace is always released."""
        if self._tool_backend is None:
            raise RuntimeError("rollout() outside the env's runtime; use process/serve/evaluate or `async with env.runtime()`")
        task_id = f"{type(self).__name__}-{uuid.uuid4().hex[:10]}"
        started = time.monotonic()
        model = model or self.make_model(for_eval)
        registry = self.tool_registry()
        try:
            async with self._tool_backend.trajectory(task_id) as executor:
                ctx = ToolContext(executor=executor, limits=self.tool_limits(), task_id=task_id)
                await self.setup_trajectory_workspace(item, ctx)
                loop = HermesAgentLoop(model, self.tool_schemas(), ctx, loop_config or self.loop_config(), registry)
                result = await loop.run(self.initial_messages(item))
                if result.infrastructure_failure:
                    return Rollout(item, result, None, result.error, True, time.monotonic() - started)
                score = float(await self.verify_and_score_trajectory(item, result, ctx))
        except HermesEnvError:
            raise
        except ModelRequestError as exc:  # a 4xx: the request or the config is wrong; retrying cannot help
            raise HermesEnvError(f"{exc}; fix the request options (--env.extra_body, --env.tools_in, --openai.*)") from exc
        except Exception as exc:  # the workspace/sandbox or scoring broke: not the model's failure
            logger.exception("rollout %s failed outside the model", task_id)
            return Rollout(item, None, None, f"{type(exc).__name__}: {exc}", True, time.monotonic() - started)
        if not 0.0 <= score <= 1.0:
            raise HermesEnvError(f"{type(self).__name__}.compute_reward returned {score}; rewards must lie in [0, 1]")
        self.rollouts_done += 1
        rollout = Rollout(item, result, score, None, False, time.monotonic() - started)
        # Progress inside long groups: one line per finished rollout.
        print(
            f"[hermes-rl]   rollout done: score {score:.2f}, {result.stop_reason}, {result.turns_used} turns, "
            f"{rollout.duration_s:.1f}s",
            file=sys.stderr,
        )
        trace = getattr(model, "token_trace", None)
        if callable(trace):
            rollout.extras["token_trace"] = trace()
        return rollout

    async def collect_trajectories(self, item: Any) -> tuple[ScoredDataGroup | None, list[Any]]:
        try:
            return await self._collect(item)
        except HermesEnvError as exc:
            self._set_fatal(exc)
            raise

    async def _collect(self, item: Any) -> tuple[ScoredDataGroup | None, list[Any]]:
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
            print(f"[hermes-rl] group lost to infrastructure errors, retried later: {failed[0].error}", file=sys.stderr)
            return None, [item]  # retried later, never scored as the model's failure
        self._consecutive_infra_failures = 0
        return self.build_group(usable), []

    def build_group(self, rollouts: list[Rollout]) -> ScoredDataGroup:
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        info: list[dict[str, Any]] = []
        logprobs: list[list[float]] = []
        gaps: list[int] = []
        dropped = 0
        tools = self.tool_schemas()
        for r in rollouts:
            assert r.result is not None and r.score is not None
            trace = r.extras.get("token_trace")
            if trace is not None:  # Phase 2: exact ids; one item per token sequence
                items = trace_items(trace)
            else:
                items = [(*tokenize_conversation(self.tokenizer, r.result.messages, tools), None)]
            for tokens, masks, raw_logprobs in items:
                if raw_logprobs is not None:
                    finished = finish_logprobs(masks, raw_logprobs, self.config.missing_logprobs)
                    if finished is None:
                        dropped += 1
                        continue
                    masks, item_logprobs, n_gaps = finished
                    logprobs.append(item_logprobs)
                    gaps.append(n_gaps)
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
        # Not `overrides`: trainers read that key as per-item training overrides. (run-api drops it.)
        group["rollout_info"] = info  # type: ignore[typeddict-unknown-key]
        if logprobs and len(logprobs) == len(group["tokens"]):
            group["inference_logprobs"] = logprobs
        # run-api keeps `generation_params`: the one place a trainer sees how the group was sampled.
        record = dict(self.sampling_record)
        if gaps:
            record["missing_logprobs"] = {"per_sequence": gaps, "policy": self.config.missing_logprobs, "dropped": dropped}
            if any(gaps) or dropped:
                logger.warning(
                    "%d trained tokens without a logprob (%s; %d sequences dropped)",
                    sum(gaps), self.config.missing_logprobs, dropped,
                )
        group["generation_params"] = record
        if len(group["tokens"]) != self.config.group_size:
            # Sequences split by a non-append-only template, or rollouts lost to infrastructure:
            # tell atroposlib the real size, or it drops the group as malformed.
            group["group_overrides"] = {"group_size": len(group["tokens"])}
        return group

    @property
    def sampling_record(self) -> dict[str, Any]:
        """What every group records about its sampling (overwritten when the runtime starts)."""
        return getattr(self, "_sampling_record", None) or sampling_setup(
            None, self.config.agent_temperature, self.config.agent_max_tokens, {}, "raw_logits"
        )[1]

    # ---- runtime: model server, tool backend, clean shutdown -------------------------------

    @asynccontextmanager
    async def runtime(self) -> AsyncIterator["HermesAgentBaseEnv"]:
        """Start what the env needs (embedded model, tool backend) and always stop it."""
        kind, extra = self.check_config()  # before any server starts
        async with AsyncExitStack() as stack:
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
            if kind is not None:
                self._token_models = await self._start_token_models(kind, stack, extra)
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

    def token_server_kind(self) -> str | None:
        embedded = all(url == EMBEDDED for url in self.server_configs_urls())
        tinker = self.config.require_inference_logprobs and self.config.token_server == "auto"
        return resolve_token_server(self.config.token_server, self.server_configs[0].server_type, embedded, tinker)

    def server_configs_urls(self) -> list[str]:
        return [c.base_url for c in self.server_configs]

    def check_config(self, command: str | None = None) -> tuple[str | None, dict[str, Any]]:
        """Everything that can be checked before a server starts: toolsets, token protocol,
        logprob semantics, the trainer's needs. Returns (token-server kind, extra request fields)."""
        self.tool_schemas()
        kind = self.token_server_kind()
        if kind is None and self.config.require_inference_logprobs:
            raise HermesEnvError(
                "this trainer needs inference_logprobs (tinker-atropos reads them from every group), but the model "
                "server is used in chat mode, which has none; pass --env.token_server tinker|sglang|vllm|llamacpp"
            )
        try:
            extra, record = sampling_setup(
                kind,  # type: ignore[arg-type]
                self.config.agent_temperature,
                self.config.agent_max_tokens,
                self.config.extra_body,
                self.config.inference_logprobs,
            )
        except ValueError as exc:
            raise HermesEnvError(str(exc)) from exc
        self._sampling_record = record
        return kind, extra

    async def _start_token_models(self, kind: str, stack: AsyncExitStack, extra_body: dict[str, Any]) -> TokenLevelModels:
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
                extra_body=extra_body,
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

    async def _run_evaluate(self):
        await self._in_runtime(super()._run_evaluate, report=False)

    async def _in_runtime(self, entry: Any, *, report: bool) -> None:
        ok = False
        try:
            async with self.runtime():
                # atroposlib's serve swallows errors inside groups; a config error (a 4xx from the
                # model server, a bad reward) must still stop the command, so it is raced here.
                self._fatal_event = asyncio.Event()
                main = asyncio.ensure_future(entry())
                fatal = asyncio.ensure_future(self._fatal_event.wait())
                try:
                    await asyncio.wait({main, fatal}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (main, fatal, *getattr(self, "workers", ())):
                        task.cancel()
                    await asyncio.gather(main, fatal, *getattr(self, "workers", ()), return_exceptions=True)
                if self._fatal is not None:
                    raise self._fatal
                main.result()
                ok = True
        finally:
            self._finish_output(report and ok)

    def _set_fatal(self, exc: HermesEnvError) -> None:
        if self._fatal is None:
            self._fatal = exc
        event = getattr(self, "_fatal_event", None)
        if event is not None:
            event.set()

    # ---- serve: the trainer decides how long; every group says what happened to it ----------

    async def register_env(self):
        url = self.config.rollout_server_url
        waiting_said = False
        while True:
            try:
                data = await self._register_env()
            except Exception as exc:  # tenacity's RetryError around a connection error
                cause = getattr(getattr(exc, "last_attempt", None), "exception", lambda: exc)() or exc
                raise HermesEnvError(
                    f"cannot register with the rollout API at {url} ({type(cause).__name__}: {cause}); "
                    "start it with `run-api` or pass --env.rollout_server_url"
                ) from None
            if data.get("status") == "success":
                break
            if not waiting_said:
                print(f"[hermes-rl] serve: waiting for a trainer to register with {url} ({data.get('status')})", file=sys.stderr)
                waiting_said = True
            await asyncio.sleep(1)
        self.env_id = data["env_id"]
        self.wandb_prepend = data["wandb_name"]
        self.curr_step = data["starting_step"]
        self.checkpoint_dir = data["checkpoint_dir"]
        self.checkpoint_interval = data["checkpoint_interval"]
        if self.config.total_steps == -1:
            self.config.total_steps = data["num_steps"]
            if self.config.total_steps == -1:
                raise HermesEnvError("neither --env.total_steps nor the trainer's registration sets a step count")
        print(
            f"[hermes-rl] serve: registered with {url} as {self.wandb_prepend}; the trainer's run has "
            f"{self.config.total_steps} steps (starting at {self.curr_step})",
            file=sys.stderr,
        )
        if self.curr_step > 0:
            self.load_checkpoint()

    async def env_manager(self):
        await self._in_runtime(self._serve, report=False)

    async def _serve(self) -> None:
        await BaseEnv.env_manager(self)
        step = self.status_dict.get("current_step") if isinstance(getattr(self, "status_dict", None), dict) else None
        print(
            f"[hermes-rl] serve: stopping: the trainer's run is done (step {step} of {self.config.total_steps}); "
            f"{self._groups_sent} groups sent, {self._groups_skipped} skipped",
            file=sys.stderr,
        )

    def _skip_reason(self, group: ScoredDataGroup, check_length: bool) -> str | None:
        """Why atroposlib 0.4.0's handle_send_to_api would drop this group (its checks, said aloud)."""
        expected = (group.get("group_overrides") or {}).get("group_size", self.config.group_size)
        if len(group.get("tokens", [])) != expected:
            return f"{len(group.get('tokens', []))} sequences where the group size is {expected}"
        if self.config.ensure_scores_are_not_same and len(set(group["scores"])) == 1:
            return "all scores equal, no learning signal (--env.ensure_scores_are_not_same)"
        if check_length and self.max_token_len > 0 and any(len(t) >= self.max_token_len for t in group["tokens"]):
            return f"a sequence reaches the trainer's max_token_len {self.max_token_len}"
        return None

    async def handle_send_to_api(self, scored_data, item=None, do_send_to_api=True, abort_on_any_max_length_exceeded=True):
        was_list = isinstance(scored_data, list)
        kept = []
        for group in scored_data if was_list else [scored_data]:
            if group is None:
                continue
            scores = "[" + ", ".join(f"{s:.2f}" for s in group["scores"]) + "]"
            reason = self._skip_reason(group, abort_on_any_max_length_exceeded)
            if reason is not None:
                self._groups_skipped += 1
                print(f"[hermes-rl] group skipped: {reason}; scores {scores}", file=sys.stderr)
                continue
            self._groups_sent += 1
            if getattr(self, "process_mode", False):
                total = getattr(self, "n_groups_to_process", "?")
                print(f"[hermes-rl] group {self.curr_step + 1}/{total}: written; scores {scores}", file=sys.stderr)
            else:
                print(f"[hermes-rl] group {self._groups_sent} sent to the trainer; scores {scores}", file=sys.stderr)
            kept.append(group)
        if kept:
            await super().handle_send_to_api(
                kept if was_list else kept[0], item, do_send_to_api, abort_on_any_max_length_exceeded
            )

    async def add_rollouts_for_wandb(self, scored_data, item=None):
        # atroposlib indexes `group_size` sequences; a short group (group_overrides) has fewer.
        n = len(scored_data["tokens"])
        keep = self.config.num_rollouts_per_group_for_logging
        keep = n if keep == -1 else min(keep, n)
        self.rollouts_for_wandb.append(
            [(self.tokenizer.decode(scored_data["tokens"][i]), scored_data["scores"][i]) for i in range(keep)]
        )
        if len(self.rollouts_for_wandb) > self.config.num_rollouts_to_keep:
            self.rollouts_for_wandb.pop(0)

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
        """`process` / `serve` / `evaluate`: strict flags and YAML (environments/cli.py)."""
        from environments.cli import main

        raise SystemExit(main(cls))


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
