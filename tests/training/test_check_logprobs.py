"""training.check_logprobs on real groups from the embedded model: `process` output and run-api batches."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from training.check_logprobs import CheckConfig, compare, main
from training.groups import IGNORE, Group, LogprobSemantics, read_groups


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(2400)  # the first user of `trained_run` also runs the env and the trainer
@pytest.mark.parametrize("source", ["served", "batch"])
def test_recomputed_logprobs_match_llama_cpp(trained_run, tmp_path, source):
    # Free sampling at temperature 1 (no grammar) by llama.cpp serving the embedded weights in
    # float32: the check is on tokens the model itself chose. Measured here: ~0.002 nats mean,
    # max ~0.02 (llama.cpp's f16 KV cache); a misalignment costs ~1 nat (see the shifted test).
    groups_file = trained_run.served if source == "served" else trained_run.grpo_out / "batches.jsonl"
    report_file = tmp_path / "report.json"
    assert main([str(groups_file), "--model", "embedded", "--report", str(report_file)]) == 0  # default: 0.05
    report = json.loads(report_file.read_text())
    assert report["ok"] and report["tokens"] >= 20 and report["gaps"] == 0
    assert report["mean_delta"] <= 0.01 and report["max_delta"] <= 0.1 and report["within"] == 1.0
    assert report["shift"]["0"] * 20 < min(report["shift"]["-1"], report["shift"]["+1"])


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_q4_engine_numerics_cost_hundredths_of_a_nat_without_misalignment(trained_run, tmp_path):
    # The grammar run sampled with the shipped Q4_1 file: llama.cpp rounds activations to 8 bits
    # for its Q4 matmuls, ~0.03-0.055 nats against float32 (docs/training.md). Still aligned.
    report_file = tmp_path / "report.json"
    main([str(trained_run.processed), "--model", "embedded", "--report", str(report_file), "--max_mean_delta", "0.08"])
    report = json.loads(report_file.read_text())
    assert report["ok"] and report["tokens"] >= 20 and report["gaps"] == 0
    assert 0.01 < report["mean_delta"] <= 0.08
    assert report["shift"]["0"] * 5 < min(report["shift"]["-1"], report["shift"]["+1"])


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(2400)  # the first user of `trained_run` also runs the env and the trainer
def test_logprobs_shifted_by_one_token_fail_loudly(trained_run, tmp_path):
    shifted = tmp_path / "shifted.jsonl"
    rows = [json.loads(line) for line in trained_run.served.read_text().splitlines()]
    for row in rows:
        # Each logprob moves one token later: position t now carries the logprob of token t-1.
        row["inference_logprobs"] = [[lps[0], *lps[:-1]] for lps in row["inference_logprobs"]]
    shifted.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run(
        [sys.executable, "-m", "training.check_logprobs", str(shifted)], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "line up best shifted by -1" in proc.stderr


def _group(inference, params=None) -> Group:
    tokens = [[1, 2, 3, 4, 5]]
    masks = [[IGNORE, IGNORE, 3, 4, 5]]
    semantics = LogprobSemantics.from_generation_params(params)
    return Group(tokens, masks, [0.0], [inference], semantics, None, "test")


def test_a_trained_token_with_the_no_logprob_marker_fails_unless_declared():
    recomputed = [[[0.0, -1.0, -0.5, -0.2, -0.3]]]
    config = CheckConfig(groups="unused")
    silent = compare([_group([1.0, 1.0, -0.5, 1.0, -0.3])], recomputed, config)
    assert silent.gaps == 1 and silent.undeclared_gaps == 1
    assert any("1.0 'no logprob' marker" in f for f in silent.failures)
    record = {
        "logprobs": "log-softmax of the raw logits: temperature 1, before top-k/top-p/min-p",
        "temperature": 0.7,
        "missing_logprobs": {"per_sequence": [1], "policy": "keep", "dropped": 0},
    }
    declared = compare([_group([1.0, 1.0, -0.5, 1.0, -0.3], record)], recomputed, config)
    assert declared.gaps == 1 and declared.undeclared_gaps == 0 and declared.ok
    assert declared.tokens == 2 and declared.mean_delta == 0.0


def test_the_sampling_record_picks_the_distribution():
    raw = LogprobSemantics.from_generation_params(
        {"logprobs": "log-softmax of the raw logits: temperature 1, before top-k/top-p/min-p", "temperature": 0.7}
    )
    assert raw.kind == "raw_logits" and raw.temperature == 1.0
    policy = LogprobSemantics.from_generation_params(
        {
            "logprobs": "log-probability under the distribution sampled: after temperature and top-k/top-p/min-p",
            "temperature": 0.7,
            "top_k": 0,
            "top_p": 1.0,
            "min_p": 0.0,
        }
    )
    assert policy.kind == "sampling_policy" and policy.temperature == 0.7
    with pytest.raises(ValueError, match="chat mode"):
        LogprobSemantics.from_generation_params({"logprobs": None})
    assert LogprobSemantics.from_generation_params(None) == LogprobSemantics()


def test_sampling_policy_logprobs_follow_llama_cpp_truncation_then_temperature():
    import torch

    from training.policy import token_logprobs

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    tokens = torch.tensor([0, 1])
    top2 = LogprobSemantics("sampling_policy", temperature=0.5, top_k=2)
    # kept: tokens 0 and 1, then softmax of logits / 0.5 over them
    expected = torch.log_softmax(torch.tensor([4.0, 2.0]), -1)[1]
    assert token_logprobs(logits, tokens, top2)[1].item() == pytest.approx(expected.item(), rel=1e-6)
    raw = token_logprobs(logits, tokens, LogprobSemantics())[1]
    assert raw.item() == pytest.approx(torch.log_softmax(logits[0], -1)[1].item(), rel=1e-6)
    # min_p 0.3 keeps tokens with p >= 0.3 * p_max: tokens 0 and 1 (p1/p0 = e^-1 = 0.37)
    minp = LogprobSemantics("sampling_policy", min_p=0.3)
    assert token_logprobs(logits, tokens, minp)[1].item() == pytest.approx(
        torch.log_softmax(torch.tensor([2.0, 1.0]), -1)[1].item(), rel=1e-6
    )


def test_groups_are_read_from_process_lines_and_batch_responses(tmp_path):
    group = {"tokens": [[1, 2]], "masks": [[IGNORE, 2]], "scores": [1.0], "inference_logprobs": [[1.0, -0.1]]}
    (tmp_path / "p.jsonl").write_text(json.dumps(group) + "\n" + json.dumps(group) + "\n")
    (tmp_path / "b.json").write_text(json.dumps({"batch": [group, group, group]}))
    assert len(read_groups(tmp_path / "p.jsonl")) == 2 and len(read_groups(tmp_path / "b.json")) == 3
    (tmp_path / "bad.jsonl").write_text(json.dumps({"tokens": [[1]], "masks": [[1, 2]], "scores": [0]}))
    with pytest.raises(ValueError, match="different lengths"):
        read_groups(tmp_path / "bad.jsonl")
