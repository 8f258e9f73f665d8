"""Reasoning-vector merging: write base + alpha * (rl - sft) for each alpha, streaming.

    python -m training.merge_vectors --base B --rl R --sft S --alphas 0.25,0.5,1.0 --out DIR

B, R and S are HF checkpoints of one architecture (safetensors, one file or sharded). Output:
DIR/alpha_<a>/ per alpha, a loadable checkpoint (model.safetensors, the base's config and
tokenizer), and DIR/vector/model.safetensors, the vector rl - sft itself; DIR/merge.json says
what was merged.

Nothing holds a whole model: each output file's header is written first from the inputs'
shapes and dtypes, then every tensor is read, combined and written in slices of at most
`--chunk_elements` values (float32 arithmetic, stored in the base's dtype), so a 3B model
merges within a few hundred MB of RAM.
"""

from __future__ import annotations

import json
import shutil
import struct
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ConfigDict, Field, field_validator

from training.cli import parse_config, run_or_report
from training.models import copy_tokenizer

__all__ = ["MergeConfig", "CheckpointReader", "merge", "main"]

# safetensors dtype names and their sizes in bytes
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_FLOAT = {"F64", "F32", "F16", "BF16"}


class MergeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base: Path = Field(description="base checkpoint directory")
    rl: Path = Field(description="RL-trained checkpoint directory")
    sft: Path = Field(description="SFT checkpoint directory (the RL run's starting point)")
    alphas: list[float] = Field(description="comma-separated scales, e.g. 0.25,0.5,1.0")
    out: Path = Field(description="output directory")
    chunk_elements: int = Field(16 * 2**20, ge=1, description="values read per slice (bounds memory)")

    @field_validator("alphas", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return [x for x in v.split(",") if x.strip()] if isinstance(v, str) else v


class CheckpointReader:
    """Tensor names, shapes and dtypes of a safetensors checkpoint without loading it; slices on demand."""

    def __init__(self, directory: Path, stack: ExitStack) -> None:
        from safetensors import safe_open

        index = directory / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        elif (directory / "model.safetensors").is_file():
            files = ["model.safetensors"]
        else:
            raise FileNotFoundError(
                f"{directory} has no model.safetensors (nor an index): save it with "
                "save_pretrained(..., safe_serialization=True)"
            )
        self.directory = directory
        self.handles: dict[str, Any] = {}
        for name in files:
            handle = stack.enter_context(safe_open(str(directory / name), framework="pt"))
            for key in handle.keys():
                self.handles[key] = handle

    def names(self) -> list[str]:
        return sorted(self.handles)

    def spec(self, name: str) -> tuple[str, list[int]]:
        s = self.handles[name].get_slice(name)
        return s.get_dtype(), list(s.get_shape())

    def rows(self, name: str, start: int, stop: int) -> Any:
        """Rows [start, stop) along the first dimension (the whole tensor for a scalar)."""
        s = self.handles[name].get_slice(name)
        return s[start:stop] if s.get_shape() else self.handles[name].get_tensor(name)


class _StreamWriter:
    """A safetensors file written header first, then tensor bytes in order, slice by slice."""

    def __init__(self, path: Path, specs: dict[str, tuple[str, list[int]]]) -> None:
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, (dtype, shape) in specs.items():
            size = _DTYPE_BYTES[dtype] * _numel(shape)
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
        self.file: BinaryIO = path.open("wb")
        self.file.write(struct.pack("<Q", len(raw)) + raw)
        self.expected = 8 + len(raw) + offset

    def write(self, tensor: Any) -> None:
        import torch

        self.file.write(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())

    def close(self) -> None:
        written = self.file.tell()
        self.file.close()
        if written != self.expected:
            raise RuntimeError(f"{self.file.name}: wrote {written} bytes, the header announced {self.expected}")


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _torch_dtype(name: str) -> Any:
    import torch

    return {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[name]


def merge(config: MergeConfig) -> dict[str, Any]:
    if not config.alphas:
        raise ValueError("--alphas is empty: pass e.g. 0.25,0.5,1.0")
    config.out.mkdir(parents=True, exist_ok=True)
    targets = {a: config.out / f"alpha_{a:g}" for a in config.alphas}
    with ExitStack() as stack:
        base, rl, sft = (CheckpointReader(d, stack) for d in (config.base, config.rl, config.sft))
        specs = {name: base.spec(name) for name in base.names()}
        for other, label in ((rl, "rl"), (sft, "sft")):
            if other.names() != base.names():
                missing = sorted(set(base.names()) ^ set(other.names()))[:5]
                raise ValueError(
                    f"--{label} {other.directory} and --base hold different tensors (e.g. {missing}): "
                    "merging needs one architecture"
                )
            for name, (_, shape) in specs.items():
                if other.spec(name)[1] != shape:
                    raise ValueError(f"{name}: shape {other.spec(name)[1]} in --{label}, {shape} in --base")
        for d in [*targets.values(), config.out / "vector"]:
            d.mkdir(parents=True, exist_ok=True)
        writers = [_StreamWriter(d / "model.safetensors", specs) for d in targets.values()]
        vector = _StreamWriter(config.out / "vector" / "model.safetensors", specs)
        try:
            for name, (dtype, shape) in specs.items():
                _merge_tensor(name, dtype, shape, base, rl, sft, config, writers, vector)
        finally:
            for w in [*writers, vector]:
                w.close()
    for d in targets.values():
        for f in ("config.json", "generation_config.json"):
            if (config.base / f).is_file():
                shutil.copy2(config.base / f, d / f)
        copy_tokenizer(config.base, d)
    manifest = {
        "formula": "base + alpha * (rl - sft)",
        "base": str(config.base),
        "rl": str(config.rl),
        "sft": str(config.sft),
        "merged": {f"{a:g}": str(d) for a, d in targets.items()},
        "vector": str(config.out / "vector" / "model.safetensors"),
        "tensors": len(specs),
    }
    (config.out / "merge.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def _merge_tensor(
    name: str,
    dtype: str,
    shape: list[int],
    base: CheckpointReader,
    rl: CheckpointReader,
    sft: CheckpointReader,
    config: MergeConfig,
    writers: list[_StreamWriter],
    vector: _StreamWriter,
) -> None:
    rows = shape[0] if shape else 1
    per_row = max(1, _numel(shape[1:]) if shape else 1)
    step = max(1, config.chunk_elements // per_row)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        b = base.rows(name, start, stop)
        if dtype not in _FLOAT:  # integer buffers are not weights: the base's values pass through
            for w in writers:
                w.write(b)
            vector.write(b.new_zeros(b.shape))
            continue
        v = rl.rows(name, start, stop).float() - sft.rows(name, start, stop).float()
        vector.write(v.to(_torch_dtype(dtype)))
        for alpha, w in zip(config.alphas, writers):
            w.write((b.float() + alpha * v).to(_torch_dtype(dtype)))


def main(argv: list[str] | None = None) -> int:
    config = parse_config(MergeConfig, argv, "python -m training.merge_vectors")
    manifest = run_or_report("merge_vectors", lambda: merge(config))
    if manifest is None:
        return 1
    for alpha, path in manifest["merged"].items():
        print(f"[merge] alpha {alpha}: {path}")
    print(f"[merge] vector: {manifest['vector']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
