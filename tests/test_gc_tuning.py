"""The runner's collector profile: applied only inside its block, and undone afterwards."""

from __future__ import annotations

import gc

import pytest

from batch_runner import parse_args
from environments.gc_tuning import GCConfig, collector


def test_default_profile_leaves_the_collector_alone():
    before = gc.get_threshold(), gc.get_freeze_count()
    with collector(GCConfig()):
        assert (gc.get_threshold(), gc.get_freeze_count()) == before
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


def test_throughput_profile_is_scoped_and_restored_even_on_error():
    before = gc.get_threshold()
    with pytest.raises(RuntimeError):
        with collector(GCConfig(profile="throughput", middle_every=1234)):
            assert gc.get_threshold() == (before[0], 1234, before[2])
            assert gc.get_freeze_count() > 0  # what existed before is never scanned again
            raise RuntimeError("the run failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_batch_runner_takes_the_profile_from_its_command_line(tmp_path):
    base = ["--dataset_file", str(tmp_path / "d.jsonl"), "--run_name", "r", "--model", "m", "--base_url", "http://x/v1"]
    assert parse_args(base).gc.profile == "default"
    assert parse_args([*base, "--gc_profile", "throughput"]).gc.profile == "throughput"
    with pytest.raises(SystemExit):
        parse_args([*base, "--gc_profile", "off"])
