"""The runner's collector profiles: applied only inside their block, undone afterwards, and the
`scaled` profile's price (cyclic garbage waits longer) stays within a bound of the live heap."""

from __future__ import annotations

import gc
from collections import deque

import pytest

from batch_runner import parse_args
from environments.cli_parse import CliError
from environments.examples.count_files import CountFilesEnv
from environments.gc_tuning import GCConfig, collector
from environments.hermes_base_env import HermesAgentEnvConfig
from environments.models.base import ModelTurn


def test_cpython_profile_leaves_the_collector_alone():
    before = gc.get_threshold(), gc.get_freeze_count(), list(gc.callbacks)
    with collector(GCConfig(profile="cpython")):
        assert (gc.get_threshold(), gc.get_freeze_count(), list(gc.callbacks)) == before
    assert (gc.get_threshold(), gc.get_freeze_count(), list(gc.callbacks)) == before


def test_throughput_profile_is_scoped_and_restored_even_on_error():
    before = gc.get_threshold()
    with pytest.raises(RuntimeError):
        with collector(GCConfig(profile="throughput", middle_every=1234)):
            assert gc.get_threshold() == (before[0], 1234, before[2])
            assert gc.get_freeze_count() > 0  # what existed before is never scanned again
            raise RuntimeError("the run failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_scaled_profile_grows_the_middle_period_with_the_heap_and_is_restored():
    before = gc.get_threshold(), list(gc.callbacks)
    with pytest.raises(RuntimeError):
        with collector(GCConfig()):
            assert gc.get_freeze_count() > 0
            small = gc.get_threshold()
            live = [[] for _ in range(200_000)]
            gc.collect()  # every full collection recounts the old generation
            young, middle, oldest = gc.get_threshold()
            assert (young, oldest) == (before[0][0], 1)
            assert middle >= 2 * len(live) // young > small[1]  # middle_share 2
            del live
            gc.collect()
            assert gc.get_threshold()[1] < middle  # and shrinks with it
            raise RuntimeError("the run failed")
    assert (gc.get_threshold(), list(gc.callbacks)) == before
    assert gc.get_freeze_count() == 0


def _peak_cyclic_garbage(profile: str, live_lists: int, window: int, pairs: int) -> float:
    """Peak cyclic garbage over the live objects, for pairs of objects in a cycle that each stay
    referenced while `window` newer pairs are made (long enough to be promoted), then are dropped."""
    alive = [0, 0]

    class Node:
        __slots__ = ("other",)

        def __init__(self) -> None:
            alive[0] += 1
            alive[1] = max(alive[0], alive[1])

        def __del__(self) -> None:
            alive[0] -= 1

    with collector(GCConfig(profile=profile)):
        live = [[] for _ in range(live_lists)]
        gc.collect()
        recent: deque[Node] = deque(maxlen=window)
        for _ in range(pairs):
            a, b = Node(), Node()
            a.other, b.other = b, a
            recent.append(a)
        del live, recent
        gc.collect()
    return (alive[1] - 2 * window) / (live_lists + 2 * window)


@pytest.mark.parametrize("window", [2_500, 25_000, 100_000])
def test_scaled_profile_bounds_cyclic_garbage_by_the_live_heap(window):
    # Every allocation becomes cyclic garbage after a while: the workload the profile is worst at.
    # Measured 2.0-2.5x the live objects; CPython's own settings 0.6-1.8x; the throughput
    # profile 3.2-18x (it fails here).
    ratio = _peak_cyclic_garbage("scaled", 50_000, window, 500_000)
    assert ratio <= 3.0


def test_the_scaled_profile_is_what_every_runner_uses_by_default(tmp_path):
    base = ["--dataset_file", str(tmp_path / "d.jsonl"), "--run_name", "r", "--model", "m", "--base_url", "http://x/v1"]
    assert parse_args(base).gc.profile == "scaled"
    assert HermesAgentEnvConfig().gc.profile == "scaled"  # process / serve / evaluate
    assert parse_args([*base, "--gc.profile", "cpython"]).gc.profile == "cpython"
    assert parse_args([*base, "--gc.profile", "throughput"]).gc.profile == "throughput"
    with pytest.raises(CliError, match="--gc.profile"):
        parse_args([*base, "--gc.profile", "off"])


async def test_process_serve_and_evaluate_run_under_the_configured_profile(tmp_path):
    class Offline(CountFilesEnv):
        """No model server: a model that always answers (the runtime is what is under test)."""

        def runtime(self, model=None):
            return super().runtime(model=lambda: _Answer())

    seen = []

    async def entry():  # stands for atroposlib's process / serve / evaluate loop
        seen.append((gc.get_threshold()[2], gc.get_freeze_count() > 0, len(gc.callbacks)))

    config, servers = Offline.config_init()
    config.data_path_to_save_groups = str(tmp_path / "groups.jsonl")
    before = gc.get_threshold(), len(gc.callbacks)
    await Offline(config, servers)._in_runtime(entry, report=False)
    config.gc = GCConfig(profile="cpython")
    await Offline(config, servers)._in_runtime(entry, report=False)
    assert seen == [(1, True, before[1] + 1), (before[0][2], False, before[1])]
    assert (gc.get_threshold(), len(gc.callbacks)) == before


class _Answer:
    async def chat(self, messages, tools, options):
        return ModelTurn(content="0")
