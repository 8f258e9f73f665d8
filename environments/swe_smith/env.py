"""SWE-smith tasks in sandbox slots: fix an injected bug, scored by the repo's own tests.

    python -m environments.swe_smith_oracle_env process --env.total_steps 2 --env.group_size 2
    python -m environments.swe_smith_oracle_env evaluate --env.agent oracle     # must score 1.0
    python -m environments.swe_smith_oracle_env process --env.dataset SWE-bench/SWE-smith ...
    python -m environments.swe_smith_oracle_env evaluate --env.dataset my_instances.jsonl --env.mirror_base /srv/mirrors

Instances have SWE-smith's published shape: `repo` = `swesmith/<owner>__<name>.<sha8>`, the mirror is
`{mirror_base}/{repo}.git` (a URL, or a local directory of bare repositories); a branch named after
`instance_id` holds "Bug Patch" (the `patch`, never applied again) and then "Remove F2P Tests" (the
FAIL_TO_PASS test files deleted), its head being the row's `base_commit`. `image_name` is the instance's
environment: on a container backend (docker, Nomad, Modal) its rows run there, the repository at /testbed (without it: --env.deps,
environments/swe_smith/deps.py); the test command comes from
SWE-smith's repository profile (environments/data/swe_smith/profiles.json, generated from SWE-smith's
package by scripts/swe_smith_profiles.py), else pytest. Unusable rows are skipped with counted reasons.
docs/swe_smith.md tells the whole story.

This process keeps one bare mirror per repository (never visible to slots) and gives each workspace a
one-commit snapshot of the branch head (its history would reveal the bug). The reward comes from
`environments.verifier`: the agent's diff to non-test files, applied to a pristine checkout in a fresh
slot, the test files restored from "Bug Patch" (as SWE-smith's harness does with HEAD~1), tested.
Every scored trajectory is also written to `preds.jsonl` beside the groups file, in SWE-bench's
prediction format.

The offline default is a handful of tiny repositories with injected bugs (environments/data/swe_smith/),
turned into a local mirror of the published shape at startup. `--env.agent oracle` replaces the model
with `OracleAgent`, which reverts the bug through the terminal tool; `noop` answers without touching
anything. Both are deterministic `ChatModel`s for checking the env.
"""

from __future__ import annotations

import asyncio
import collections
import json
import shlex
import sys
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from environments.agent_loop import AgentResult
from environments.check_agents import NoOpAgent
from environments.image_sandboxes import ImageSandboxes
from environments.hermes_base_env import HermesAgentBaseEnv, HermesEnvError, Rollout
from environments.models.base import ChatModel
from environments.swe_smith.config import ENTRY, SweSmithOracleEnvConfig
from environments.swe_smith.deps import DEFAULT_INSTALL, PreparedRepoEnv, RepoEnvError, prepare_repo_env
from environments.swe_smith.instances import (
    DEFAULT_TEST_CMD,
    IMAGE_ENV_PREFIX,
    OFFLINE_DATA,
    SweSmithInstance,
    build_test_command,
    check_dataset,
    default_cache,
    load_instances,
    load_offline_instances,
    profile_for,
    read_rows,
)
from environments.swe_smith.oracle import OracleAgent
from environments.swe_smith.snapshots import SnapshotStore
from environments.verifier import (
    GIT_SAFE,
    TestVerifier,
    TestVerifierConfig,
    Verdict,
    capture_diff,
    runs_pytest,
    split_diff,
)
from tools.context import ToolContext
from tools.executor import ToolExecutor

__all__ = ["NoOpAgent", "OracleAgent", "SweSmithOracleEnv", "SweSmithOracleEnvConfig"]

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a Python repository. Use the terminal and file "
    "tools to read the code, run the tests and edit the source. Do not change the tests. When the "
    "bug is fixed, reply with a short summary and no tool call."
)


# Where SWE-smith's images keep the repository (SWE-bench's DOCKER_WORKDIR), their editable install
# pointing there: on a container backend the slot's workspace is mounted here and the checkout fills it.
TESTBED = "/testbed"


def _aux(dest: str, what: str) -> str:
    """Workspace-relative path of a file travelling with the checkout at `dest`: beside it, or inside it
    (removed once used) when the checkout is the workspace itself."""
    return f".hermes-{what}" if dest == "." else f".{dest}.{what}"


