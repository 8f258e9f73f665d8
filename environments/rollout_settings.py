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
from environments.tool_backend import LocalToolBackendConfig
from tools.context import ToolLimits

__all__ = ["RolloutSettings", "embedded_server_configs", "model_servers"]


class RolloutSettings(TaskHooks):
    """Reads the env config (mixed into HermesAgentBaseEnv) for the runtime and the CLI's checks."""

    # Set by HermesAgentBaseEnv.__init__.
    config: HermesAgentEnvConfig
    server_configs: list[APIServerConfig]
    _health_checks: list[bool]  # each server's atroposlib health_check (the runtime probes them)
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
            tool_choice=c.tool_choice,
            first_turn_tool_choice=c.first_turn_tool_choice,
        )

    def token_server_kind(self) -> TokenServerKind | None:
        embedded = all(c.base_url == EMBEDDED for c in self.server_configs)
        tinker = self.config.require_inference_logprobs and self.config.token_server == "auto"
        return resolve_token_server(self.config.token_server, self.server_configs[0].server_type, embedded, tinker)

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
            servers=model_servers(self.server_configs, self._health_checks),
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
