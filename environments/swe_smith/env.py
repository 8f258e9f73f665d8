"""SWE-smith tasks in sandbox slots: fix an injected bug, scored by the repo's own tests.

    python -m environments.swe_smith_oracle_env process --env.total_steps 2 --env.group_size 2
    python -m environments.swe_smith_oracle_env evaluate --env.agent oracle     # must score 1.0
    python -m environments.swe_smith_oracle_env process --env.dataset SWE-bench/SWE-smith ...

An instance has SWE-smith's fields (`instance_id`, `repo`, `patch` = the diff that
introduces the bug, `FAIL_TO_PASS`, `PASS_TO_PASS`, `problem_statement`, optional
`base_commit`) plus an optional `repo_url` (any git URL or local path). Workspace: one
bare clone per repository in the sandbox's shared /cache, and a `git worktree` per
trajectory with the bug applied and committed as an orphan snapshot (so `git diff`
shows only the agent's own changes). Reward: the test files are restored from the
snapshot, the install command (if any) runs, then FAIL_TO_PASS + PASS_TO_PASS run with
pytest in the same slot: 1.0 only if every one passes.

The offline default is a handful of tiny repositories with injected bugs
(environments/data/swe_smith/). `--env.agent oracle` replaces the model with
`OracleAgent`, which applies the known fix through the terminal tool; `noop` answers
without touching anything. Both are deterministic `ChatModel`s for checking the env.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shlex
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from environments.agent_loop import AgentResult
from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig, HermesEnvError, embedded_server_configs
from environments.models.base import ChatModel, ModelTurn
from environments.sandbox_backend import SandboxToolBackendConfig
from tools.context import ToolContext

__all__ = [
    "SweSmithInstance", "SweSmithOracleEnvConfig", "SweSmithOracleEnv", "OracleAgent", "NoOpAgent",
    "load_offline_instances", "OFFLINE_DATA",
]  # fmt: skip

OFFLINE_DATA = Path(__file__).parents[1] / "data" / "swe_smith"
SWE_SMITH_MIRROR = "https://github.com/swesmith/{name}.git"  # where SWE-smith keeps its repository mirrors
_GIT_ID = ["-c", "user.name=hermes-rl", "-c", "user.email=hermes-rl@localhost"]

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a Python repository. Use the terminal and file "
    "tools to read the code, run the tests and edit the source. Do not change the tests. When the "
    "bug is fixed, reply with a short summary and no tool call."
)


class SweSmithInstance(BaseModel):
    instance_id: str
    repo: str
    patch: str = Field(..., description="The diff that introduces the bug")
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    problem_statement: str
    base_commit: str | None = None
    repo_url: str | None = Field(None, description="git URL or local path (default: SWE-smith's mirror of `repo`)")

    @property
    def name(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", self.repo.split("/")[-1])[:40]

    def source(self) -> str:
        return self.repo_url or SWE_SMITH_MIRROR.format(name=self.repo.replace("/", "__"))

    @property
    def test_files(self) -> list[str]:
        return sorted({t.split("::")[0] for t in self.FAIL_TO_PASS + self.PASS_TO_PASS})


def load_offline_instances(data_dir: Path = OFFLINE_DATA) -> list[SweSmithInstance]:
    """The bundled instances, with relative `repo_url`s made absolute."""
    instances = []
    for line in (data_dir / "instances.jsonl").read_text().splitlines():
        inst = SweSmithInstance.model_validate_json(line)
        if inst.repo_url and not re.match(r"^[a-z+]+://", inst.repo_url) and not Path(inst.repo_url).is_absolute():
            inst = inst.model_copy(update={"repo_url": str((data_dir / inst.repo_url).resolve())})
        instances.append(inst)
    return instances


def load_swe_smith(split: str, limit: int | None) -> list[SweSmithInstance]:
    from datasets import load_dataset  # noqa: PLC0415 - only for the online dataset

    rows = load_dataset("SWE-bench/SWE-smith", split=split)
    out = []
    for row in rows:
        fields = {k: row.get(k) for k in SweSmithInstance.model_fields if k in row}
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            if isinstance(fields.get(key), str):
                fields[key] = json.loads(fields[key])
        out.append(SweSmithInstance.model_validate(fields))
        if limit is not None and len(out) >= limit:
            break
    return out


# -- deterministic agents -------------------------------------------------------------------------

_INSTANCE_RE = re.compile(r"^Instance: (\S+)$", re.M)
_PATH_RE = re.compile(r"^Repository path: (\S+)$", re.M)


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
        return ModelTurn(content=None, tool_calls=[_call("terminal", {"command": command}, 1)], finish_reason="tool_calls")


class NoOpAgent:
    """Answers at once without touching the repository."""

    async def chat(self, messages, tools, *, temperature, max_tokens) -> ModelTurn:
        return ModelTurn(content="Nothing to do.", finish_reason="stop")


# -- the env ----------------------------------------------------------------------------------------------


class SweSmithOracleEnvConfig(HermesAgentEnvConfig):
    dataset: Literal["offline", "SWE-bench/SWE-smith"] = Field("offline", description="Instance source")
    split: str = Field("train", description="Split of the online dataset")
    limit: int | None = Field(None, ge=1, description="Use at most this many instances")
    agent: Literal["model", "oracle", "noop"] = Field("model", description="model, or a scripted check agent")
    install_command: str | None = Field(None, description="Run in the repository before the tests (e.g. pip install -e .)")
    pytest_plugin_autoload: bool = Field(
        False,
        description="Let pytest load every installed plugin (the sandbox interpreter's); the offline repos need none "
        "and skipping them saves seconds per run; turn on for repositories whose tests rely on plugins",
    )
    setup_timeout_s: float = Field(300.0, gt=0, description="Cloning and preparing the worktree")
    test_timeout_s: float = Field(300.0, gt=0, description="Running the instance's tests")


class SweSmithOracleEnv(HermesAgentBaseEnv):
    name = "swe_smith_oracle"
    env_config_cls = SweSmithOracleEnvConfig
    default_toolsets = ["terminal", "file"]
    default_system_prompt = SYSTEM_PROMPT

    @classmethod
    def config_init(cls):
        config = SweSmithOracleEnvConfig(
            tokenizer_name="embedded",
            group_size=2,
            total_steps=2,
            max_token_length=8192,
            use_wandb=False,
            max_agent_turns=6,
            agent_max_tokens=512,
            tool_backend="sandbox",
            sandbox=SandboxToolBackendConfig(),
            data_path_to_save_groups="out/swe_smith_oracle.jsonl",
            data_dir_to_save_evals="out/swe_smith_oracle_eval",
        )
        return config, embedded_server_configs()

    async def setup(self) -> None:
        cfg: SweSmithOracleEnvConfig = self.config
        if cfg.dataset == "offline":
            instances = load_offline_instances()[: cfg.limit]
        else:
            instances = await asyncio.to_thread(load_swe_smith, cfg.split, cfg.limit)
        if not instances:
            raise HermesEnvError(f"no SWE-smith instances in {cfg.dataset!r}")
        self.instances = instances
        self.by_id = {i.instance_id: i for i in instances}
        self.iter = 0
        self._bundles: dict[str, Path] = {}
        # Bundles are keyed by the repository's content, so reruns reuse them and nothing piles up.
        self._bundle_dir = Path(tempfile.gettempdir()) / "hermes-rl-swe-smith-bundles"
        self._bundle_dir.mkdir(exist_ok=True)
        self._bundle_lock = asyncio.Lock()

    async def get_next_item(self) -> SweSmithInstance:
        item = self.instances[self.iter % len(self.instances)]
        self.iter += 1
        return item

    def make_model(self) -> ChatModel:
        if self.config.agent == "oracle":
            return OracleAgent(self.by_id)
        if self.config.agent == "noop":
            return NoOpAgent()
        return super().make_model()

    def format_prompt(self, item: SweSmithInstance) -> str:
        return (
            f"{item.problem_statement}\n\n"
            f"Instance: {item.instance_id}\n"
            f"Repository path: {item.name}\n"
            f"(relative to your working directory)\n"
            f"Failing tests: {', '.join(item.FAIL_TO_PASS)}"
        )

    async def setup_trajectory_workspace(self, item: SweSmithInstance, ctx: ToolContext) -> None:
        source = await self._source_for(item)
        remote = not Path(source).exists()
        key = hashlib.sha1(item.source().encode()).hexdigest()[:12] + "-" + item.name
        bare = f'"$CACHE"/{key}.git'
        # The sandbox's shared /cache holds one bare clone per repository; without one
        # (a plain local workspace) the clone lives in the workspace.
        cache_dir = (
            'CACHE=/cache/git; mkdir -p "$CACHE" 2>/dev/null && [ -w "$CACHE" ] || '
            '{ CACHE="$PWD/.git-cache"; mkdir -p "$CACHE"; }'
        )
        check = await ctx.executor.exec(f"{cache_dir}; test -d {bare} && echo cached || echo missing", timeout=30, max_output_bytes=1000)
        src_arg = shlex.quote(source)
        if "missing" in check.output and not remote:
            bundle_name = f".src-{key}.bundle"
            await ctx.upload(source, bundle_name)
            src_arg = f'"$PWD"/{shlex.quote(bundle_name)}'
        # Worktrees of every slot are registered in the same bare repo, so each gets a path of
        # its own; the agent works through the stable link `./<repo name>`.
        worktree = f".worktrees/{re.sub(r'[^A-Za-z0-9_-]', '_', ctx.task_id)}"
        commit = shlex.quote(item.base_commit or "HEAD")
        script = f"""set -e
{cache_dir}
exec 9>{bare}.lock
flock 9
if [ ! -d {bare} ]; then git clone -q --bare {src_arg} {bare}.tmp && mv {bare}.tmp {bare}; fi
rm -f .src-*.bundle
mkdir -p .worktrees
# Under the lock too: `worktree add` reads every registered worktree, which other slots
# are adding and removing at the same time.
git -C {bare} worktree add -q --detach "$PWD/{worktree}" {commit}
flock -u 9
ln -sfn {worktree} {shlex.quote(item.name)}
cd {worktree}
git apply --whitespace=nowarn -
git add -A
snap=$(git write-tree)
snap=$(git {' '.join(_GIT_ID)} commit-tree "$snap" -m snapshot)
git reset -q "$snap"
"""
        result = await ctx.executor.exec(
            script, timeout=self.config.setup_timeout_s, max_output_bytes=20_000, stdin=item.patch, network=remote
        )
        if result.exit_code != 0:
            raise RuntimeError(f"preparing {item.instance_id} failed (exit {result.exit_code}): {result.output[-2000:]}")

    async def _source_for(self, item: SweSmithInstance) -> str:
        """A local repository becomes a git bundle on this machine (built once), uploaded into the slot."""
        source = item.source()
        if re.match(r"^[a-z+]+://", source) or not Path(source).exists():
            return source
        async with self._bundle_lock:
            if source not in self._bundles:
                self._bundles[source] = await _bundle(Path(source), self._bundle_dir)
        return str(self._bundles[source])

    async def compute_reward(self, item: SweSmithInstance, result: AgentResult, ctx: ToolContext) -> float:
        path = item.name
        tests = " ".join(shlex.quote(t) for t in item.FAIL_TO_PASS + item.PASS_TO_PASS)
        files = " ".join(shlex.quote(f) for f in item.test_files)
        python = ctx.executor.python.removesuffix(" -")
        install = f"{self.config.install_command}\n" if self.config.install_command else ""
        autoload = "" if self.config.pytest_plugin_autoload else "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "
        script = f"""set -e
