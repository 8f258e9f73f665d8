"""Per-token log-probabilities of a causal LM, in the distribution a group's logprobs describe.

`token_logprobs(logits, tokens)[t]` is log p(tokens[t] | tokens[:t]), read from the logits at
position t-1; position 0 has no context and is 0. With `raw_logits` semantics that is the
log-softmax of the raw logits. With `sampling_policy` it follows llama.cpp's sampler chain:
top-k, top-p and min-p cut the temperature-1 distribution, then the temperature rescales what
is left (llama.cpp applies temperature last; grammar constraints cannot be reproduced here).
"""

from __future__ import annotations

import torch

from training.groups import LogprobSemantics

__all__ = ["token_logprobs", "sequence_logprobs"]


def _truncate(logp: torch.Tensor, semantics: LogprobSemantics) -> torch.Tensor:
    """-inf where llama.cpp's top-k / top-p / min-p would drop a token (rows: positions)."""
    keep = torch.ones_like(logp, dtype=torch.bool)
    if semantics.top_k > 0:
        kth = logp.topk(min(semantics.top_k, logp.shape[-1]), dim=-1).values[..., -1:]
        keep &= logp >= kth
    if semantics.top_p < 1.0:
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # mass strictly before each token
        keep_sorted = before < semantics.top_p
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    if semantics.min_p > 0.0:
        keep &= logp >= logp.max(dim=-1, keepdim=True).values + torch.log(torch.tensor(semantics.min_p))
    return logp.masked_fill(~keep, float("-inf"))


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, semantics: LogprobSemantics) -> torch.Tensor:
    """logits [T, V] of one sequence, tokens [T] -> [T] logprobs of each token given its prefix."""
    pred = logits[:-1].float()
    if semantics.kind == "sampling_policy":
        with torch.no_grad():
            cut = _truncate(torch.log_softmax(pred, -1), semantics)
        pred = (pred / semantics.temperature).masked_fill(cut == float("-inf"), float("-inf"))
    logp = torch.log_softmax(pred, -1).gather(-1, tokens[1:, None]).squeeze(-1)
    return torch.cat([logp.new_zeros(1), logp])


def sequence_logprobs(model: torch.nn.Module, tokens: list[int], semantics: LogprobSemantics) -> torch.Tensor:
    """One forward pass of `model` over `tokens`; gradients flow unless the caller disables them."""
    ids = torch.tensor(tokens, dtype=torch.long)
    logits = model(input_ids=ids[None]).logits[0]
    return token_logprobs(logits, ids, semantics)
