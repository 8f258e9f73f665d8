"""The mhqa env's settings (`--env.*`) and its command-line entry; the env is environments/mhqa/env.py.

Kept apart from the env so `--help` and the CLI's checks run without importing atroposlib's BaseEnv.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from environments.env_config import HermesAgentEnvConfig
from environments.env_entry import EnvEntry

__all__ = ["ENTRY", "MHQAEnvConfig"]


class MHQAEnvConfig(HermesAgentEnvConfig):
    task_defaults: ClassVar[dict[str, Any]] = {"runtime.loop.max_turns": 6, "runtime.loop.max_tokens": 256}
    dataset: str = Field(
        "offline",
        description="'offline' (bundled), a .jsonl/.json/.parquet file or save_to_disk dir of HotpotQA/MuSiQue rows, "
        "or a hub name read through datasets",
    )
    split: str = Field("validation", description="Split of a hub dataset or a save_to_disk DatasetDict")
    hub_config: str | None = Field(None, description="Hub dataset config, e.g. distractor | fullwiki for hotpot_qa")
    reward_metric: Literal["f1", "em"] = Field("f1", description="The reward: official answer token F1, or EM")
    search_scope: Literal["item", "dataset"] = Field(
        "item",
        description="What the paragraph tools search: the item's own paragraphs, or every paragraph of the loaded "
        "rows (open-domain, fullwiki style; the prompt then lists no titles)",
    )


ENTRY = EnvEntry(
    "environments.mhqa.env:MHQAEnv",
    "mhqa",
    MHQAEnvConfig,
    summary="Multi-hop QA: HotpotQA and MuSiQue questions answered from the item's paragraphs.",
)