cd {shlex.quote(path)}
snap=$(git rev-list --max-parents=0 HEAD | tail -n 1)
git checkout -q "$snap" -- {files}
{install}set +e
{autoload}{python} -m pytest -q -p no:cacheprovider {tests}
rc=$?
# This trajectory's worktree entry in the shared bare repo: removed so the cache does not grow.
admin=$(git rev-parse --absolute-git-dir)
case "$admin" in
  */worktrees/*) exec 9>"${{admin%/worktrees/*}}.lock"; flock 9; rm -rf "$admin" ;;
esac
exit $rc
"""
        run = await ctx.executor.exec(script, timeout=self.config.test_timeout_s, max_output_bytes=50_000)
        return 1.0 if run.exit_code == 0 else 0.0

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        loop_config = self.loop_config().model_copy(update={"temperature": 0.0})
        start = time.time()
        rollouts = await asyncio.gather(*(self.rollout(item, loop_config=loop_config) for item in self.instances))
        scored = [r.score for r in rollouts if r.score is not None]
        metrics = {
            "eval/resolved": sum(scored) / len(scored) if scored else 0.0,
            "eval/infrastructure_failures": sum(r.infrastructure_failure for r in rollouts),
            "eval/n": len(rollouts),
        }
        print(f"[hermes-rl] evaluation: {metrics}")
        samples = [
            {"instance_id": r.item.instance_id, "score": r.score, "error": r.error,
             "stop_reason": r.result.stop_reason if r.result else None}
            for r in rollouts
        ]  # fmt: skip
        await self.evaluate_log(metrics=metrics, samples=samples, start_time=start, end_time=time.time())


def _content_key(repo: Path) -> str:
    h = hashlib.sha1(str(repo).encode())
    for path in sorted(p for p in repo.rglob("*") if p.is_file() and ".git" not in p.relative_to(repo).parts[:1]):
        st = path.stat()
        h.update(f"{path.relative_to(repo)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    if (repo / ".git").exists():
        h.update((repo / ".git" / "HEAD").read_bytes() if (repo / ".git" / "HEAD").is_file() else b"")
    return h.hexdigest()[:16]


async def _bundle(repo: Path, out_dir: Path) -> Path:
    """`git bundle` of a local repository; a plain directory is committed first (fixed identity and date)."""
    key = await asyncio.to_thread(_content_key, repo)
    target = out_dir / f"{repo.name}-{key}.bundle"
    if target.exists():
        return target
    work = repo
    staging = out_dir / f".{repo.name}-{key}-{uuid.uuid4().hex[:6]}"
    try:
        if not (repo / ".git").exists():
            work = staging
            env = {"PATH": "/usr/bin:/bin", "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z"}
            script = (
                f"cp -r {shlex.quote(str(repo))} {shlex.quote(str(work))} && cd {shlex.quote(str(work))} && "
                f"git init -q -b main && git add -A && git {' '.join(_GIT_ID)} commit -q -m 'initial import'"
            )
            await _run(["bash", "-c", script], env)
        partial = staging.with_suffix(".bundle")
        await _run(["git", "-C", str(work), "bundle", "create", "-q", str(partial), "--all"], None)
        partial.replace(target)  # atomic: a concurrent run sees a whole bundle or none
    finally:
        await asyncio.to_thread(shutil.rmtree, staging, True)
    return target


async def _run(argv: list[str], env: dict[str, str] | None) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise HermesEnvError(f"{' '.join(argv[:3])} failed: {out.decode(errors='replace')[-1000:]}")


if __name__ == "__main__":
    SweSmithOracleEnv.cli()
