"""Trainer-side tools fed by hermes-rl's data (the `train` extra: torch, transformers, trl, safetensors).

- `python -m training.check_logprobs`: recompute inference logprobs with transformers and compare.
- `python -m training.grpo`: a small reference GRPO trainer pulling batches from Atropos run-api.
- `python -m training.sft_per_tool`: TRL SFT on the per-tool splits of `exports sft`.
- `python -m training.merge_vectors`: base + alpha * (rl - sft), streamed tensor by tensor.

Nothing in the env side imports this package.
"""
