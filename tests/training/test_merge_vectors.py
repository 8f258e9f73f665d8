"""training.merge_vectors on tiny random checkpoints, checked tensor by tensor against the formula."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from training.merge_vectors import MergeConfig, merge

from .tiny_models import embedded_tokenizer_dir, tiny_llama

ALPHAS = [0.25, 0.5, 1.0]


@pytest.fixture
def checkpoints(tmp_path):
    tok = embedded_tokenizer_dir()
    return {
        name: tiny_llama(tmp_path / name, seed, tokenizer_dir=tok)
        for name, seed in (("base", 0), ("rl", 1), ("sft", 2))
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_merged_tensor_is_base_plus_alpha_times_rl_minus_sft(tmp_path, dtype):
    tok = embedded_tokenizer_dir()
    ck = {name: tiny_llama(tmp_path / name, seed, dtype, tok) for name, seed in (("base", 0), ("rl", 1), ("sft", 2))}
    # A small slice size: the embedding (49152 x 32) is read and written in many pieces.
    manifest = merge(
        MergeConfig(
            base=ck["base"], rl=ck["rl"], sft=ck["sft"], alphas=ALPHAS, out=tmp_path / "out", chunk_elements=10_000
        )
    )
    base, rl, sft = (load_file(str(ck[n] / "model.safetensors")) for n in ("base", "rl", "sft"))
    vector = load_file(str(tmp_path / "out" / "vector" / "model.safetensors"))
    assert manifest["tensors"] == len(base) == len(vector)
    for alpha in ALPHAS:
        merged = load_file(str(tmp_path / "out" / f"alpha_{alpha:g}" / "model.safetensors"))
        assert merged.keys() == base.keys()
        for name, b in base.items():
            expected = (b.float() + alpha * (rl[name].float() - sft[name].float())).to(dtype)
            assert merged[name].dtype == dtype and merged[name].shape == b.shape
            assert torch.equal(merged[name], expected), name
            assert not torch.equal(merged[name], b), name
    for name in base:
        assert torch.equal(vector[name], (rl[name].float() - sft[name].float()).to(dtype)), name


def test_merged_checkpoint_loads_with_its_config_and_tokenizer(tmp_path, checkpoints):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.merge_vectors",
            "--base",
            str(checkpoints["base"]),
            "--rl",
            str(checkpoints["rl"]),
            "--sft",
            str(checkpoints["sft"]),
            "--alphas",
            "0.5",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    merged_dir = out / "alpha_0.5"
    model = AutoModelForCausalLM.from_pretrained(str(merged_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(merged_dir))
    base = load_file(str(checkpoints["base"] / "model.safetensors"))
    rl = load_file(str(checkpoints["rl"] / "model.safetensors"))
    sft = load_file(str(checkpoints["sft"] / "model.safetensors"))
    state = model.state_dict()
    for name, b in base.items():
        assert torch.equal(state[name], b + 0.5 * (rl[name] - sft[name])), name
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert model(input_ids=torch.tensor([ids])).logits.shape[-1] == 49152
    assert json.loads((out / "merge.json").read_text())["merged"] == {"0.5": str(merged_dir)}
    with safe_open(str(merged_dir / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_checkpoints_of_different_architectures_are_refused(tmp_path, checkpoints):
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=49152,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
        )
    )
    other.save_pretrained(str(tmp_path / "deeper"))
    with pytest.raises(ValueError, match="one architecture"):
        merge(
            MergeConfig(
                base=checkpoints["base"],
                rl=tmp_path / "deeper",
                sft=checkpoints["sft"],
                alphas="1.0",
                out=tmp_path / "out",
            )
        )
