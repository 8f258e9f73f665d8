"""SWE-smith tasks in sandbox slots: fix an injected bug, scored by the repo's own tests.

    python -m environments.swe_smith_oracle_env process --env.total_steps 2 --env.group_size 2
    python -m environments.swe_smith_oracle_env evaluate --env.agent oracle     # must score 1.0
    python -m environments.swe_smith_oracle_env process --env.dataset SWE-bench/SWE-smith ...
    python -m environments.swe_smith_oracle_env evaluate --env.dataset my_instances.jsonl --env.mirror_base /srv/mirrors

Instances have SWE-smith's published shape: `repo` = `swesmith/<owner>__<name>.<sha8>`, the mirror is
`{mirror_base}/{repo}.git` (a URL, or a local directory of bare repositories); the bug is already
committed on a branch named after `instance_id`, and `base_commit` is that bug commit (so the `patch`
is never applied again). `image_name` is the instance's environment; the test command comes from
SWE-smith's repository profile (environments/data/swe_smith/profiles.json, generated from SWE-smith's
package by scripts/swe_smith_profiles.py), else pytest. Unusable rows are skipped with counted reasons.

This process keeps one bare mirror per repository (never visible to slots) and gives each workspace a
one-commit snapshot of the starting tree (the bug commit's history would reveal the bug). The reward
comes from `environments.verifier`: the agent's diff to non-test files, applied to a pristine checkout
in a fresh slot, tested with the original tests. Every scored trajectory is also written to
`preds.jsonl` beside the groups file, in SWE-bench's prediction format.

The offline default is a handful of tiny repositories with injected bugs (environments/data/swe_smith/),
turned into a local mirror of the published shape at startup. `--env.agent oracle` replaces the model
with `OracleAgent`, which reverts the bug through the terminal tool; `noop` answers without touching
anything. Both are deterministic `ChatModel`s for checking the env.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from environments.agent_loop import AgentResult
from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig, HermesEnvError, Rollout
from environments.jsonl import jsonl_lines
from environments.models.base import ChatModel, ModelTurn
from environments.verifier import (
    GIT_SAFE,
    TestVerifier,
    TestVerifierConfig,
    Verdict,
    capture_diff,
    split_diff,
)
from tools.context import ToolContext
from tools.executor import ToolExecutor

__all__ = [
    "OFFLINE_DATA",
    "NoOpAgent",
    "OracleAgent",
    "SweSmithInstance",
    "SweSmithOracleEnv",
    "SweSmithOracleEnvConfig",
    "build_mirror",
    "build_test_command",
    "load_instances",
    "load_offline_instances",
    "profile_for",
    "read_rows",
]

OFFLINE_DATA = Path(__file__).parents[1] / "data" / "swe_smith"
PROFILES = OFFLINE_DATA / "profiles.json"
HUB_DATASET = "SWE-bench/SWE-smith"
DEFAULT_TEST_CMD = "pytest --disable-warnings --color=no --tb=no --verbose"  # SWE-smith's PythonProfile
# The published Python test commands start by activating the image's conda env; on our base there is none.
_IMAGE_ENV_PREFIX = re.compile(r"^\s*source /opt/miniconda3/bin/activate;\s*conda activate \w+;\s*")
_FIXED_GIT_ENV = {
    "GIT_AUTHOR_NAME": "hermes-rl",
    "GIT_AUTHOR_EMAIL": "hermes-rl@localhost",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "hermes-rl",
    "GIT_COMMITTER_EMAIL": "hermes-rl@localhost",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
}

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a Python repository. Use the terminal and file "
    "tools to read the code, run the tests and edit the source. Do not change the tests. When the "
    "bug is fixed, reply with a short summary and no tool call."
)


class SweSmithInstance(BaseModel):
    model_config = ConfigDict(extra="ignore")

    instance_id: str
    repo: str = Field(..., description="The mirror, swesmith/<owner>__<name>.<sha8>")
    patch: str = Field(..., description="The diff that introduced the bug (already committed at base_commit)")
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    problem_statement: str = ""
    base_commit: str | None = Field(None, description="The bug commit, tip of the branch named instance_id")
    image_name: str | None = Field(None, description="The instance's Docker image (its repository's environment)")
    repo_url: str | None = Field(None, description="git URL or local path overriding the mirror")

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value  # the hub stores them as JSON text

    @property
    def repo_name(self) -> str:
        return self.repo.split("/")[-1]

    @property
    def name(self) -> str:
        """The upstream project's name: the workspace directory the agent works in."""
        m = re.match(r"^(?:.+?__)?(.+?)(?:\.[0-9a-f]{7,8})?$", self.repo_name)
        return re.sub(r"[^A-Za-z0-9_.-]", "_", m.group(1) if m else self.repo_name)[:60].lstrip(".") or "repo"

    def source(self, mirror_base: str) -> str:
        if self.repo_url:
            return self.repo_url
        if "://" in mirror_base or mirror_base.startswith("git@"):
            return f"{mirror_base.rstrip('/')}/{self.repo}.git"
        base = Path(mirror_base)
        return str(
            next((p for p in (base / f"{self.repo}.git", base / self.repo) if p.exists()), base / f"{self.repo}.git")
        )

    @property
    def test_files(self) -> list[str]:
        return sorted({t.split("::")[0] for t in self.FAIL_TO_PASS + self.PASS_TO_PASS})


