"""HermesAgentBaseEnv: atroposlib's BaseEnv for tool-using agents.

A task env subclasses it and implements `items()`, `format_prompt(item)` and
`compute_reward(item, result, ctx)` (optionally `eval_items()`, `eval_sample(rollout)`,
`eval_metrics(rollouts)` and `setup_trajectory_workspace(item, ctx)`); it gets atroposlib's
`process`, `serve` and `evaluate` commands with `--env.*` / `--openai.*` flags. The smallest one is
environments/examples/count_files.py. Models, tools and rollouts live in the composition
root (environments/runtime.py); this class is the atroposlib glue around it.

What this class adds around atroposlib 0.4.0 (each a trap a user must not hit):
- the default model is the embedded llama.cpp server (`--openai.base_url embedded`),
  started and stopped with the command; its tokenizer is built from the GGUF, offline;
- wandb is switched off when nobody is logged in (atroposlib's `process` forces it on);
- placeholder API keys for local servers (openai>=1 refuses an empty key); atroposlib's server
  options honoured or refused in one line (health checks and least-loaded routing, --slurm,
  --testing, server_type trl: environments/server_options.py);
- `serve` posts only groups run-api releases and prints what it answered (environments/trainer_boundary.py);
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
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator, Literal, final

import jsonlines
from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from pydantic import Field

from environments.agent_loop import AgentLoopConfig, AgentResult
from environments.cli import main as cli_main
from environments.gc_tuning import GCConfig, collector
from environments.models.base import ChatModel
from environments.models.chat_mode import PLACEHOLDER_API_KEY
from environments.models.chat_tokens import tokenize_conversation
from environments.models.token_mode.wiring import (
    TokenServerChoice,
    TokenServerKind,
    finish_logprobs,
    resolve_token_server,
    sampling_setup,
    trace_items,
)
from environments.runtime import (
    EMBEDDED,
    AgentFactory,
    EMBEDDED_MODEL_NAME,
    AgentRuntime,
    HermesEnvError,
    ModelServer,
    Rollout,
    RuntimeConfig,
    resolve_tokenizer_name,
)
from environments.sandbox_backend import SandboxToolBackendConfig
from environments.server_options import ServerRouter, refuse_unsupported
from environments.tool_backend import LocalToolBackendConfig, ToolBackend
from environments.trainer_boundary import RunApiBoundary, SendLedger, SplitSequences, select_sequences
from tools.context import ToolContext, ToolLimits
from tools.executor import ToolExecutor
from tools.registry import ToolRegistry
from tools.web import WebConfig

__all__ = [
    "EMBEDDED",
    "HermesAgentEnvConfig",
    "HermesAgentBaseEnv",
    "HermesEnvError",
    "Rollout",
    "embedded_server_configs",
]

logger = logging.getLogger(__name__)

_LOOP_DEFAULTS = AgentLoopConfig()  # one set of loop defaults for the env and batch_runner


class HermesAgentEnvConfig(BaseEnvConfig):
    enabled_toolsets: list[str] | None = Field(
        None, description="Toolsets offered to the model (None: the env's default)"
    )
    disabled_toolsets: list[str] = Field(default_factory=list, description="Toolsets never offered")
    max_agent_turns: int = Field(_LOOP_DEFAULTS.max_turns, ge=1, description="Model calls per trajectory")
    agent_time_budget_s: float = Field(
        _LOOP_DEFAULTS.time_budget_s, gt=0, description="Wall-clock budget of one trajectory"
    )
    system_prompt: str | None = Field(None, description="System prompt (None: the env's default)")
    agent_temperature: float = Field(
        _LOOP_DEFAULTS.temperature, ge=0, description="Sampling temperature of agent turns"
    )
    agent_max_tokens: int | None = Field(_LOOP_DEFAULTS.max_tokens, ge=1, description="Cap on tokens per agent turn")
    tool_timeout_s: float = Field(30.0, gt=0, description="Default timeout of a terminal command")
    tool_max_timeout_s: float = Field(300.0, gt=0, description="Largest timeout a model may ask for")
    tool_max_output_chars: int = Field(20_000, gt=0, description="Cap on a tool's output")
    python_timeout_s: float = Field(30.0, gt=0, description="Timeout of one python tool call")
    tool_call_parser: str = Field("hermes", description="Parser for tool calls a server returns as text")
    token_server: TokenServerChoice = Field(
        "auto",
        description="Token mode (exact ids + logprobs): the model server's token protocol, vllm | vllm_openai | "
        "sglang | llamacpp | tinker; auto = llamacpp for the embedded model, else from --openai.server_type (vllm, sglang); "
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
    workspace_root: str | None = Field(
        None, description="Where per-trajectory workspaces go with tool_backend local (default: a temp dir)"
    )
    tool_backend: Literal["local", "sandbox"] = Field(
        "sandbox", description="Where tools run: isolated sandbox slots, or local processes (needs unconfined_tools)"
    )
    unconfined_tools: bool = Field(
        False,
        description="Run model code as this user with this machine's files and network where it cannot be "
        "confined (no bubblewrap) or with tool_backend local; see docs/security.md for what that costs",
    )
    sandbox: SandboxToolBackendConfig = Field(
        default_factory=SandboxToolBackendConfig, description="Sandbox slots: backend (local | nomad | modal) and pool"
    )
    model_max_retries: int = Field(2, ge=0, description="Retries of a failed model request (5xx, 429, connection)")
    rollout_infra_retries: int = Field(
        1, ge=0, description="Times a rollout lost to an infrastructure error is run again to fill its group"
    )
    split_sequences: SplitSequences = Field(
        "last",
        description="Rollouts that span several token sequences (a template that is not append-only): last = the "
        "rollout's last sequence only (groups keep group_size sequences, which run-api releases); all = every "
        "sequence, tagged with its rollout in group_overrides.sequence_rollouts (process output; docs/trainers.md)",
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
        False, description="Refuse to start without token mode's logprobs (set by a `tinker:` YAML section)"
    )
    embedded_threads: int = Field(2, ge=1, description="CPU threads of the embedded llama.cpp server")
    embedded_parallel: int = Field(4, ge=1, description="Concurrent sequences of the embedded llama.cpp server")
    web: WebConfig = Field(default_factory=WebConfig, description="Backend of the web toolset, when it is enabled")
    eval_size: int | None = Field(None, ge=1, description="Eval items used by evaluate (None: all)")
    gc: GCConfig = Field(
        default_factory=GCConfig, description="Collector settings while the command runs (environments/gc_tuning.py)"
    )


class BoundedModel:
    """A ChatModel whose requests wait for a slot of their server's gate (atroposlib's
    `num_max_requests_at_once` / `num_requests_for_eval`, applied to our own clients)."""

    def __init__(self, inner: ChatModel, gate: asyncio.Semaphore, on_close: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.gate = gate
        self._on_close = on_close

    def close(self) -> None:
        """The trajectory is over: its server has one trajectory less in flight."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

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


