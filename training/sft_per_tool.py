"""TRL SFT on the per-tool splits that `exports sft` writes, one model per tool.

    python -m exports sft out/gsm8k_agent.jsonl sft_data/
    python -m training.sft_per_tool --data sft_data --tool python --model HF_DIR   # -> runs/sft/python/
    python -m training.sft_per_tool --data sft_data --model HF_DIR                 # every tool in manifest.json

An example of tool T is a conversation up to an assistant turn that calls T, with the tools that
were offered. It becomes a conversational prompt/completion pair: the prompt is every message
before that turn, the completion is the turn itself, so the loss covers only the tool call.
The tool schemas travel as the `tools` column and are rendered by the model's own chat
template, as at inference (an export without them, e.g. from `process` output, gets the
project's schemas of the tools it calls). `--model embedded` starts from the embedded GGUF, dequantized.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from environments.jsonl import jsonl_lines
from training.cli import parse_config, run_or_report

__all__ = ["SFTPerToolConfig", "registry_schemas", "to_prompt_completion", "load_split", "train_tool", "run", "main"]


class SFTPerToolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: Path = Field(description="directory written by `exports sft` (manifest.json, <tool>/train.jsonl)")
    model: str = Field("embedded", description="'embedded' or an HF causal LM checkpoint directory")
    tool: str | None = Field(None, description="train this tool only (default: every tool in manifest.json)")
    out: Path = Field(Path("runs/sft"), description="each tool's model is saved under OUT/<tool>/")
    epochs: float = Field(1.0, gt=0)
    max_steps: int = Field(-1, description="stop after this many optimizer steps (-1: run the epochs)")
    lr: float = Field(1e-5, gt=0)
    batch_size: int = Field(1, ge=1, description="examples per device step")
    max_length: int = Field(2048, ge=16, description="tokens per example (longer ones are cut)")
    seed: int = 0


def registry_schemas() -> dict[str, dict[str, Any]]:
    """The project's tool schemas by name (model_tools' default registry)."""
    from model_tools import get_tool_definitions

    return {d["function"]["name"]: d for d in get_tool_definitions()}


def to_prompt_completion(example: dict[str, Any], known: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """One `exports sft` example as TRL's conversational prompt/completion, tools as JSON text.

    An env's `process` groups do not record the tools offered, so their exports carry none:
    then the schemas of the tools the conversation calls are taken from `known` (by name)."""
    messages = example["messages"]
    if not messages or messages[-1].get("role") != "assistant" or not messages[-1].get("tool_calls"):
        raise ValueError(
            f"example {example.get('task_id')!r} does not end with an assistant tool call: "
            "is this an `exports sft` split?"
        )
    tools = example.get("tools") or []
    if not tools and known:
        called = dict.fromkeys(c["function"]["name"] for m in messages for c in m.get("tool_calls") or [])
        tools = [known[name] for name in called if name in known]
    # Arrow stores one schema per column: keep OpenAI keys only, arguments as JSON text.
    clean = [{k: m.get(k) for k in ("role", "content", "tool_calls", "tool_call_id", "name")} for m in messages]
    return {"prompt": clean[:-1], "completion": clean[-1:], "tools": json.dumps(tools)}


def load_split(path: Path, known: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    return [to_prompt_completion(json.loads(line), known) for _, line in jsonl_lines(text)]


def train_tool(config: SFTPerToolConfig, tool: str) -> Path:
    """Train on DATA/<tool>/train.jsonl (evaluating on val.jsonl when it has rows); returns the output dir."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from training.models import copy_tokenizer, load_causal_lm

    known = registry_schemas()
    train_rows = load_split(config.data / tool / "train.jsonl", known)
    if not train_rows:
        raise ValueError(
            f"{config.data / tool / 'train.jsonl'} has no examples; tools with data: "
            f"{sorted(p.parent.name for p in config.data.glob('*/train.jsonl'))}"
        )
    val_rows = load_split(config.data / tool / "val.jsonl", known)
    model, model_dir = load_causal_lm(config.model)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    out = config.out / tool
    args = SFTConfig(
        output_dir=str(out),
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        learning_rate=config.lr,
        per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.batch_size,
        max_length=config.max_length,
        eval_strategy="epoch" if val_rows else "no",
        save_strategy="no",  # the final model is saved below, once
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=config.seed,
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(train_rows),
        eval_dataset=Dataset.from_list(val_rows) if val_rows else None,
        processing_class=tokenizer,
    )
    result = trainer.train()
    trainer.save_model(str(out))
    copy_tokenizer(model_dir, out)
    (out / "sft_metrics.json").write_text(
        json.dumps(
            {"tool": tool, "train_examples": len(train_rows), "val_examples": len(val_rows), **result.metrics}, indent=2
        )
    )
    return out


def tools_in(data: Path) -> list[str]:
    manifest = data / "manifest.json"
    if not manifest.is_file():
        raise ValueError(f"{data} has no manifest.json: pass the directory `exports sft` wrote")
    return [tool for tool, counts in json.loads(manifest.read_text()).items() if counts.get("train")]


def run(config: SFTPerToolConfig) -> dict[str, Path]:
    tools = [config.tool] if config.tool else tools_in(config.data)
    return {tool: train_tool(config, tool) for tool in tools}


def main(argv: list[str] | None = None) -> int:
    config = parse_config(SFTPerToolConfig, argv, "python -m training.sft_per_tool")
    outputs = run_or_report("sft_per_tool", lambda: run(config))
    if outputs is None:
        return 1
    for tool, path in outputs.items():
        print(f"[sft] {tool}: saved to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
