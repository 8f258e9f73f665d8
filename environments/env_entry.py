"""An env as the command line sees it before its class is imported.

An env class subclasses atroposlib's `BaseEnv`, whose import pulls in transformers and torch
(seconds). `--help`, flag and YAML checking and every early refusal need only the env's config
class, its name and its defaults, so an entry module hands the CLI an `EnvEntry` and the class
is imported once the config has been parsed and checked:

    ENTRY = EnvEntry("environments.gsm8k.env:GSM8kAgentEnv", "gsm8k_agent", GSM8kAgentEnvConfig, summary)
    if __name__ == "__main__":
        raise SystemExit(main(ENTRY))

`default_config` is also what `HermesAgentBaseEnv.config_init` returns, so both paths agree.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from pydantic import BaseModel

from environments.env_config import HermesAgentEnvConfig
from environments.model_server import EMBEDDED, EMBEDDED_MODEL_NAME
from environments.models.chat_mode import PLACEHOLDER_API_KEY

__all__ = ["EnvEntry", "default_config", "embedded_server_configs"]


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


def default_config(config_cls: type[HermesAgentEnvConfig], name: str | None) -> HermesAgentEnvConfig:
    """The CLI's defaults: the embedded model, output under out/<name>, then the task's own
    (`task_defaults`, dotted keys for nested settings, and fields its config class declares again)."""
    defaults: dict[str, Any] = dict(
        tokenizer_name=EMBEDDED,
        group_size=2,
        total_steps=2,
        max_token_length=4096,
        use_wandb=False,
        data_path_to_save_groups=f"out/{name}.jsonl",
        data_dir_to_save_evals=f"out/{name}_eval",
        # atroposlib cancels a serve group after 600 s and loses it; a group may take a full
        # trajectory budget plus a slow model call (the request timeout) per rollout.
        worker_timeout=1800,
    )
    declared = {
        field
        for klass in config_cls.__mro__
        if issubclass(klass, HermesAgentEnvConfig) and klass is not HermesAgentEnvConfig
        for field in vars(klass).get("__annotations__", {})
    }
    kept = {k: v for k, v in defaults.items() if k not in declared}
    for key in config_cls.task_defaults:
        _check_setting(config_cls, key)
    return config_cls(**_nested({**kept, **config_cls.task_defaults}))


def _check_setting(config_cls: type[BaseModel], key: str) -> None:
    """A task default must name a setting: pydantic would drop an unknown nested key without a word."""
    model: Any = config_cls
    for part in key.split("."):
        fields = model.model_fields if isinstance(model, type) and issubclass(model, BaseModel) else {}
        if part not in fields:
            raise TypeError(f"{config_cls.__name__}.task_defaults: {key!r} names no setting (no {part!r} there)")
        model = fields[part].annotation


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """{"runtime.loop.max_turns": 6} -> {"runtime": {"loop": {"max_turns": 6}}}: a task default is keyed like
    its flag, so a nested one leaves the rest of its section (e.g. the loop's other defaults) as they are."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


@dataclass(frozen=True)
class EnvEntry:
    """`env` is "module:Class"; `name` and `env_config_cls` are the class's own (checked on load)."""

    env: str
    name: str
    env_config_cls: type[HermesAgentEnvConfig]
    summary: str = ""

    def config_init(self) -> tuple[HermesAgentEnvConfig, list[APIServerConfig]]:
        return default_config(self.env_config_cls, self.name), embedded_server_configs()

    def load(self) -> Any:
        module, _, attr = self.env.partition(":")
        env_cls = getattr(importlib.import_module(module), attr)
        if env_cls.name != self.name or env_cls.env_config_cls is not self.env_config_cls:
            raise TypeError(
                f"{self.env} is not the env its entry describes ({self.name}, {self.env_config_cls.__name__})"
            )
        return env_cls
