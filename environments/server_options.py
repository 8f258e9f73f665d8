"""atroposlib's server options, as hermes-rl honours them or refuses them at start.

hermes-rl sends model requests through its own clients (environments/runtime.py), not atroposlib's
ServerManager, so each ServerManager option either has an equivalent here or is refused in one line:

- `--slurm` (ServerManager: server URLs from SLURM_JOB_NODELIST / NUM_TRAINING_NODES): refused;
  list the inference servers in an `openai:` YAML list instead.
- `--testing` (ServerManager: a ServerHarness mock instead of real servers): refused; a scripted
  agent or a local server is the way to test an env.
- `server_type: trl` (TRL's `vllm-serve` `/generate/` protocol): refused; no token protocol here speaks it.
- `health_check` and least-loaded routing: `ServerRouter` below (atroposlib's semantics: a server
  is polled every second; an unhealthy one gets no new work until it answers again; among healthy
  servers the one with the most free slots is chosen). One difference: where atroposlib waits for
  a healthy server forever, with none healthy the router still hands out the least-loaded one, so
  the rollout fails as an infrastructure error and `max_consecutive_infra_failures` ends the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the runtime routes with ServerRouter without importing atroposlib
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig

__all__ = ["refuse_unsupported", "ServerRouter"]

HEALTH_INTERVAL_S = 1.0  # atroposlib's check_server_status_task polls every second


def refuse_unsupported(slurm: bool, testing: bool, server_configs: Sequence[APIServerConfig]) -> str | None:
    """One line naming the first atroposlib option hermes-rl cannot honour, or None."""
    if slurm:
        return (
            "--slurm is not supported: hermes-rl does not read SLURM_JOB_NODELIST; list each inference server "
            "in an `openai:` YAML list (base_url per node) and drop --slurm"
        )
    if testing:
        return (
            "--testing is not supported: atroposlib's mock ServerHarness never reaches hermes-rl's model clients; "
            "test with a scripted agent or a local server (--openai.base_url embedded) and drop --testing"
        )
    for cfg in server_configs:
        if cfg.server_type == "trl":
            return (
                f"--openai.server_type trl ({cfg.base_url}) is not supported: TRL's vllm-serve protocol has no token "
                "client here; run vLLM's OpenAI server and use server_type vllm (or openai for chat mode)"
            )
    return None


class ServerRouter:
    """Picks a server for each trajectory: healthy first, then the most free request slots.

    `probes[i]` checks server i (raises when it does not answer); servers with `health_check`
    on are probed every second while the router runs. A server that stops answering gets no new
    trajectories; it gets work again once a probe succeeds. Slots count trajectories, since a
    trajectory keeps its server (its prompt prefix is cached there) from its first turn to its last.
    """

    def __init__(self, checked: Sequence[bool], probes: Sequence[Callable[[], Awaitable[Any]]]) -> None:
        self.checked = list(checked)
        self.probes = list(probes)
        self.healthy = [True] * len(self.checked)
        self.in_flight = [0] * len(self.checked)
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> ServerRouter:
        self._tasks = [asyncio.ensure_future(self._watch(i)) for i, on in enumerate(self.checked) if on]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _watch(self, index: int) -> None:
        while True:
            try:
                await self.probes[index]()
                healthy = True
            except Exception:  # any failure to answer: atroposlib marks the server unhealthy too
                healthy = False
            self.healthy[index] = healthy
            await asyncio.sleep(HEALTH_INTERVAL_S)

    def pick(self, capacity: Sequence[int]) -> int:
        """The healthy server with the most free slots (`capacity[i] - in_flight[i]`; ties: the lowest
        index); with none healthy, the least-loaded of all."""
        candidates = [i for i, healthy in enumerate(self.healthy) if healthy] or list(range(len(self.healthy)))
        return max(candidates, key=lambda i: (capacity[i] - self.in_flight[i], -i))

    def acquire(self, capacity: Sequence[int]) -> int:
        """A server index for one trajectory (counted in flight until `release`)."""
        index = self.pick(capacity)
        self.in_flight[index] += 1
        return index

    def release(self, index: int) -> None:
        self.in_flight[index] -= 1