def restore_tests(dest: str | None) -> str:
    """Run in the verifier's checkout once the agent's diff is applied: the test files from the "Bug Patch"
    commit (see `SnapshotStore.snapshot`) replace whatever is there. No archive (nothing to restore): nothing
    happens. `dest` None: the verifier's own directory beside the archive."""
    tests = shlex.quote(_aux(dest, "tests.tar")) if dest == "." else '"../.$(basename "$PWD").tests.tar"'
    return (
        f"tests={tests}\n"
        'if [ -f "$tests" ]; then tar -xf "$tests" || echo "hermes-rl: restoring the test files failed"; '
        'rm -f "$tests"; fi'
    )


def _failing_tests(item: SweSmithInstance, mode: str) -> str:
    """The prompt's line on FAIL_TO_PASS; on the published layout those files are hidden from the agent."""
    if mode == "none":
        return ""
    if mode == "ids":
        return f"\nFailing tests: {', '.join(item.FAIL_TO_PASS)}"
    files = sorted({t.split("::")[0] for t in item.FAIL_TO_PASS})
    more = f" and {len(files) - 20} more files" if len(files) > 20 else ""
    return f"\nFailing tests: {len(item.FAIL_TO_PASS)} in {', '.join(files[:20])}{more}"


# -- the env ----------------------------------------------------------------------------------------------


def _on_images(cfg: SweSmithOracleEnvConfig) -> bool:
    """Whether slots run the instance's own image (its test command then activates the image's env)."""
    auto = cfg.image_policy == "auto" and cfg.runtime.tool_backend == "sandbox"
    return auto and cfg.runtime.sandbox.backend.in_containers


