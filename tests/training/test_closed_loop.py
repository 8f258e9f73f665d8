"""The closed loop on CPU (training.sync): two steps, each sampled from the weights the last one served.

Each step: the policy server (llama.cpp, float32 GGUF) samples a group for a fixed prompt, the
group's rewarded sequence is the one with the highest reward, `train_step` updates the HF
weights on it and `PolicyServer.publish` writes them as a GGUF and restarts the server on the
same port. Checked: the served model changes after a step (llama.cpp's logprob of a fixed
sequence moves), the served GGUF is the trained model (llama.cpp's logprobs equal transformers'
on the trained weights within 0.01 nats: the q/k permutation and the metadata are right), and the
logprob of the rewarded sequences rises.
"""

from __future__ import annotations

import httpx
import pytest
import torch

from training.groups import IGNORE, Group, LogprobSemantics
from training.grpo import GRPOConfig, train_step
from training.models import load_causal_lm
from training.policy import sequence_logprobs
from training.sync import PolicyServer

PROMPT = "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"
N_PREDICT = 6


def _complete(server: PolicyServer, prompt_ids: list[int], seed: int) -> tuple[list[int], list[float]]:
    assert server.llm is not None
    body = {
        "prompt": prompt_ids,
        "n_predict": N_PREDICT,
        "temperature": 1.0,
        "n_probs": 1,
        "return_tokens": True,
        "cache_prompt": False,
        "seed": seed,
        "ignore_eos": True,
    }
    r = httpx.post(server.llm.server_url + "/completion", json=body, timeout=600)
    r.raise_for_status()
    p = r.json()
    tokens = [int(t) for t in p["tokens"]]
    logprobs = [float(e["logprob"]) for e in p["completion_probabilities"]]
    assert len(tokens) == len(logprobs) == N_PREDICT
    return tokens, logprobs


def _served_logprobs(server: PolicyServer, prompt_ids: list[int], completion: list[int]) -> list[float]:
    """llama.cpp's logprob of each token of a fixed completion (one forced step per token)."""
    assert server.llm is not None
    out = []
    for k, tid in enumerate(completion):
        body = {"prompt": prompt_ids + completion[:k], "n_predict": 1, "n_probs": 200, "temperature": 0.0}
        r = httpx.post(server.llm.server_url + "/completion", json=body, timeout=600)
        r.raise_for_status()
        top = r.json()["completion_probabilities"][0]["top_logprobs"]
        match = [e["logprob"] for e in top if int(e["id"]) == tid]
        assert match, f"token {tid} not among llama.cpp's top 200"
        out.append(float(match[0]))
    return out


def _hf_logprobs(model, prompt_ids: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        lp = sequence_logprobs(model, prompt_ids + completion, LogprobSemantics())
    return lp[len(prompt_ids) :].tolist()


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_two_steps_of_the_closed_loop_change_the_served_model_and_raise_rewarded_logprobs(tmp_path):
    from transformers import AutoTokenizer

    model, model_dir = load_causal_lm("embedded")
    prompt_ids = AutoTokenizer.from_pretrained(str(model_dir))(PROMPT)["input_ids"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    config = GRPOConfig(lr=3e-5)
    server = PolicyServer(tmp_path, port=0, threads=1, n_parallel=1)
    server.start()
    port = server.port
    try:
        fixed = None
        for step in (1, 2):
            samples = [_complete(server, prompt_ids, seed=100 * step + i) for i in range(4)]
            completions = [s[0] for s in samples]
            assert len({tuple(c) for c in completions}) > 1, "the group needs different samples"
            # The reward prefers the sample whose first token has the lowest id: arbitrary but fixed.
            best = min(range(4), key=lambda i: completions[i])
            scores = [1.0 if i == best else 0.0 for i in range(4)]
            fixed = fixed or completions[best]
            group = Group(
                [prompt_ids + c for c in completions],
                [[IGNORE] * len(prompt_ids) + c for c in completions],
                scores,
                [[1.0] * len(prompt_ids) + lps for _, lps in samples],
                LogprobSemantics(),
                None,
                f"step {step}",
            )
            served_before = _served_logprobs(server, prompt_ids, fixed)
            before = _hf_logprobs(model, prompt_ids, completions[best])
            stats = train_step(model, optimizer, [group], config, step)
            assert stats.tokens == 4 * N_PREDICT and stats.gaps == 0
            assert stats.mismatch < 0.02  # the served weights sampled this group
            after = _hf_logprobs(model, prompt_ids, completions[best])
            assert sum(after) > sum(before), (step, before, after)  # the rewarded sequence rises
            server.publish(model)
            assert server.port == port and server.published == step  # same address: the env never moves
            served_after = _served_logprobs(server, prompt_ids, fixed)
            # The served model changed, and it is the trained one (transformers on the same weights).
            assert max(abs(a - b) for a, b in zip(served_after, served_before)) > 0.01
            hf_fixed = _hf_logprobs(model, prompt_ids, fixed)
            assert max(abs(a - b) for a, b in zip(served_after, hf_fixed)) < 0.01, (served_after, hf_fixed)
    finally:
        server.stop()
