"""HermesAgentBaseEnv: atroposlib's BaseEnv for tool-using agents.

A task env subclasses it and implements `items()`, `format_prompt(item)` and
`compute_reward(item, result, ctx)` (optionally `eval_items()`, `eval_sample(rollout)`,
`eval_metrics(rollouts)` and `setup_trajectory_workspace(item, ctx)`); it gets atroposlib's
`process`, `serve` and `evaluate` commands with `--env.*` / `--openai.*` flags. The smallest one is
environments/examples/count_files.py. Models, tools and rollouts live in the composition
root (environments/runtime.py); the hooks a task implements are in environments/task_hooks.py,
the config in environments/env_config.py, group building in environments/group_building.py; this
class is the atroposlib glue around them (the only one touching `BaseEnv`).

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
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import jsonlines
from atroposlib.envs.base import APIServerConfig, BaseEnv, EvalHandlingEnum

from environments.cli import main as cli_main
from environments.env_config import HermesAgentEnvConfig
from environments.gc_tuning import collector
from environments.group_building import GroupBuilding
from environments.html_view import write_html_view
from environments.models.base import ChatModel
from environments.models.chat_mode import PLACEHOLDER_API_KEY
from environments.env_entry import default_config, embedded_server_configs
from environments.rollout_settings import model_servers
from environments.runtime import EMBEDDED, AgentRuntime, HermesEnvError, Rollout, resolve_tokenizer_name
from environments.server_options import refuse_unsupported
from environments.trainer_boundary import RunApiBoundary, SendLedger

__all__ = [
    "EMBEDDED",
    "HermesAgentEnvConfig",
    "HermesAgentBaseEnv",
    "HermesEnvError",
    "Rollout",
    "embedded_server_configs",
]

logger = logging.getLogger(__name__)


def _wandb_logged_in() -> bool:
    """Whether wandb has credentials, checked the way wandb finds them (key or netrc), without prompting."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return True
    try:
        auth = netrc.netrc().authenticators("api.wandb.ai")
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return bool(auth and auth[2])


class HermesAgentBaseEnv(RunApiBoundary, GroupBuilding, BaseEnv):
    """The atroposlib adapter: task hooks (environments/task_hooks.py), the runtime's settings
    (environments/rollout_settings.py) and group building (environments/group_building.py), as a `BaseEnv`."""

    env_config_cls = HermesAgentEnvConfig
    jsonl_writer: Any  # atroposlib's groups file (a jsonlines.Writer) or None

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
        config.tokenizer_name = resolve_tokenizer_name(config.tokenizer_name, model_servers(server_configs))
        for cfg in server_configs:
            if cfg.server_type != "openai" and cfg.tokenizer_name in ("", "none"):
                # atroposlib's sglang/vllm server classes load a tokenizer by model name from the hub at
                # construction (we never route requests through them): give them the env's, found locally.
                cfg.tokenizer_name = config.tokenizer_name
        if config.max_num_workers == -1 and all(c.base_url == EMBEDDED for c in server_configs):
            # atroposlib would run 8 groups at once; the embedded server serves embedded_parallel sequences.
            config.max_num_workers = max(1, config.runtime.embedded_parallel // config.group_size)
        if config.use_wandb and not _wandb_logged_in():
            logger.warning("wandb is not logged in: running without wandb (run `wandb login` to enable it)")
            config.use_wandb = False
        # atroposlib's ServerManager would start its own health-check tasks; ours route (ServerRouter).
        health_checks = [c.health_check and c.base_url != EMBEDDED for c in server_configs]
        for cfg in server_configs:
            cfg.health_check = False
        # atroposlib compares eval_handling with its own enum's members (identity): hand it one.
        config.eval_handling = EvalHandlingEnum(config.eval_handling.value)
        # atroposlib opens the groups file in __init__; here it is opened when a run starts
        # (_open_output), so a command refused by a later check leaves no file behind.
        output_path, config.data_path_to_save_groups = config.data_path_to_save_groups, None
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        config.data_path_to_save_groups = output_path
        self.config: HermesAgentEnvConfig = config
        self.server_configs = server_configs
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
        self.agent_runtime = AgentRuntime(
            self.runtime_config(),
            servers=model_servers(server_configs, health_checks),
            with_web=self.web_offered(),
            tokenizer=self.tokenizer,
            tools=self.tool_registry(),
        )

    def _gates(self, cfg: APIServerConfig) -> tuple[asyncio.Semaphore, asyncio.Semaphore]:
        train, evaluation = cfg.num_max_requests_at_once, cfg.num_requests_for_eval
        if cfg.base_url == EMBEDDED:  # more would only queue inside llama.cpp
            train, evaluation = (
                min(train, self.config.runtime.embedded_parallel),
                min(evaluation, self.config.runtime.embedded_parallel),
            )
        return asyncio.Semaphore(max(1, train)), asyncio.Semaphore(max(1, evaluation))

    @classmethod
    def config_init(cls) -> tuple[HermesAgentEnvConfig, list[APIServerConfig]]:
        """Defaults for the CLI: the env's config class on the embedded model, output under out/<name>."""
        return default_config(cls.env_config_cls, cls.name), embedded_server_configs()

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
                yield self
            finally:
                await self.teardown()

    async def teardown(self) -> None:
        """Stop what the env started itself (e.g. answer-check workers); the runtime stops the rest."""

    # atroposlib's three entry points, each inside the runtime. Each opens the groups file
    # in every mode (evaluate writes none), so each one closes it and removes it when empty.
    async def process_manager(self):
        await self._in_runtime(super().process_manager, report=True)

    async def env_manager(self):
        await self._in_runtime(self._serve, report=False)

    async def _run_evaluate(self):
        await self._in_runtime(super()._run_evaluate, report=False)

    def _open_output(self) -> None:
        """Open the groups file as atroposlib would (a free name: `x.jsonl`, else `x_1.jsonl`, ...)."""
        if self.config.data_path_to_save_groups is None:
            return
        original = Path(self.config.data_path_to_save_groups)
        original.parent.mkdir(parents=True, exist_ok=True)
        path, n = original, 0
        while path.exists():
            n += 1
            path = original.with_stem(f"{original.stem}_{n}")
        self.config.data_path_to_save_groups = str(path)
        # Each group reaches the file as a whole line at once: a killed command leaves the
        # groups written so far readable, never a buffered half line.
        self.jsonl_writer = jsonlines.open(path, "w", flush=True)

    async def _in_runtime(self, entry: Any, *, report: bool) -> None:
        ok = False
        self._open_output()
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
        if not jsonl.exists():
            return
        # atroposlib's view shows no tool calls and passes model-written HTML through (environments/html_view.py)
        html = jsonl.with_suffix(".html")
        if report or html.exists():
            write_html_view(jsonl)
        if report:
            print(f"[hermes-rl] wrote {self.curr_step} groups to {jsonl.resolve()}")
            print(f"[hermes-rl] HTML view: {html.resolve()}")

    @classmethod
    def cli(cls):
        """`process` / `serve` / `evaluate`: strict flags and YAML (environments/cli.py)."""
        raise SystemExit(cli_main(cls))
