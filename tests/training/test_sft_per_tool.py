"""training.sft_per_tool: one TRL SFT step on a per-tool split of a real `exports sft` export."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from training.sft_per_tool import SFTPerToolConfig, registry_schemas, run, to_prompt_completion

from .tiny_models import embedded_tokenizer_dir, tiny_llama


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(2400)  # the first user of `trained_run` also runs the env and the trainer
def test_one_sft_step_on_the_python_split_of_a_process_export(trained_run, tmp_path):
    data = tmp_path / "sft_data"
    proc = subprocess.run(
        [sys.executable, "-m", "exports", "sft", str(trained_run.processed), str(data), "--val_fraction", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["python"]["train"] >= 2  # the grammar makes every turn a python call
    example = json.loads((data / "python" / "train.jsonl").read_text().splitlines()[0])
    pair = to_prompt_completion(example, registry_schemas())
    assert pair["completion"][0]["tool_calls"][0]["function"]["name"] == "python"
    # process groups do not record the tools offered: the python schema comes from the project's registry
    (schema,) = json.loads(pair["tools"])
    assert schema["function"]["name"] == "python" and schema["function"]["parameters"]["properties"]

    model_dir = tiny_llama(tmp_path / "tiny", seed=0, tokenizer_dir=embedded_tokenizer_dir())
    before = load_file(str(model_dir / "model.safetensors"))
    outputs = run(
        SFTPerToolConfig(
            data=data, model=str(model_dir), out=tmp_path / "runs" / "sft", max_steps=1, lr=1e-2, max_length=1024
        )
    )
    assert set(outputs) == {"python"}
    out = outputs["python"]
    assert out == tmp_path / "runs" / "sft" / "python"
    metrics = json.loads((out / "sft_metrics.json").read_text())
    assert math.isfinite(metrics["train_loss"]) and metrics["train_loss"] > 0
    after = load_file(str(out / "model.safetensors"))
    assert after.keys() == before.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(out)).chat_template  # the tool-aware template is saved beside it


def test_an_example_not_ending_in_a_tool_call_is_refused():
    with pytest.raises(ValueError, match="does not end with an assistant tool call"):
        to_prompt_completion(
            {"task_id": "t", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
        )
