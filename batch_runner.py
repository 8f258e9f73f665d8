"""Run the agent over a prompt file, for SFT (or token-level) data at scale.

    python batch_runner.py --dataset_file prompts.jsonl --run_name NAME       # the embedded model
    python batch_runner.py --dataset_file prompts.jsonl --run_name NAME \
        --model M --base_url http://127.0.0.1:8000/v1 [--concurrency 8] [--distribution default]
    python batch_runner.py ... --token_server auto       # token mode: exact ids, masks, logprobs
    python batch_runner.py ... --run_name NAME --resume          # continue a killed run
    python batch_runner.py ... --agent codeact --tool_backend sandbox   # smolagents' CodeAgent (code actions)

It is a loop over the same composition root as the envs (environments/runtime.py): same
model clients, tool backends, registry, retries and agent-loop defaults.

Each line of the dataset is `{"prompt": "...", "id": "...", "toolsets": [...]}` (`id` and
`toolsets` optional; without an id a prompt is known by its line number). Toolsets per
prompt are sampled from a named distribution, seeded by the run seed and the prompt id,
so a resumed run offers a prompt the same tools. Tools run in a sandbox slot per prompt, or
(`--tool_backend local --unconfined_tools`) unconfined in a fresh local workspace.

Output, in runs/NAME/: `trajectories.jsonl` (one line per prompt, written as it finishes),
`stats.json` (per-tool call counts and error rates, turns, tokens, wall time),
`run_config.json`, and `infra_failures.jsonl` (prompts whose model server or workspace
failed on every attempt; they are not in the output, so `--resume` runs them again).

Exactly once: a line is appended with a single write() and ends in a newline; `--resume`
cuts a torn last line (a kill in the middle of a write), skips every prompt already in
the output and runs the rest.
"""

from environments.batch.cli import main, parse_args
from environments.batch.config import DISTRIBUTIONS, BatchConfig, BatchError, load_prompts, sample_toolsets
from environments.batch.run import run_batch

__all__ = [
    "BatchConfig",
    "BatchError",
    "DISTRIBUTIONS",
    "sample_toolsets",
    "load_prompts",
    "run_batch",
    "main",
    "parse_args",
]

if __name__ == "__main__":
    raise SystemExit(main())
