"""training.gguf_export: trained HF weights back into a float32 GGUF llama.cpp serves."""

from __future__ import annotations

import numpy as np
import pytest

from training.gguf_export import llama_permute


def test_llama_permute_is_undone_by_transformers_reverse_permutation():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rng = np.random.default_rng(0)
    for heads, kv_heads in ((9, 9), (9, 3)):
        q = rng.standard_normal((heads * 8, 16)).astype(np.float32)
        k = rng.standard_normal((kv_heads * 8, 16)).astype(np.float32)
        undo = LlamaTensorProcessor(config={"num_attention_heads": heads, "num_key_value_heads": kv_heads})
        assert not np.array_equal(llama_permute(q, heads), q)  # it does move rows
        assert np.array_equal(undo.process(llama_permute(q, heads), "blk.0.attn_q.weight").weights, q)
        assert np.array_equal(undo.process(llama_permute(k, kv_heads), "blk.0.attn_k.weight").weights, k)


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_dequantized_checkpoint_written_back_is_the_float_gguf_bit_for_bit(tmp_path):
    from gguf import GGUFReader

    from training.gguf_export import write_float_gguf
    from training.models import embedded_float_gguf, load_causal_lm

    model, _ = load_causal_lm("embedded")
    template = embedded_float_gguf()
    out = write_float_gguf(model.state_dict(), model.config, template, tmp_path / "policy.F32.gguf")
    want, got = GGUFReader(str(template)), GGUFReader(str(out))
    assert [t.name for t in got.tensors] == [t.name for t in want.tensors]
    for a, b in zip(want.tensors, got.tensors):
        assert np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name
    meta = {k: f.contents() for k, f in want.fields.items() if not k.startswith("GGUF.")}
    assert {k: f.contents() for k, f in got.fields.items() if not k.startswith("GGUF.")} == meta
