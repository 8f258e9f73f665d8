"""The SWE-smith env's configuration (`--env.*`); the env itself is environments/swe_smith/env.py."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from environments.env_config import HermesAgentEnvConfig
from environments.env_entry import EnvEntry
from environments.swe_smith.deps import RepoEnvConfig

__all__ = ["ENTRY", "SweSmithOracleEnvConfig"]


class SweSmithOracleEnvConfig(HermesAgentEnvConfig):
    # A repository and its test output need a longer context than the base defaults.
    task_defaults: ClassVar[dict[str, Any]] = {
        "max_token_length": 8192,
        "runtime.loop.max_turns": 6,
        "runtime.loop.max_tokens": 512,
    }
    dataset: str = Field(
        "offline",
        description="offline (bundled), a hub dataset name, or a path: JSONL/JSON of instances or a saved dataset dir",
    )
    split: str = Field("train", description="Split of a hub dataset or saved DatasetDict")
    limit: int | None = Field(None, ge=1, description="Use at most this many instances")
    mirror_base: str = Field(
        "https://github.com",
        description="Where the mirrors live: {mirror_base}/{repo}.git; a URL or a local dir of bare repos",
    )
    cache_dir: str | None = Field(None, description="This machine's bare mirrors and snapshots (default: a temp dir)")
    profiles: str | None = Field(
        None, description="JSON file {repo: {test_cmd, language}} adding to SWE-smith's published profiles"
    )
    image_policy: Literal["auto", "skip", "base"] = Field(
        "auto",
        description="Instances naming an image: auto = run them in that image on docker, nomad and modal (repository "
        "at /testbed), and on the local backends when --env.deps.mode venv provides their dependencies, else "
        "skip them; skip; base = run them on the base environment (you installed their dependencies)",
    )
    agent: Literal["model", "oracle", "noop"] = Field("model", description="model, or a scripted check agent")
    prompt_tests: Literal["files", "ids", "none"] = Field(
        "files",
        description="What the prompt says of FAIL_TO_PASS: the files holding them with a count (files), every "
        "test id (ids: can exceed the context, one instance lists 34 KB), or nothing (none)",
    )
    install_command: str | None = Field(
        None, description="Run in the verified checkout before the tests (no network there; see --env.deps)"
    )
    deps: RepoEnvConfig = Field(
        default_factory=RepoEnvConfig,
        description="Each repository's dependencies without its image (docs/swe_smith.md)",
    )
    pytest_plugin_autoload: bool = Field(
        False,
        description="Let pytest load every installed plugin (the sandbox interpreter's); the offline repos need none "
        "and skipping them saves seconds per run; turn on for repositories whose tests rely on plugins (in the "
        "instance's image and in a --env.deps.mode venv env they always load: those environments are the repository's)",
    )
    verify_in: Literal["fresh_slot", "same_slot"] = Field(
        "fresh_slot", description="Where the tests run: a fresh slot (default), or a new directory of the agent's slot"
    )
    write_preds: bool = Field(True, description="Write preds.jsonl (SWE-bench predictions) beside the groups file")
    setup_timeout_s: float = Field(300.0, gt=0, description="Cloning and preparing the worktree")
    test_timeout_s: float = Field(300.0, gt=0, description="Running the instance's tests")


ENTRY = EnvEntry(
    "environments.swe_smith.env:SweSmithOracleEnv",
    "swe_smith_oracle",
    SweSmithOracleEnvConfig,
    summary="SWE-smith tasks in sandbox slots: fix an injected bug, scored by the repo's own tests.",
)