# -- datasets ---------------------------------------------------------------------------------------


def _git(args: list[str], cwd: Path | None = None, stdin: str | None = None) -> str:
    import subprocess

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_FIXED_GIT_ENV}
    proc = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise HermesEnvError(f"git {' '.join(args[:2])} failed in {cwd}: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def build_mirror(
    repos: Mapping[str, Path], bugs: list[dict[str, Any]], out_dir: Path, owner: str = "hermes-rl"
) -> list[dict[str, Any]]:
    """A mirror in SWE-smith's published shape from plain project directories and bug patches.

    `repos`: project name -> directory; `bugs`: rows with `name` (a key of repos), `bug_id`, `patch` and
    the published fields. Writes `out_dir/swesmith/<owner>__<name>.<sha8>.git` (main = the original,
    one branch per instance with the bug committed) and returns the rows with `instance_id`, `repo` and
    `base_commit` filled in. Commits use a fixed identity and date, so the result is reproducible.
    """
    work = out_dir / ".work"
    rows = []
    mirrors: dict[str, tuple[Path, str]] = {}
    for name, src in repos.items():
        tree = work / name
        _git(["init", "-q", "-b", "main", str(tree)])
        for path in sorted(src.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                target = tree / path.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(path.read_bytes())
        _git(["add", "-A"], tree)
        _git(["commit", "-q", "-m", "Initial commit"], tree)
        sha8 = _git(["rev-parse", "HEAD"], tree)[:8]
        mirror = out_dir / "swesmith" / f"{owner}__{name}.{sha8}.git"
        mirrors[name] = (tree, f"swesmith/{owner}__{name}.{sha8}")
        if not mirror.exists():
            _git(["init", "-q", "--bare", str(mirror)])
    for bug in bugs:
        tree, repo = mirrors[bug["name"]]
        instance_id = f"{repo.split('/')[1]}.{bug['bug_id']}"
        _git(["checkout", "-q", "-b", instance_id, "main"], tree)
        _git(["apply", "-"], tree, stdin=bug["patch"])
        _git(["commit", "-q", "-am", "Bug Patch"], tree)
        row = {k: v for k, v in bug.items() if k not in ("name", "bug_id")}
        rows.append(row | {"instance_id": instance_id, "repo": repo, "base_commit": _git(["rev-parse", "HEAD"], tree)})
        _git(["checkout", "-q", "main"], tree)
    for tree, repo in mirrors.values():
        _git(["push", "-q", "--mirror", str(out_dir / f"{repo}.git")], tree)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return rows


def load_offline_instances(
    data_dir: Path = OFFLINE_DATA, cache_dir: Path | None = None
) -> tuple[Path, list[SweSmithInstance]]:
    """The bundled bugs as a local mirror of the published shape: (mirror_base, instances)."""
    lines = (data_dir / "instances.jsonl").read_text()
    key = hashlib.sha1(lines.encode())
    for p in sorted((data_dir / "repos").rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            key.update(str(p.relative_to(data_dir)).encode() + b"\0" + p.read_bytes())
    out = (cache_dir or _default_cache()) / f"offline-{key.hexdigest()[:12]}"
    done = out / "instances.jsonl"
    if not done.exists():
        bugs = []
        for _, line in jsonl_lines(lines):
            row = json.loads(line)
            name = row["repo_url"].rstrip("/").split("/")[-1]
            bugs.append(
                {k: v for k, v in row.items() if k not in ("repo_url", "base_commit", "instance_id", "repo")}
                | {"name": name, "bug_id": row["instance_id"].rsplit(".", 1)[-1]}
            )
        repos = {b["name"]: data_dir / "repos" / b["name"] for b in bugs}
        staging = out.with_name(out.name + f".tmp{os.getpid()}")
        rows = build_mirror(repos, bugs, staging)
        (staging / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        try:
            staging.rename(out)
        except OSError:  # another process built it first
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    return out, [SweSmithInstance.model_validate_json(line) for _, line in jsonl_lines(done.read_text())]


def _default_cache() -> Path:
    path = Path(tempfile.gettempdir()) / "hermes-rl-swe-smith"
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_rows(dataset: str, split: str) -> list[dict[str, Any]]:
    """Rows from a JSONL/JSON file, a `datasets` save_to_disk directory, or a hub dataset name."""
    path = Path(dataset)
    if path.is_file():
        text = path.read_text()
        if path.suffix == ".json" or text.lstrip().startswith("["):
            return list(json.loads(text))
        return [json.loads(line) for _, line in jsonl_lines(text)]
    if path.is_dir():
        from datasets import DatasetDict, load_from_disk

        saved = load_from_disk(str(path))
        if isinstance(saved, DatasetDict):
            if split not in saved:
                raise HermesEnvError(f"{dataset} has splits {sorted(saved)}, not {split!r}; pass --env.split")
            saved = saved[split]
        return list(saved)
    check_dataset(dataset)
    from datasets import load_dataset

    return list(load_dataset(dataset, split=split))


def check_dataset(dataset: str) -> None:
    """Refuse, in one line, a --env.dataset that is no known source (before anything starts)."""
    if dataset == "offline" or Path(dataset).exists():
        return
    if re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", dataset) and not dataset.endswith((".jsonl", ".json")):
        return  # a hub dataset name
    raise HermesEnvError(
        f"--env.dataset {dataset!r} is neither 'offline', an existing JSONL/JSON file or saved dataset directory, "
        "nor a hub dataset name (owner/name)"
    )


def load_instances(
    rows: list[dict[str, Any]],
    *,
    run_images: bool,
    mirror_base: str,
    profiles: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[list[SweSmithInstance], collections.Counter]:
    """Usable instances and the counted reasons for every row left out."""
    skipped: collections.Counter = collections.Counter()
    out: list[SweSmithInstance] = []
    seen: set[str] = set()
    for row in rows:
        try:
            inst = SweSmithInstance.model_validate(row)
        except ValidationError as exc:
            skipped[f"invalid row ({', '.join(str(e['loc'][0]) for e in exc.errors()[:3])})"] += 1
            continue
        profile = profile_for(inst.repo, profiles)
        if not inst.problem_statement.strip():
            skipped["empty problem_statement"] += 1
        elif not inst.FAIL_TO_PASS:
            skipped["no FAIL_TO_PASS tests"] += 1
        elif inst.instance_id in seen:
            skipped["duplicate instance_id"] += 1
        elif profile.get("language", "python") != "python" and not run_images:
            skipped[f"{profile['language']} repository: needs its image, the base environment runs Python"] += 1
        elif inst.image_name and not run_images:
            skipped[
                "needs its image (image_name); this backend runs only its base environment (--env.image_policy base)"
            ] += 1
        elif not inst.repo_url and "://" not in mirror_base and not Path(inst.source(mirror_base)).exists():
            skipped[f"no mirror under {mirror_base}"] += 1
        else:
            seen.add(inst.instance_id)
            out.append(inst)
    return out, skipped


# -- test commands: SWE-smith's repository profiles ------------------------------------------------


def profile_for(repo: str, extra: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The profile of a mirror (swesmith/<owner>__<name>.<sha8>): test_cmd, language; {} if unknown."""
    if extra and repo in extra:
        return dict(extra[repo])
    return dict(_published_profiles().get(repo, {}))


@functools.cache
def _published_profiles() -> Mapping[str, Mapping[str, Any]]:
    """SWE-smith's profiles, read once (an immutable view)."""
    return MappingProxyType(json.loads(PROFILES.read_text())["profiles"] if PROFILES.exists() else {})


def build_test_command(inst: SweSmithInstance, profile: Mapping[str, Any], *, python: str, on_image: bool) -> str:
    """The profile's test command (pytest if none), on the base environment with our interpreter.

    Like SWE-smith's harness, a pytest command gets the instance's test files appended; unlike it,
    those of PASS_TO_PASS too, since a test missing from the output counts as failed here.
    """
    command = profile.get("test_cmd") or DEFAULT_TEST_CMD
    if not on_image:
        command = _IMAGE_ENV_PREFIX.sub("", command)
        command = re.sub(r"(^|[;&|]\s*)pytest\b", lambda m: f"{m.group(1)}{python} -m pytest", command)
    if "pytest" in command:
        command += " -p no:cacheprovider " + " ".join(shlex.quote(f) for f in inst.test_files)
    return command


# -- deterministic agents -------------------------------------------------------------------------

_INSTANCE_RE = re.compile(r"^Instance: (\S+)$", re.MULTILINE)
_PATH_RE = re.compile(r"^Repository path: (\S+)$", re.MULTILINE)


def _call(name: str, arguments: dict[str, Any], n: int) -> dict[str, Any]:
    return {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


class OracleAgent:
    """Knows every instance's bug patch and applies it in reverse with one terminal call."""

    def __init__(self, instances: Mapping[str, SweSmithInstance]) -> None:
        self.instances = dict(instances)

    async def chat(self, messages, tools, *, temperature, max_tokens) -> ModelTurn:
        if any(m.get("role") == "tool" for m in messages):
            return ModelTurn(content="Applied the fix; the failing tests pass now.", finish_reason="stop")
        prompt = next(m["content"] for m in messages if m.get("role") == "user")
        inst_match, path_match = _INSTANCE_RE.search(prompt), _PATH_RE.search(prompt)
        if not inst_match or not path_match or inst_match.group(1) not in self.instances:
            return ModelTurn(content="I do not know this instance.", finish_reason="stop")
        patch = self.instances[inst_match.group(1)].patch
        command = f"cd {shlex.quote(path_match.group(1))} && git apply -R <<'HERMES_PATCH'\n{patch}HERMES_PATCH"
        return ModelTurn(
            content=None, tool_calls=[_call("terminal", {"command": command}, 1)], finish_reason="tool_calls"
        )


class NoOpAgent:
    """Answers at once without touching the repository."""

    async def chat(self, messages, tools, *, temperature, max_tokens) -> ModelTurn:
        return ModelTurn(content="Nothing to do.", finish_reason="stop")


# -- the env ----------------------------------------------------------------------------------------------


class SweSmithOracleEnvConfig(HermesAgentEnvConfig):
    tool_backend: Literal["local", "sandbox"] = Field("sandbox", description="SWE-smith instances run in sandbox slots")
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
        description="Instances naming an image: auto = skip them on the local backends, run them on nomad/modal; "
        "skip; base = run them on the base environment (you installed their dependencies)",
    )
    agent: Literal["model", "oracle", "noop"] = Field("model", description="model, or a scripted check agent")
    install_command: str | None = Field(
        None, description="Run in the repository before the tests (e.g. pip install -e .)"
    )
    pytest_plugin_autoload: bool = Field(
        False,
        description="Let pytest load every installed plugin (the sandbox interpreter's); the offline repos need none "
        "and skipping them saves seconds per run; turn on for repositories whose tests rely on plugins",
    )
    verify_in: Literal["fresh_slot", "same_slot"] = Field(
        "fresh_slot", description="Where the tests run: a fresh slot (default), or a new directory of the agent's slot"
    )
    write_preds: bool = Field(True, description="Write preds.jsonl (SWE-bench predictions) beside the groups file")
    setup_timeout_s: float = Field(300.0, gt=0, description="Cloning and preparing the worktree")
    test_timeout_s: float = Field(300.0, gt=0, description="Running the instance's tests")


class SweSmithOracleEnv(HermesAgentBaseEnv):
    name = "swe_smith_oracle"
    env_config_cls = SweSmithOracleEnvConfig
    default_toolsets = ["terminal", "file"]
    default_system_prompt = SYSTEM_PROMPT

    def __init__(self, config: SweSmithOracleEnvConfig, *args: Any, **kwargs: Any) -> None:
        check_dataset(config.dataset)
        super().__init__(config, *args, **kwargs)
        self._cache = Path(config.cache_dir) if config.cache_dir else _default_cache()
        self._snapshots: dict[str, tuple[Path, str]] = {}
        self._locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self._verifier = TestVerifier(TestVerifierConfig(timeout_s=config.test_timeout_s))
        self.verdicts: dict[str, Verdict] = {}
        self._preds_lock = asyncio.Lock()
        self._preds_path: Path | None = None

    @classmethod
    def config_init(cls):
        config, servers = super().config_init()
        # A repository and its test output need a longer context than the base defaults.
        update = {"max_token_length": 8192, "max_agent_turns": 6, "agent_max_tokens": 512}
        return config.model_copy(update=update), servers

    def _runs_images(self) -> bool:
        cfg: SweSmithOracleEnvConfig = self.config
        if cfg.image_policy != "auto":
            return cfg.image_policy == "base"
        return cfg.tool_backend == "sandbox" and cfg.sandbox.backend.kind in ("nomad", "modal")

    async def items(self) -> list[SweSmithInstance]:
        cfg: SweSmithOracleEnvConfig = self.config
        self._cache.mkdir(parents=True, exist_ok=True)
        self.mirror_base = cfg.mirror_base
        if cfg.dataset == "offline":
            base, offline = await asyncio.to_thread(load_offline_instances, OFFLINE_DATA, self._cache)
            rows = [i.model_dump() for i in offline]
            self.mirror_base = str(base)
        else:
            rows = await asyncio.to_thread(read_rows, cfg.dataset, cfg.split)
        if cfg.profiles and not Path(cfg.profiles).is_file():
            raise HermesEnvError(
                f"--env.profiles {cfg.profiles!r} is not a file; pass a JSON file {{repo: {{test_cmd: ...}}}}"
            )
        self.extra_profiles = json.loads(Path(cfg.profiles).read_text()) if cfg.profiles else {}
        instances, self.skipped = load_instances(
            rows, run_images=self._runs_images(), mirror_base=self.mirror_base, profiles=self.extra_profiles
        )
        instances = instances[: cfg.limit]
        reasons = "; ".join(f"{n} {why}" for why, n in self.skipped.most_common())
        print(
            f"[hermes-rl] SWE-smith: {len(instances)} usable instances of {len(rows)} rows"
            + (f"; skipped: {reasons}" if reasons else ""),
            file=sys.stderr,
        )
        images = collections.Counter(i.image_name for i in instances if i.image_name)
        if images and cfg.image_policy != "base":
            # The sandbox layer runs one image per backend today; a pool per image is its part to add.
            print(
                f"[hermes-rl] SWE-smith: {len(instances)} instances name {len(images)} images (e.g. "
                f"{next(iter(images))}); slots run the backend's configured image",
                file=sys.stderr,
            )
        self.requested_images = images
        if not instances:
            raise HermesEnvError(
                f"no usable SWE-smith instances in {cfg.dataset!r}" + (f" ({reasons})" if reasons else "")
            )
        self.instances = instances
        self.by_id = {i.instance_id: i for i in instances}
        return instances

    async def eval_items(self) -> list[SweSmithInstance]:
        return self.instances  # evaluate runs every usable instance once

    def scripted_agent(self) -> Callable[[], ChatModel] | None:
        if self.config.agent == "oracle":
            return lambda: OracleAgent(self.by_id)
        return NoOpAgent if self.config.agent == "noop" else None

    def format_prompt(self, item: SweSmithInstance) -> str:
        return (
            f"{item.problem_statement}\n\n"
            f"Instance: {item.instance_id}\n"
            f"Repository path: {item.name}\n"
            f"(relative to your working directory)\n"
            f"Failing tests: {', '.join(item.FAIL_TO_PASS)}"
        )

    # -- the starting tree: a host-side bare mirror, a one-commit snapshot bundle per instance --

    async def _snapshot(self, item: SweSmithInstance) -> tuple[Path, str]:
        """(bundle holding one commit with the instance's starting tree, that commit's id)."""
        async with self._locks[item.instance_id]:
            if item.instance_id in self._snapshots:
                return self._snapshots[item.instance_id]
            source = item.source(self.mirror_base)
            bare = self._cache / "mirrors" / (hashlib.sha1(source.encode()).hexdigest()[:12] + "-" + item.name + ".git")
            ref = item.base_commit or f"refs/heads/{item.instance_id}"
            async with self._locks[str(bare)]:
                if not bare.exists():
                    tmp = bare.with_name(bare.name + f".tmp{os.getpid()}")
                    await _git_async(["clone", "-q", "--mirror", source, str(tmp)], self.config.setup_timeout_s)
                    tmp.rename(bare)
                if not await _git_ok(["-C", str(bare), "cat-file", "-e", f"{ref}^{{commit}}"]):
                    await _git_async(
                        ["-C", str(bare), "fetch", "-q", "origin", "+refs/heads/*:refs/heads/*"],
                        self.config.setup_timeout_s,
                    )
            tree = await _git_async(["-C", str(bare), "rev-parse", f"{ref}^{{tree}}"], 60)
            snap = await _git_async(["-C", str(bare), "commit-tree", tree, "-m", f"{item.instance_id}"], 60)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", item.instance_id)
            await _git_async(["-C", str(bare), "update-ref", f"refs/hermes/{safe}", snap], 60)
            bundle = self._cache / "bundles" / f"{safe}-{snap[:12]}.bundle"
            bundle.parent.mkdir(parents=True, exist_ok=True)
            if not bundle.exists():
                partial = bundle.with_suffix(f".tmp{os.getpid()}")
                await _git_async(["-C", str(bare), "bundle", "create", "-q", str(partial), f"refs/hermes/{safe}"], 300)
                partial.replace(bundle)
            self._snapshots[item.instance_id] = (bundle, snap)
            return bundle, snap

    async def _checkout(self, item: SweSmithInstance, executor: ToolExecutor, dest: str) -> None:
        """The instance's starting tree at `dest` in a workspace, from the uploaded snapshot bundle."""
        bundle, snap = await self._snapshot(item)
        name = f".{dest}.bundle"
        await executor.write_file(name, await asyncio.to_thread(bundle.read_bytes))
        script = f"""set -e
{GIT_SAFE} init -q {shlex.quote(dest)}
cd {shlex.quote(dest)}
{GIT_SAFE} fetch -q "$OLDPWD"/{shlex.quote(name)} {snap}
{GIT_SAFE} -c advice.detachedHead=false checkout -q {snap}
rm -f "$OLDPWD"/{shlex.quote(name)}
"""
        result = await executor.exec(script, timeout=self.config.setup_timeout_s, max_output_bytes=20_000)
        if result.exit_code != 0:
            raise RuntimeError(
                f"preparing {item.instance_id} failed (exit {result.exit_code}): {result.output[-2000:]}"
            )

    async def setup_trajectory_workspace(self, item: SweSmithInstance, ctx: ToolContext) -> None:
        await self._checkout(item, ctx.executor, item.name)

    # -- the reward ---------------------------------------------------------------------------------

    async def compute_reward(self, item: SweSmithInstance, result: AgentResult, ctx: ToolContext):
        _, snap = await self._snapshot(item)
        broken: str | None = None
        try:
            patch = await capture_diff(ctx.executor, item.name, snap)
        except ValueError as exc:  # the agent broke its own repository: no fix to score
            patch, broken = "", str(exc)

        async def verify(executor: ToolExecutor) -> float:
            verdict = await self._verify(item, patch, executor)
            if broken:
                verdict.error = broken
            self.verdicts[ctx.task_id] = verdict
            while len(self.verdicts) > 1000:  # the recent ones, for inspection; preds.jsonl keeps them all
                self.verdicts.pop(next(iter(self.verdicts)))
            await self._write_pred(item, verdict, patch)
            return verdict.score

        if self.config.verify_in == "same_slot":
            return await verify(ctx.executor)

        backend = self.agent_runtime.tool_backend
        assert backend is not None  # compute_reward runs inside the runtime

        async def in_fresh_slot() -> float:
            async with backend.trajectory(f"{ctx.task_id}-verify") as executor:
                return await verify(executor)

        return in_fresh_slot  # run by the base env once the agent's slot is released

    async def _verify(self, item: SweSmithInstance, patch: str, executor: ToolExecutor) -> Verdict:
        cfg: SweSmithOracleEnvConfig = self.config
        profile = profile_for(item.repo, self.extra_profiles)
        python = executor.python.removesuffix(" -")
        command = build_test_command(
            item,
            profile,
            python=python,
            on_image=bool(item.image_name) and self._runs_images() and cfg.image_policy != "base",
        )
        if not cfg.pytest_plugin_autoload:
            command = f"export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1\n{command}"
        return await self._verifier.verify(
            executor,
            prepare=lambda ex, dest: self._checkout(item, ex, dest),
            patch=patch,
            test_command=command,
            must_pass=item.FAIL_TO_PASS + item.PASS_TO_PASS,
            setup_command=cfg.install_command,
        )

    async def _write_pred(self, item: SweSmithInstance, verdict: Verdict, patch: str) -> None:
        """One SWE-bench prediction per scored trajectory: the diff the verifier applied."""
        if not self.config.write_preds or not self.config.data_path_to_save_groups:
            return
        kept, _ = split_diff(patch)
        model = self.config.agent if self.config.agent != "model" else self.server_configs[0].model_name
        line = {
            "instance_id": item.instance_id,
            "model_name_or_path": model,
            "model_patch": kept,
            "hermes": {
                "score": verdict.score,
                "changed_files": [f.path for f in verdict.changed_files],
                "dropped_files": [[f.path, f.reason] for f in verdict.dropped],
            },
        }
        async with self._preds_lock:
            if self._preds_path is None:
                self._preds_path = Path(self.config.data_path_to_save_groups).parent / "preds.jsonl"
                self._preds_path.parent.mkdir(parents=True, exist_ok=True)
                mode = "w"
            else:
                mode = "a"
            await asyncio.to_thread(_append, self._preds_path, json.dumps(line) + "\n", mode)

    def eval_metrics(self, rollouts: list[Rollout]) -> dict[str, float]:
        # SWE-bench's names: the mean score is the resolved rate; skipped rows are reported beside it.
        return {
            "eval/resolved": super().eval_metrics(rollouts)["eval/accuracy"],
            "eval/skipped": sum(self.skipped.values()),
        }

    def eval_sample(self, rollout: Rollout) -> dict[str, Any]:
        return {**super().eval_sample(rollout), "item": {"instance_id": rollout.item.instance_id}}


def _append(path: Path, text: str, mode: str) -> None:
    with path.open(mode) as f:
        f.write(text)


async def _git_async(args: list[str], timeout: float) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_FIXED_GIT_ENV}
    proc = await asyncio.create_subprocess_exec(
        "git",
        "-c",
        "core.hooksPath=/dev/null",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"git {' '.join(args[:3])} took over {timeout:.0f}s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} failed: {err.decode(errors='replace').strip()[-800:]}")
    return out.decode().strip()


async def _git_ok(args: list[str]) -> bool:
    try:
        await _git_async(args, 60)
    except RuntimeError:
        return False
    return True


if __name__ == "__main__":
    SweSmithOracleEnv.cli()
