"""Trained HF weights back into a float32 GGUF that llama.cpp serves (the inverse of the dequantization).

The GGUF it writes copies every metadata field of a template GGUF (the embedded model's:
tokenizer, chat template, hyperparameters) and holds exactly the template's tensors, each taken
from the HF state dict under the name `gguf.get_tensor_name_map` gives it. llama.cpp's converter
permutes the rows of the query and key projections (rotary pairs interleaved per head) and
transformers undoes that when it loads a GGUF; here it is applied again, so that loading the
written file with transformers gives back the same tensors bit for bit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import numpy as np

__all__ = ["llama_permute", "write_float_gguf", "write_float32_like"]


def llama_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """HF row order -> GGUF row order of a llama q/k projection (convert_hf_to_gguf's `permute`)."""
    dim = weights.shape[0] // n_head // 2
    return weights.reshape(n_head, 2, dim, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def write_float_gguf(state: dict[str, Any], config: Any, template: Path, out: Path) -> Path:
    """Write `state` (HF names, torch tensors) as a float32 GGUF at `out`, atomically (tmp + rename).

    `config` is the model's HF config (heads for the q/k permutation); `template` the GGUF whose
    metadata and tensor list the new file takes.
    """
    import numpy as np
    from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, GGUFReader, get_tensor_name_map

    reader = GGUFReader(str(template))
    arch_name = reader.fields["general.architecture"].contents()
    if arch_name != "llama":
        raise ValueError(f"{template}: writing trained weights is implemented for llama GGUFs, not {arch_name!r}")
    arch = next(a for a, n in MODEL_ARCH_NAMES.items() if n == arch_name)
    assert arch == MODEL_ARCH.LLAMA
    name_map = get_tensor_name_map(arch, config.num_hidden_layers)
    by_gguf: dict[str, str] = {}
    for hf_name in state:
        gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is not None:
            by_gguf[gguf_name] = hf_name
    missing = [t.name for t in reader.tensors if t.name not in by_gguf]
    if missing:
        raise ValueError(f"no trained weight for GGUF tensors {missing[:5]} (of {len(missing)})")

    def tensor(t: Any) -> np.ndarray:
        data = state[by_gguf[t.name]].detach().to("cpu").float().numpy()
        if ".attn_q." in t.name:
            data = llama_permute(data, config.num_attention_heads)
        elif ".attn_k." in t.name:
            data = llama_permute(data, config.num_key_value_heads)
        expected = tuple(int(n) for n in reversed(t.shape))
        if data.shape != expected:
            raise ValueError(f"{t.name}: trained shape {data.shape}, GGUF expects {expected}")
        return np.ascontiguousarray(data, dtype=np.float32)

    return write_float32_like(reader, out, tensor)


def write_float32_like(reader: Any, out: Path, tensor: Callable[[Any], np.ndarray]) -> Path:
    """A float32 GGUF at `out`, atomically (tmp + rename), with the metadata and tensor list of the GGUF
    `reader` holds; each tensor's data is `tensor(t)` (float32, in GGUF's dimension order)."""
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    writer = GGUFWriter(str(tmp), arch=reader.fields["general.architecture"].contents())
    try:
        for name, f in reader.fields.items():
            if name.startswith("GGUF.") or name == "general.architecture":
                continue  # the writer adds these itself
            if name == "general.file_type":
                writer.add_uint32(name, 0)  # LLAMA_FTYPE_ALL_F32
                continue
            sub_type = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(name, f.contents(), f.types[0], sub_type=sub_type)
        for t in reader.tensors:
            writer.add_tensor(t.name, tensor(t), raw_dtype=GGMLQuantizationType.F32)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