class HermesAgentBaseEnv(RunApiBoundary, BaseEnv):
    env_config_cls = HermesAgentEnvConfig
    jsonl_writer: Any  # atroposlib's groups file (a jsonlines.Writer) or None
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
        refused = refuse_unsupported(slurm, testing, server_configs)
        if refused is not None:
            raise HermesEnvError(refused)
        for cfg in server_configs:
            if not cfg.api_key:
                cfg.api_key = PLACEHOLDER_API_KEY
            if cfg.base_url != EMBEDDED and not str(cfg.base_url).startswith(("http://", "https://")):
                raise HermesEnvError(
                    f"--openai.base_url {cfg.base_url!r} is not an http(s) URL; pass e.g. "
                    f"http://127.0.0.1:8000/v1, or '{EMBEDDED}' for the bundled model"
                )
        config.tokenizer_name = resolve_tokenizer_name(config.tokenizer_name, _model_servers(server_configs))
        for cfg in server_configs:
            if cfg.server_type != "openai" and cfg.tokenizer_name in ("", "none"):
                # atroposlib's sglang/vllm server classes load a tokenizer by model name from the hub at
                # construction (we never route requests through them): give them the env's, found locally.
                cfg.tokenizer_name = config.tokenizer_name
        if config.max_num_workers == -1 and all(c.base_url == EMBEDDED for c in server_configs):
            # atroposlib would run 8 groups at once; the embedded server serves embedded_parallel sequences.
            config.max_num_workers = max(1, config.embedded_parallel // config.group_size)
        if config.use_wandb and not _wandb_logged_in():
            logger.warning("wandb is not logged in: running without wandb (run `wandb login` to enable it)")
            config.use_wandb = False
        # atroposlib's ServerManager would start its own health-check tasks; ours route (ServerRouter).
        health_checks = [c.health_check and c.base_url != EMBEDDED for c in server_configs]
        for cfg in server_configs:
            cfg.health_check = False
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self._health_checks = health_checks
        self._router: ServerRouter | None = None
        self.config: HermesAgentEnvConfig = config
        self.server_configs = server_configs
        if self.jsonl_writer is not None:
            # Each group reaches the file as a whole line at once: a killed command leaves the
            # groups written so far readable, never a buffered half line.
            self.jsonl_writer.close()
            self.jsonl_writer = jsonlines.open(self.config.data_path_to_save_groups, "w", flush=True)
        self._request_gates = [self._gates(c) for c in server_configs]
        self._fatal: HermesEnvError | None = None
        self._fatal_event: asyncio.Event | None = None
        self._groups_sent = 0
        self._ledger = SendLedger()
        self._trainer_done: asyncio.Event | None = None
        self._sent_enough: asyncio.Event | None = None
        self._start_step = 0
        self._sampling_record: dict[str, Any] | None = None
        self._token_choice: tuple[str | None, dict[str, Any]] | None = None
        self._consecutive_infra_failures = 0
        self.rollouts_done = 0
        self._train_items: list[Any] = []
        self._eval_items: list[Any] = []
        self._next_item = 0
        self.agent_runtime = AgentRuntime(self.runtime_config(), tokenizer=self.tokenizer, tools=self.tool_registry())

    def _gates(self, cfg: APIServerConfig) -> tuple[asyncio.Semaphore, asyncio.Semaphore]:
        train, evaluation = cfg.num_max_requests_at_once, cfg.num_requests_for_eval
        if cfg.base_url == EMBEDDED:  # more would only queue inside llama.cpp
            train, evaluation = (
                min(train, self.config.embedded_parallel),
                min(evaluation, self.config.embedded_parallel),
            )
        return asyncio.Semaphore(max(1, train)), asyncio.Semaphore(max(1, evaluation))

    @classmethod
    def config_init(cls) -> tuple[HermesAgentEnvConfig, list[APIServerConfig]]:
        """Defaults for the CLI: the env's config class on the embedded model, output under out/<name>."""
        defaults: dict[str, Any] = dict(
            tokenizer_name=EMBEDDED,
            group_size=2,
            total_steps=2,
            max_token_length=4096,
            use_wandb=False,
            data_path_to_save_groups=f"out/{cls.name}.jsonl",
            data_dir_to_save_evals=f"out/{cls.name}_eval",
            # atroposlib cancels a serve group after 600 s and loses it; a group may take a full
            # trajectory budget plus a slow model call (the request timeout) per rollout.
            worker_timeout=1800,
        )
        # A field the task's config class declares again keeps the task's own default.
        declared = {
            name
            for klass in cls.env_config_cls.__mro__
            if issubclass(klass, HermesAgentEnvConfig) and klass is not HermesAgentEnvConfig
            for name in vars(klass).get("__annotations__", {})
        }
        config = cls.env_config_cls(**{k: v for k, v in defaults.items() if k not in declared})
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
        rollouts = await asyncio.gather(
            *(self.rollout(item, loop_config=loop_config, for_eval=True) for item in self._eval_items)
        )
        # Rollouts lost to infrastructure are no one's score: left out of the metrics and of n.
        scored = [r for r in rollouts if not r.infrastructure_failure]
        lost = [r for r in rollouts if r.infrastructure_failure]
        metrics = {
            **(self.eval_metrics(scored) if scored else {}),
            "eval/infrastructure_failures": len(lost),
            "eval/n": len(scored),
        }
        if lost:
            print(
                f"[hermes-rl] evaluation: {len(lost)} of {len(rollouts)} rollouts lost to infrastructure, "
                f"not scored (first: {lost[0].error})",
                file=sys.stderr,
            )
        if scored:
            print(f"[hermes-rl] evaluation: {metrics}")
        await self.evaluate_log(
            metrics=metrics,
            samples=[self.eval_sample(r) for r in rollouts],
            start_time=start,
            end_time=time.time(),
            generation_parameters={"temperature": 0.0, "max_tokens": loop_config.max_tokens},
        )
        if lost and not scored:
            raise HermesEnvError(
                f"evaluation lost to infrastructure: {len(lost)} of {len(rollouts)} rollouts failed, none was "
                f"scored, so there is no accuracy (first: {lost[0].error}); the samples say what failed"
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
            model_timeout_s=float(max(s.timeout for s in self.server_configs)),
        )

    def token_server_kind(self) -> TokenServerKind | None:
        embedded = all(c.base_url == EMBEDDED for c in self.server_configs)
        tinker = self.config.require_inference_logprobs and self.config.token_server == "auto"
        return resolve_token_server(self.config.token_server, self.server_configs[0].server_type, embedded, tinker)

    def check_config(self, command: str | None = None) -> tuple[str | None, dict[str, Any]]:
        """What can be checked before a server starts: toolsets, token protocol, logprob
        semantics, the trainer's needs. Returns (token-server kind, request fields to send)."""
        self.tool_schemas()
        if command == "serve" and self.config.split_sequences == "all":
            raise HermesEnvError(
                "--env.split_sequences all makes groups of more than group_size sequences, which run-api buffers "
                "instead of releasing; serve with --env.split_sequences last (docs/trainers.md)"
            )
        return self._token_setup()

    def _token_setup(self) -> tuple[str | None, dict[str, Any]]:
        """The token server and request fields, resolved once: the env's runtime and the CLI's check share them."""
        if self._token_choice is not None:
            return self._token_choice
        kind = self.token_server_kind()
        if kind is None and self.config.require_inference_logprobs:
            raise HermesEnvError(
                "this trainer needs inference_logprobs (tinker-atropos reads them from every group), but the model "
                "server is used in chat mode, which has none; pass --env.token_server tinker|sglang|vllm|llamacpp"
            )
        try:
            extra, record = sampling_setup(
                kind,
                self.config.agent_temperature,
                self.config.agent_max_tokens,
                self.config.extra_body,
                self.config.inference_logprobs,
            )
        except ValueError as exc:
            raise HermesEnvError(str(exc)) from exc
        self._sampling_record = record
        self._token_choice = (kind, extra)
        return self._token_choice

    @property
    def sampling_record(self) -> dict[str, Any]:
        """What every group records about its sampling (run-api keeps `generation_params`)."""
        if self._sampling_record is None:
            self._token_setup()
        assert self._sampling_record is not None
        return self._sampling_record

    def runtime_config(self) -> RuntimeConfig:
        """The env config, as the composition root's config."""
        c = self.config
        kind, extra_body = self._token_setup()
        enabled = self.enabled_toolsets()
        web_on = (enabled is None or "web" in enabled) and "web" not in c.disabled_toolsets
        return RuntimeConfig(
            servers=_model_servers(self.server_configs),
            token_server=kind or "off",  # resolved here: a `tinker:` section picks tinker
            tool_call_parser=c.tool_call_parser,
            chat_template_path=c.chat_template_path,
            extra_body=extra_body,
            tools_in=c.tools_in,
            # Stay under the trainer's length: longer groups would be dropped by atroposlib.
            max_context_tokens=c.max_token_length - 1 if c.max_token_length > 1 else None,
            model_max_retries=c.model_max_retries,
            loop=self.loop_config(),
            tool_limits=self.tool_limits(),
            tool_backend=c.tool_backend,
            unconfined_tools=c.unconfined_tools,
            workspace=LocalToolBackendConfig(workspace_root=c.workspace_root),
            sandbox=c.sandbox,
            web=c.web if web_on else None,
            embedded_threads=c.embedded_threads,
            embedded_parallel=c.embedded_parallel,
        )

    def item_loop_config(self, item: Any, loop: AgentLoopConfig) -> AgentLoopConfig:
        """The loop settings for one item (default: the env's); a task may carry its own limits."""
        return loop

    def agent_factory(self, item: Any, for_eval: bool = False) -> AgentFactory | None:
        """The agent that runs this item's trajectory (None: the built-in tool-calling loop)."""
        return None

    def scripted_agent(self) -> Callable[[], ChatModel] | None:
        """A scripted check agent (e.g. an oracle) that stands in for the model servers; None: the model."""
        return None

    def make_model(self, for_eval: bool = False) -> ChatModel:
        """A model client for one trajectory on the healthy server with the most free request slots
        (environments/server_options.py), bounded by that server's `num_max_requests_at_once`
        (`num_requests_for_eval` for evaluation)."""
        slot = 1 if for_eval else 0
        router = self._router
        if router is None:  # outside the runtime, or an injected model: round-robin as before
            model = self.agent_runtime.make_model()
            return BoundedModel(model, self._request_gates[self.agent_runtime.last_server_index][slot])
        capacity = [
            getattr(c, "num_requests_for_eval" if for_eval else "num_max_requests_at_once") for c in self.server_configs
        ]
        index = router.acquire(capacity)
        model = self.agent_runtime.make_model(index)
        return BoundedModel(model, self._request_gates[index][slot], on_close=lambda: router.release(index))

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
        """One trajectory through the runtime: workspace -> agent loop -> compute_reward."""

        async def setup(ctx: ToolContext) -> None:
            await self.setup_trajectory_workspace(item, ctx)

        async def score(result: AgentResult, ctx: ToolContext) -> float:
            return await self.compute_reward(item, result, ctx)

        chosen = model or self.make_model(for_eval)
        try:
            rollout = await self.agent_runtime.rollout(
                self.initial_messages(item),
                self.tool_schemas(),
                item=item,
                setup=setup,
                score=score,
                loop=self.item_loop_config(item, loop_config or self.loop_config()),
                model=chosen,
                task_id=f"{type(self).__name__}-{uuid.uuid4().hex[:10]}",
                workspace=lambda task_id: self.open_workspace(item, task_id),
                agent=self.agent_factory(item, for_eval),
            )
        finally:
            if isinstance(chosen, BoundedModel):
                chosen.close()
        if not rollout.infrastructure_failure and rollout.result is not None:
            self.rollouts_done += 1
            # Progress inside long groups: one line per finished rollout.
            print(
                f"[hermes-rl]   rollout done: score {rollout.score if rollout.score is not None else float('nan'):.2f}, "
                f"{rollout.result.stop_reason}, {rollout.result.turns_used} turns, {rollout.duration_s:.1f}s",
                file=sys.stderr,
            )
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
        group = self.build_group(usable)
        if not group["tokens"]:  # every rollout's data was unusable: skip the item, say why
            reason = "; ".join(group.get("left_out") or ["no token sequences"])
            self._ledger.skip(reason)
            print(f"[hermes-rl] group not sent: {reason}", file=sys.stderr)
            return None, []
        return group, []

    def build_group(self, rollouts: list[Rollout]) -> ScoredDataGroup:
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        info: list[dict[str, Any]] = []
        logprobs: list[list[float]] = []
        gaps: list[int] = []
        dropped = 0
        left_out: list[str] = []
        tools = self.tool_schemas()
        sequence_rollouts: list[int] = []
        for index, r in enumerate(rollouts):
            assert r.result is not None and r.score is not None
            trace = r.extras.get("token_trace")
            try:
                if trace is not None:  # token mode: exact ids; one item per token sequence
                    produced = trace_items(trace)
                else:
                    produced = [(*tokenize_conversation(self.tokenizer, r.result.messages, tools), None)]
            except Exception as exc:  # one rollout's unusable data is its own error, never the command's
                left_out.append(f"{type(exc).__name__}: {exc}")
                logger.warning("a rollout was left out of its group: its tokens could not be built (%s)", left_out[-1])
                continue
            items = select_sequences(produced, self.config.split_sequences)
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
                sequence_rollouts.append(index)
                group["messages"].append(r.result.messages)
                info.append(
                    {
                        "stop_reason": r.result.stop_reason,
                        "turns": r.result.turns_used,
                        "tool_calls": r.result.tool_call_count,
                        "tool_errors": len(r.result.tool_errors),
                        "duration_s": round(r.duration_s, 3),
                        "token_sequences": len(produced),
                        "rollout": index,  # which of the rollouts: some may be left out, some give several sequences
                    }
                )
        # Not `overrides`: trainers read that key as per-item training overrides. (run-api drops it.)
        group["rollout_info"] = info
        if left_out:
            group["left_out"] = left_out  # why rollouts are missing (not an infrastructure failure)
        # The offered tools, so exports (OpenAI messages + tools, SFT sets) are self-contained.
        group["tools"] = tools
        if logprobs and len(logprobs) == len(group["tokens"]):
            group["inference_logprobs"] = logprobs
        # run-api keeps `generation_params`: the one place a trainer sees how the group was sampled.
        record = dict(self.sampling_record)
        if gaps or dropped:
            record["missing_logprobs"] = {
                "per_sequence": gaps,
                "policy": self.config.missing_logprobs,
                "dropped": dropped,
            }
            if any(gaps) or dropped:
                logger.warning(
                    "%d trained tokens without a logprob (--env.missing_logprobs %s; %d sequences dropped)",
                    sum(gaps),
                    self.config.missing_logprobs,
                    dropped,
                )
        group["generation_params"] = record
        # run-api keeps group_overrides (it drops unknown keys): which rollout each sequence is
        # from, so a trainer gives all sequences of one rollout one advantage (docs/trainers.md).
        overrides: dict[str, Any] = {"sequence_rollouts": sequence_rollouts, "rollouts": len(rollouts)}
        if len(group["tokens"]) != self.config.group_size:
            # Split sequences (split_sequences all), or rollouts lost to infrastructure: tell
            # atroposlib the real size, or it drops the group as malformed. serve never sends these.
            overrides["group_size"] = len(group["tokens"])
        group["group_overrides"] = overrides
        return group

    # ---- runtime: model server, tool backend, clean shutdown -------------------------------

    @asynccontextmanager
    async def runtime(self, model: Callable[[], ChatModel] | None = None) -> AsyncIterator[HermesAgentBaseEnv]:
        """Start what the env needs (model server, tool backend) and always stop it.

        `model` replaces the configured servers with a `ChatModel` factory (tests: no HTTP server);
        so does the env's `scripted_agent()`, which then starts no model server.
        """
        self.agent_runtime.use(model=model or self.scripted_agent(), tool_backend=self.make_tool_backend())
        async with self.agent_runtime:
            try:
                if self.agent_runtime.mode != "injected":
                    probes = [partial(self.agent_runtime.probe, i) for i in range(len(self.server_configs))]
                    async with ServerRouter(self._health_checks, probes) as self._router:
                        yield self
                else:
                    yield self
            finally:
                self._router = None
                await self.teardown()

    async def teardown(self) -> None:
        """Stop what the env started itself (e.g. answer-check workers); the runtime stops the rest."""

    # atroposlib's three entry points, each inside the runtime. BaseEnv opens the groups file
    # in every mode (evaluate writes none), so each one closes it and removes it when empty.
    async def process_manager(self):
        await self._in_runtime(super().process_manager, report=True)

    async def env_manager(self):
        await self._in_runtime(self._serve, report=False)

    async def _run_evaluate(self):
        await self._in_runtime(super()._run_evaluate, report=False)

    async def _in_runtime(self, entry: Any, *, report: bool) -> None:
        ok = False
        try:
            with collector(self.config.gc):  # the runner's collector settings, for this command only
                async with self.runtime():
                    # atroposlib's serve swallows errors inside groups; a config error (a 4xx from the
                    # model server, a bad reward) must still stop the command, so it is raced here.
                    self._fatal_event = asyncio.Event()
                    main = asyncio.ensure_future(entry())
                    fatal = asyncio.ensure_future(self._fatal_event.wait())
                    try:
                        await asyncio.wait({main, fatal}, return_when=asyncio.FIRST_COMPLETED)
                    finally:  # also on SIGINT/SIGTERM: serve's group workers end before the runtime does
                        pending = [main, fatal, *getattr(self, "workers", ())]
                        for task in pending:
                            task.cancel()
                        await asyncio.gather(*pending, return_exceptions=True)
                    if self._fatal is not None:
                        raise self._fatal
                    main.result()
                    ok = True
        finally:
            self._finish_output(report and ok)

    def _set_fatal(self, exc: HermesEnvError) -> None:
        if self._fatal is None:
            self._fatal = exc
        if self._fatal_event is not None:
            self._fatal_event.set()

    # ---- serve: the trainer decides how long; every group says what happened to it ----------

    async def register_env(self):
        url = self.config.rollout_server_url
        waiting_said = False
        while True:
            try:
                data = await self._register_env()
            except Exception as exc:  # tenacity's RetryError around a connection error
                last = getattr(exc, "last_attempt", None)
                cause = last.exception() if last is not None else exc
                raise HermesEnvError(
                    f"cannot register with the rollout API at {url} ({type(cause).__name__}: {cause}); "
                    "start it with `run-api` or pass --env.rollout_server_url"
                ) from None
            if data.get("status") == "success":
                break
            if not waiting_said:
                print(f"[hermes-rl] serve: waiting for a trainer to register with {url}", file=sys.stderr)
                waiting_said = True
            await asyncio.sleep(1)
        self.env_id = data["env_id"]
        self.wandb_prepend = data["wandb_name"]
        self.curr_step = self._start_step = data["starting_step"]
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
        raise SystemExit(cli_main(cls))


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