class SweSmithOracleEnv(HermesAgentBaseEnv):
    config: SweSmithOracleEnvConfig  # this env's own settings class
    name = ENTRY.name
    env_config_cls = SweSmithOracleEnvConfig
    default_toolsets = ["terminal", "file"]
    default_system_prompt = SYSTEM_PROMPT

    def __init__(self, config: SweSmithOracleEnvConfig, *args: Any, **kwargs: Any) -> None:
        check_dataset(config.dataset)
        # Before the base class opens the groups file: a refused command leaves nothing behind.
        if _on_images(config) and config.verify_in == "same_slot":
            raise HermesEnvError(
                "--env.verify_in same_slot cannot verify in the instance's image: the repository must be at "
                f"{TESTBED}, where the agent's is; use --env.verify_in fresh_slot"
            )
        cache = Path(config.cache_dir) if config.cache_dir else default_cache()
        self._env_dir = Path(config.deps.dir) if config.deps.dir else cache / "envs"
        super().__init__(_with_env_dir_visible(config, self._env_dir), *args, **kwargs)
        self._cache = cache
        self._envs: dict[str, PreparedRepoEnv] = {}
        self._snapshots = SnapshotStore(cache, config.setup_timeout_s)
        self._locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self._verifier = TestVerifier(TestVerifierConfig(timeout_s=config.test_timeout_s))
        self.verdicts: dict[str, Verdict] = {}
        self._preds_lock = asyncio.Lock()
        self._preds_path: Path | None = None

    def _runs_images(self) -> bool:
        """Whether rows naming an image run: on that image, or here with their dependencies provided."""
        cfg: SweSmithOracleEnvConfig = self.config
        if cfg.image_policy != "auto":
            return cfg.image_policy == "base"
        return self._on_images() or cfg.deps.mode == "venv"

    def _on_images(self) -> bool:
        """Whether slots run the instance's own image (its test command then activates the image's env)."""
        return _on_images(self.config)

    def _image_pools(self) -> bool:
        """Whether each row runs in a slot pool of its own `image_name`, its repository at /testbed."""
        return self._on_images()

    def _repo_dir(self, item: SweSmithInstance) -> str:
        """The repository, relative to the slot's workspace: the workspace itself in an image (/testbed)."""
        return "." if self._image_pools() else item.name

    def make_tool_backend(self) -> ImageSandboxes | None:
        # A pool per image on a container backend; otherwise the runtime's pool over --env.runtime.sandbox.
        return ImageSandboxes(self.config.runtime.sandbox) if self._image_pools() else None

    def _slot(self, item: SweSmithInstance, task_id: str) -> AbstractAsyncContextManager[ToolExecutor]:
        """A slot for the item: of its image's pool on a container backend (the backend's image when it names none)."""
        backend = self.agent_runtime.tool_backend
        if backend is None:
            raise RuntimeError("rollout() outside the env's runtime; use process/serve/evaluate or `env.runtime()`")
        if isinstance(backend, ImageSandboxes):
            # The published image as named (the backend's pull policy fetches it), the slot's workspace where
            # the image keeps the repository (its editable install points there).
            image = item.image_name or getattr(backend.config.backend, "image", None)
            if image is None:
                raise HermesEnvError(
                    f"{item.instance_id} names no image_name and the {backend.config.backend.kind} backend no image; "
                    "set env.runtime.sandbox.backend.image"
                )
            return backend.trajectory(task_id, image=image, workspace=TESTBED)
        return backend.trajectory(task_id)

    def open_workspace(self, item: SweSmithInstance, task_id: str) -> AbstractAsyncContextManager[ToolExecutor]:
        return self._slot(item, task_id)

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
        if images and cfg.image_policy != "base" and not self._image_pools():
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
        if cfg.deps.mode == "venv":
            for inst in {i.repo: i for i in instances}.values():  # one environment per repository, before any rollout
                await self._repo_env(inst)
        self.instances = instances
        self.by_id = {i.instance_id: i for i in instances}
        return instances

    async def _repo_env(self, item: SweSmithInstance) -> PreparedRepoEnv:
        """The repository's prepared environment (built on this machine the first time; see deps.py)."""
        cfg: SweSmithOracleEnvConfig = self.config
        async with self._locks[f"env:{item.repo}"]:
            if item.repo not in self._envs:
                profile = profile_for(item.repo, self.extra_profiles)
                install = cfg.deps.install_command or "\n".join(profile.get("install_cmds") or []) or DEFAULT_INSTALL
                with_pytest = runs_pytest(profile.get("test_cmd") or DEFAULT_TEST_CMD)
                print(f"[hermes-rl] SWE-smith: preparing {item.repo}'s environment ({install!r})", file=sys.stderr)
                try:
                    self._envs[item.repo] = await asyncio.to_thread(
                        prepare_repo_env,
                        repo=item.repo,
                        mirror=await self._snapshots.mirror(item, self.mirror_base),
                        install_command=install,
                        with_pytest=with_pytest,
                        base_dir=self._env_dir,
                        config=cfg.deps,
                    )
                except RepoEnvError as exc:
                    raise HermesEnvError(
                        f"{item.repo}: {exc} (set --env.deps.install_command, or --env.deps.mode off)"
                    ) from None
            return self._envs[item.repo]

    def _python(self, item: SweSmithInstance, executor: ToolExecutor) -> str:
        """Shell words starting the interpreter the tests run with: the repository's prepared env, else the slot's."""
        env = self._envs.get(item.repo)
        return env.interpreter() if env else executor.python.removesuffix(" -")

    async def eval_items(self) -> list[SweSmithInstance]:
        return self.instances  # evaluate runs every usable instance once

    def scripted_agent(self) -> Callable[[], ChatModel] | None:
        if self.config.agent == "oracle":
            return lambda: OracleAgent(self.by_id)
        return NoOpAgent if self.config.agent == "noop" else None

    def format_prompt(self, item: SweSmithInstance) -> str:
        where = (
            f"Repository path: {TESTBED}\n(your working directory)"
            if self._image_pools()
            else f"Repository path: {item.name}\n(relative to your working directory)"
        )
        return (
            f"{item.problem_statement}\n\n"
            f"Instance: {item.instance_id}\n"
            f"{where}"
            + _failing_tests(item, self.config.prompt_tests)
            + (
                f"\nPython with the repository's dependencies (run it in the repository path): {env.interpreter()}"
                if (env := self._envs.get(item.repo))
                else ""
            )
            + self._activation(item)
        )

    def _activation(self, item: SweSmithInstance) -> str:
        """The prompt's line on the image's environment: how the test command activates it."""
        if not (item.image_name and self._image_pools()):
            return ""
        activate = IMAGE_ENV_PREFIX.match(profile_for(item.repo, self.extra_profiles).get("test_cmd") or "")
        return f"\nThe repository's environment: {activate.group(0).strip().rstrip(';')}" if activate else ""

    # -- the starting tree: a host-side bare mirror, a one-commit snapshot bundle per instance --

    async def _checkout(
        self, item: SweSmithInstance, executor: ToolExecutor, dest: str, *, with_tests: bool = False
    ) -> None:
        """The instance's starting tree at `dest` in a workspace, from the uploaded snapshot bundle.

        `with_tests` (the verifier's checkout): also leave the test files to restore beside it (`_aux`), for
        `restore_tests` to unpack once the agent's diff is applied. `dest` "." is the workspace itself.
        """
        start = await self._snapshots.snapshot(item, self.mirror_base)
        name = _aux(dest, "bundle")
        await executor.write_file(name, await asyncio.to_thread(start.bundle.read_bytes))
        if with_tests and start.tests is not None:
            await executor.write_file(_aux(dest, "tests.tar"), await asyncio.to_thread(start.tests.read_bytes))
        script = f"""set -e
{GIT_SAFE} init -q {shlex.quote(dest)}
cd {shlex.quote(dest)}
{GIT_SAFE} fetch -q "$OLDPWD"/{shlex.quote(name)} {start.commit}
{GIT_SAFE} -c advice.detachedHead=false checkout -q {start.commit}
rm -f "$OLDPWD"/{shlex.quote(name)}
"""
        result = await executor.exec(script, timeout=self.config.setup_timeout_s, max_output_bytes=20_000)
        if result.exit_code != 0:
            raise RuntimeError(
                f"preparing {item.instance_id} failed (exit {result.exit_code}): {result.output[-2000:]}"
            )

    async def setup_trajectory_workspace(self, item: SweSmithInstance, ctx: ToolContext) -> None:
        await self._checkout(item, ctx.executor, self._repo_dir(item))

    # -- the reward ---------------------------------------------------------------------------------

    async def compute_reward(self, item: SweSmithInstance, result: AgentResult, ctx: ToolContext):
        snap = (await self._snapshots.snapshot(item, self.mirror_base)).commit
        broken: str | None = None
        try:
            patch = await capture_diff(ctx.executor, self._repo_dir(item), snap)
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

        async def in_fresh_slot() -> float:
            async with self._slot(item, f"{ctx.task_id}-verify") as executor:
                return await verify(executor)

        return in_fresh_slot  # run by the base env once the agent's slot is released

    async def _verify(self, item: SweSmithInstance, patch: str, executor: ToolExecutor) -> Verdict:
        cfg: SweSmithOracleEnvConfig = self.config
        profile = profile_for(item.repo, self.extra_profiles)
        python = self._python(item, executor)
        on_image = bool(item.image_name) and self._on_images()
        command = build_test_command(item, profile, python=python, on_image=on_image)
        if not cfg.pytest_plugin_autoload and not on_image and item.repo not in self._envs:  # a venv: the repo's
            command = f"export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1\n{command}"
        # In an image the checkout is the workspace (/testbed): a fresh slot of the image's pool.
        dest = "." if self._image_pools() else None
        return await self._verifier.verify(
            executor,
            prepare=lambda ex, dest: self._checkout(item, ex, dest, with_tests=True),
            patch=patch,
            test_command=command,
            must_pass=item.FAIL_TO_PASS + item.PASS_TO_PASS,
            setup_command="\n".join(filter(None, [restore_tests(dest), cfg.install_command])),
            dest=dest,
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
                # runner tampering in the diff or the run (scored 0): what and where
                "flagged": bool(verdict.flags),
                "flags": verdict.flags,
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


def _with_env_dir_visible(config: SweSmithOracleEnvConfig, env_dir: Path) -> SweSmithOracleEnvConfig:
    """With --env.deps.mode venv, the local backend's slots see the prepared environments (read-only)."""
    runtime = config.runtime
    if config.deps.mode != "venv" or runtime.tool_backend != "sandbox":
        return config
    backend = runtime.sandbox.backend
    if backend.kind != "local":
        raise HermesEnvError(
            f"--env.deps.mode venv prepares environments on this machine, which {backend.kind} slots cannot see; "
            "there the instance's image provides them (--env.deps.mode off)"
        )
    env_dir.mkdir(parents=True, exist_ok=True)  # bwrap shows only paths that exist when a server starts
    backend = backend.model_copy(update={"extra_ro_paths": [*backend.extra_ro_paths, str(env_dir.resolve())]})
    sandbox = runtime.sandbox.model_copy(update={"backend": backend})
    return config.model_copy(update={"runtime": runtime.model_copy(update={"sandbox": sandbox})})


def _append(path: Path, text: str, mode: str) -> None:
    with path.open(mode) as f:
        f.write(text)


if __name__ == "__main__":
    SweSmithOracleEnv.cli()
