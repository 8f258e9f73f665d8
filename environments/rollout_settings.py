"""The env config as the runtime's settings: offered tool schemas, tool limits, loop settings, the
token server (resolved once) and the `RuntimeConfig` the env's one `AgentRuntime` is built from."""

from __future__ import annotations

from typing import Any

from atroposlib.envs.server_handling.server_baseline import APIServerConfig

from environments.agent_loop import AgentLoopConfig
from environments.env_config import HermesAgentEnvConfig
from environments.env_entry import embedded_server_configs
from environments.models.token_mode.wiring import TokenServerKind, resolve_token_server, sampling_setup
from environments.runtime import (
    EMBEDDED,
    HermesEnvError,
    ModelServer,
    RuntimeConfig,
)
from environments.task_hooks import TaskHooks
from tools.context import ToolLimits

__all__ = ["RolloutSettings", "embedded_server_configs", "model_servers"]


class RolloutSettings(TaskHooks):
    """Reads the env config (mixed into HermesAgentBaseEnv) for the runtime and the CLI's checks."""

    # Set by HermesAgentBaseEnv.__init__.
    config: HermesAgentEnvConfig
    server_configs: list[APIServerConfig]
    _sampling_record: dict[str, Any] | None
    _token_choice: tuple[str | None, dict[str, Any]] | None

    def enabled_toolsets(self) -> list[str] | None:
        return self.config.enabled_toolsets if self.config.enabled_toolsets is not None else self.default_toolsets

    def tool_schemas(self) -> list[dict[str, Any]]:
        try:
            return self.agent_runtime.tool_schemas(self.enabled_toolsets(), self.config.disabled_toolsets)
        except HermesEnvError as exc:
            raise HermesEnvError(f"--env.enabled_toolsets/--env.disabled_toolsets: {exc}") from exc

    def tool_limits(self) -> ToolLimits:
        return self.config.runtime.tool_limits

    def loop_config(self) -> AgentLoopConfig:
        loop = self.config.runtime.loop
        if "model_timeout_s" in loop.model_fields_set:
            return loop
        # Unset: a model call may take as long as the slowest server's --openai.timeout allows.
        return loop.model_copy(update={"model_timeout_s": float(max(s.timeout for s in self.server_configs))})

    def token_server_kind(self) -> TokenServerKind | None:
        embedded = all(c.base_url == EMBEDDED for c in self.server_configs)
        tinker = self.config.require_inference_logprobs and self.config.runtime.token_server == "auto"
        return resolve_token_server(
            self.config.runtime.token_server, self.server_configs[0].server_type, embedded, tinker
        )

    def check_config(self, command: str | None = None) -> tuple[str | None, dict[str, Any]]:
        """What can be checked before a server starts: toolsets, token protocol, logprob
        semantics, the trainer's needs. Returns (token-server kind, request fields to send)."""
        self.tool_schemas()
        self.check_data()
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
                "server is used in chat mode, which has none; pass --env.runtime.token_server tinker|sglang|vllm|llamacpp"
            )
        try:
            extra, record = sampling_setup(
                kind,
                self.config.runtime.loop.temperature,
                self.config.runtime.loop.max_tokens,
                self.config.runtime.extra_body,
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

    def web_offered(self) -> bool:
        enabled = self.enabled_toolsets()
        return (enabled is None or "web" in enabled) and "web" not in self.config.disabled_toolsets

    def runtime_config(self) -> RuntimeConfig:
        """The env's `runtime`, with what the env resolves: the token server (a `tinker:` section picks tinker),
        the request fields that go with it, the loop's model timeout, and a context under the trainer's length."""
        c = self.config
        kind, extra_body = self._token_setup()
        # Stay under the trainer's length: longer groups would be dropped by atroposlib.
        cap = c.max_token_length - 1 if c.max_token_length > 1 else None
        given = c.runtime.max_context_tokens
        return c.runtime.model_copy(
            update={
                "token_server": kind or "off",
                "extra_body": extra_body,
                "max_context_tokens": min(given, cap) if given and cap else (given or cap),
                "loop": self.loop_config(),
            }
        )


def model_servers(server_configs: list[APIServerConfig], health_checks: list[bool] | None = None) -> list[ModelServer]:
    """atroposlib's server configs, as the runtime's (`health_checks`: each one's `health_check`, which the
    env takes over from atroposlib's ServerManager)."""
    checks = health_checks if health_checks is not None else [bool(c.health_check) for c in server_configs]
    return [
        ModelServer(
            base_url=c.base_url,
            model=c.model_name,
            api_key=c.api_key,
            timeout_s=float(c.timeout),
            server_type=c.server_type,
            tokenizer=c.tokenizer_name if c.tokenizer_name not in ("", "none") else None,
            health_check=check,
        )
        for c, check in zip(server_configs, checks)
    ]
