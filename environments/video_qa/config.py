"""The video_qa env's settings (`--env.*`) and its command-line entry; the env is environments/video_qa/env.py.

Kept apart from the env so `--help` and the CLI's checks run without importing atroposlib's BaseEnv.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from environments.env_config import HermesAgentEnvConfig
from environments.env_entry import EnvEntry

__all__ = ["ENTRY", "VideoQAEnvConfig"]


class VideoQAEnvConfig(HermesAgentEnvConfig):
    task_defaults: ClassVar[dict[str, Any]] = {"runtime.loop.max_turns": 5, "runtime.loop.max_tokens": 256}
    dataset: str = Field("offline", description="'offline' (bundled) or a .jsonl/.json/.csv file of question rows")
    captions_dir: str | None = Field(None, description="Caption files <video>.txt (default: captions/ beside the rows)")
    answers_file: str | None = Field(None, description="EgoSchema's subset_answers.json when the rows carry no answer")


ENTRY = EnvEntry(
    "environments.video_qa.env:VideoQAEnv",
    "video_qa",
    VideoQAEnvConfig,
    summary="Video QA over captions: multiple choice, answered from timestamped captions.",
)
