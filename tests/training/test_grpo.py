"""training.grpo: one step through the real run-api on groups the embedded model served."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors import safe_open

from training.groups import IGNORE, Group, LogprobSemantics, parse_groups
from training.grpo import policy_loss, sequence_inputs
from training.models import embedded_checkpoint, load_causal_lm
from training.policy import token_logprobs


def _batch_groups(run) -> list[Group]:
    lines = (run.grpo_out / "batches.jsonl").read_text().splitlines()
    assert len(lines) == 1
    return list(parse_groups(json.loads(lines[0]), "batch"))


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(2400)  # the first user of `trained_run` also runs the env and the trainer
def test_one_step_through_run_api_gives_finite_loss_and_new_weights(trained_run):
    assert trained_run.grpo_returncode == 0, trained_run.grpo_log[-3000:]
    (metrics,) = [json.loads(line) for line in (trained_run.grpo_out / "metrics.jsonl").read_text().splitlines()]
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["kl"])
    assert metrics["tokens"] > 0 and metrics["sequences"] == 2 and metrics["gaps"] == 0
    # Same weights sampled the batch (llama.cpp in float32): before the update train and inference agree closely.
    assert metrics["mismatch"] < 0.02
    groups = _batch_groups(trained_run)
    assert len(set(groups[0].scores)) == 2  # different scores: non-zero advantages

    changed = same = 0
    with (
        safe_open(str(embedded_checkpoint() / "model.safetensors"), "pt") as before,
        safe_open(str(trained_run.grpo_out / "model.safetensors"), "pt") as after,
    ):
        assert set(after.keys()) >= set(before.keys())
        for name in before.keys():
            if torch.equal(before.get_tensor(name), after.get_tensor(name)):
                same += 1
            else:
                changed += 1
    assert changed > 0.9 * (changed + same), (changed, same)
    # The saved directory is a complete checkpoint: it loads, tokenizer included.
    from transformers import AutoTokenizer

    model, _ = load_causal_lm(str(trained_run.grpo_out))
    assert AutoTokenizer.from_pretrained(str(trained_run.grpo_out)).decode(groups[0].tokens[0][:5])
    assert sum(p.numel() for p in model.parameters()) > 1e8


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(2400)  # the first user of `trained_run` also runs the env and the trainer
def test_gradient_is_exactly_zero_at_masked_positions(trained_run):
    groups = _batch_groups(trained_run)
    model, _ = load_causal_lm("embedded")
    checked = 0
    for group in groups:
        for inputs, masks in zip(sequence_inputs(group), group.masks):
            ids = torch.tensor(inputs.tokens)
            logits = model(input_ids=ids[None]).logits[0]
            logits.retain_grad()
            new = token_logprobs(logits, ids, group.semantics)
            new.retain_grad()
            loss, _ = policy_loss(new, inputs, clip_eps=0.2)
            loss.backward()
            masked = [t for t, m in enumerate(masks) if m == IGNORE]
            trained = [t for t, m in enumerate(masks) if m != IGNORE]
            assert masked and trained
            # The logits at t-1 predict token t: only rows that predict a trained token get gradient.
            assert torch.count_nonzero(new.grad[masked]) == 0
            assert torch.count_nonzero(logits.grad[[t - 1 for t in masked if t > 0]]) == 0
            # Every trained token gets gradient, except where PPO's clip cuts it (ratio outside the
            # range on the side its advantage pushes towards).
            ratio = (new.detach() - torch.tensor(inputs.old_logprobs)).exp()
            adv = inputs.advantages[0]
            cut = {t for t in trained if (adv > 0 and ratio[t] > 1.2) or (adv < 0 and ratio[t] < 0.8)}
            assert len(cut) < len(trained) / 4
            assert all(
                new.grad[t] != 0 and torch.count_nonzero(logits.grad[t - 1]) > 0 for t in trained if t not in cut
            )
            assert all(new.grad[t] == 0 for t in cut)
            model.zero_grad(set_to_none=True)
            checked += 1
    assert checked == 2


def _group(scores, masks, logprobs, advantages=None) -> Group:
    tokens = [[5, 6, 7, 8] for _ in scores]
    masks = [[t if keep else IGNORE for t, keep in zip(tok, m)] for tok, m in zip(tokens, masks)]
    return Group(tokens, masks, scores, logprobs, LogprobSemantics(), advantages, "test")


def test_advantages_are_normalised_within_the_group_and_gaps_are_not_trained():
    group = _group([1.0, 0.0], [[0, 1, 1, 1], [0, 0, 1, 1]], [[1.0, -0.5, 1.0, -0.2], [1.0, 1.0, -0.3, -0.4]])
    first, second = sequence_inputs(group)
    assert first.advantages[0] == pytest.approx(1.0, abs=1e-5)
    assert second.advantages[0] == pytest.approx(-1.0, abs=1e-5)
    # Position 2 of the first sequence is trained by its mask but carries the 1.0 marker: a gap.
    assert first.trained == [False, True, False, True] and first.gaps == 1
    assert second.trained == [False, False, True, True] and second.gaps == 0
    assert first.old_logprobs == [0.0, -0.5, 0.0, -0.2]


def test_a_split_rollout_counts_once_and_its_sequences_share_its_advantage():
    # Rollout 0 (score 1) spans two token sequences, rollout 1 (score 0) one: [1 split, 0].
    row = {
        "tokens": [[5, 6, 7]] * 3,
        "masks": [[IGNORE, 6, 7]] * 3,
        "scores": [1.0, 1.0, 0.0],
        "inference_logprobs": [[1.0, -0.1, -0.2]] * 3,
        "group_overrides": {"sequence_rollouts": [0, 0, 1], "rollouts": 2, "group_size": 3},
    }
    (split,) = parse_groups(row, "split")
    single = _group([1.0, 0.0], [[0, 1, 1, 1]] * 2, [[1.0, -0.1, -0.2, -0.3]] * 2)
    split_adv = [s.advantages[0] for s in sequence_inputs(split)]
    single_adv = [s.advantages[0] for s in sequence_inputs(single)]
    assert split_adv == pytest.approx([1.0, 1.0, -1.0], abs=1e-5)
    assert split_adv == [single_adv[0], single_adv[0], single_adv[1]]  # as if the rollout were one sequence
    (per_sequence,) = parse_groups({**row, "group_overrides": None}, "no index")
    assert [s.advantages[0] for s in sequence_inputs(per_sequence)] != pytest.approx(split_adv, abs=0.1)
    with pytest.raises(ValueError, match="rollout 0 carry different scores"):
        list(parse_groups({**row, "scores": [1.0, 0.5, 0.0]}, "bad"))


def test_a_mask_that_is_not_its_token_is_refused():
    group = _group([1.0, 0.0], [[0, 1, 1, 1], [0, 0, 1, 1]], [[1.0, -0.5, -0.1, -0.2], [1.0, 1.0, -0.3, -0.4]])
    group.masks[1][3] = 99
    with pytest.raises(ValueError, match="neither -100 nor its token id"):
        sequence_inputs(group)


def test_clipped_objective_matches_ppo_by_hand():
    group = _group([1.0, 0.0], [[0, 1, 1, 1], [0, 1, 1, 1]], [[1.0, -1.0, -1.0, -1.0]] * 2)
    inputs = sequence_inputs(group)[0]  # advantage +1
    # log ratios 0, +0.5, -0.5 at the trained positions (position 0 is never trained)
    new = torch.tensor([0.0, -1.0, -0.5, -1.5], requires_grad=True)
    loss, sums = policy_loss(new, inputs, clip_eps=0.2)
    r = torch.tensor([1.0, math.exp(0.5), math.exp(-0.5)])
    expected = -torch.minimum(r, r.clamp(0.8, 1.2)).sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)  # advantage 1 / (1 + 1e-6)
    assert sums["clipped"] == 2
    assert sums["kl"] == pytest.approx(float((r - 1 - r.log()).sum()), rel=1e-6)
    loss.backward()
    # Clipped above with a positive advantage: no gradient there; below the range it still pulls up.
    assert new.grad[0] == 0 and new.grad[2] == 0 and new.grad[1] < 0 and new.grad[3] < 0
