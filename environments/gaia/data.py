"""GAIA tasks: the bundled offline set (generated here, byte for byte) and the gated real set.

    python -m environments.gaia.data build-offline            # rewrite environments/data/gaia/offline
    python -m environments.gaia.data download --dest data/GAIA [--split validation]

This module reads the real set in either published layout and fetches it; the offline set's data and
its deterministic file writers are in environments/gaia/offline.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from environments.gaia.offline import OFFLINE_DIR, write_offline_dataset
from environments.jsonl import jsonl_rows

__all__ = [
    "GaiaAccessError",
    "load_tasks",
    "split_dir",
    "download_gaia",
    "GAIA_SPLITS",
]

GAIA_REPO = "gaia-benchmark/GAIA"


class GaiaAccessError(RuntimeError):
    """The gated GAIA dataset could not be fetched (not logged in / access not granted / offline)."""


GAIA_SPLITS = ("validation", "test")
GAIA_YEAR = "2023"
_METADATA = ("metadata.parquet", "metadata.jsonl")  # the 2025 layout first, then the original one


def split_dir(data_dir: Path, split: str = "validation") -> Path:
    """The directory holding a split's metadata: `data_dir` itself, or `data_dir/2023/<split>` of a snapshot."""
    if split not in GAIA_SPLITS:
        raise ValueError(f"GAIA split must be one of {GAIA_SPLITS}, got {split!r}")
    for candidate in (data_dir, data_dir / GAIA_YEAR / split, data_dir / split):
        if any((candidate / name).is_file() for name in _METADATA):
            return candidate
    raise FileNotFoundError(
        f"no metadata.parquet or metadata.jsonl in {str(data_dir)!r} (nor in its {GAIA_YEAR}/{split}); run "
        "`python -m environments.gaia.data download --dest DIR` for the real GAIA set, or use the bundled offline set"
    )


def _read_metadata(directory: Path) -> list[dict[str, Any]]:
    parquet = directory / "metadata.parquet"
    if parquet.is_file():
        import pyarrow.parquet as pq  # noqa: PLC0415 - only the 2025 layout needs it

        return pq.read_table(parquet).to_pylist()
    return jsonl_rows((directory / "metadata.jsonl").read_text(encoding="utf-8"), directory / "metadata.jsonl")


def _attachment(directory: Path, task: dict[str, Any]) -> Path:
    """Where a task's attachment lies. Both layouts keep it beside the metadata; the 2025 `file_path`
    is relative to the repository root (`2023/validation/<name>`), so its directory part must be the
    tail of `directory` and only the last part is joined (never the prefix twice, never outside)."""
    name = task["file_name"]
    if Path(name).name != name or name in (".", ".."):
        raise ValueError(f"task {task['task_id']}: file_name {name!r} must be a plain file name")
    rel = Path(task.get("file_path") or name)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"task {task['task_id']}: file_path {str(rel)!r} must be relative and stay inside the dataset")
    prefix = rel.parts[:-1]
    if prefix and directory.resolve().parts[-len(prefix) :] != prefix:
        raise ValueError(f"task {task['task_id']}: file_path {str(rel)!r} does not lie in {str(directory)!r}")
    return directory / rel.name


def load_tasks(data_dir: Path, split: str = "validation") -> list[dict[str, Any]]:
    """Tasks of a GAIA split in either published layout, `file_path` made absolute ("" without attachment).

    2023 layout: `metadata.jsonl` with `file_name`, attachments beside it. 2025 layout:
    `metadata.parquet` with the same columns plus `file_path` relative to the repository root.
    `data_dir` is the split directory or the snapshot root (then `2023/<split>` is used).
    """
    directory = split_dir(Path(data_dir), split)
    tasks = []
    for row in _read_metadata(directory):
        missing = [k for k in ("task_id", "Question", "Level", "Final answer") if k not in row]
        if missing:
            raise ValueError(f"{directory}: a task lacks {missing}; is this a GAIA metadata file?")
        task = dict(row)
        task["Level"] = int(task["Level"])  # a string in some exports
        task["file_name"] = task.get("file_name") or ""
        task["file_path"] = ""
        if task["file_name"]:
            path = _attachment(directory, row | {"file_name": task["file_name"]})
            if not path.is_file():
                raise FileNotFoundError(f"task {task['task_id']}: attachment {str(path)!r} is missing")
            task["file_path"] = str(path)
        tasks.append(task)
    return tasks


def download_gaia(dest: Path, split: str = "validation", year: str = GAIA_YEAR) -> Path:
    """Fetch the gated GAIA split with the user's Hugging Face login; return its directory."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        root = snapshot_download(
            repo_id=GAIA_REPO, repo_type="dataset", local_dir=str(dest), allow_patterns=[f"{year}/{split}/*"]
        )
    except GatedRepoError as exc:
        raise GaiaAccessError(
            f"{GAIA_REPO} is gated and this account has no access: accept the terms at "
            f"https://huggingface.co/datasets/{GAIA_REPO} and run `huggingface-cli login` (or `hf auth login`)"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise GaiaAccessError(
            f"{GAIA_REPO} was not found or you are not logged in: run `huggingface-cli login` with a token "
            f"of an account that accepted the terms at https://huggingface.co/datasets/{GAIA_REPO}"
        ) from exc
    except LocalEntryNotFoundError as exc:
        raise GaiaAccessError(f"cannot reach the Hugging Face Hub to fetch {GAIA_REPO} (offline?): {exc}") from exc
    except HfHubHTTPError as exc:
        raise GaiaAccessError(
            f"the Hub refused {GAIA_REPO} ({exc}); check `huggingface-cli whoami` and your access"
        ) from exc
    directory = Path(root) / year / split
    if not any((directory / name).is_file() for name in _METADATA):
        raise GaiaAccessError(
            f"downloaded {GAIA_REPO} but {directory} has no metadata.parquet or metadata.jsonl; "
            "the repo layout may have changed"
        )
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m environments.gaia.data", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build-offline", help="write the bundled offline task set")
    build.add_argument("--dest", type=Path, default=OFFLINE_DIR)
    dl = sub.add_parser("download", help="download the gated GAIA dataset (needs `huggingface-cli login`)")
    dl.add_argument("--dest", type=Path, required=True)
    dl.add_argument("--split", choices=GAIA_SPLITS, default="validation")
    args = parser.parse_args(argv)
    if args.command == "build-offline":
        print(f"wrote {write_offline_dataset(args.dest)}")
        return 0
    try:
        path = download_gaia(args.dest, args.split)
    except GaiaAccessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"GAIA {args.split} is in {path}; run the env with --env.data_dir {args.dest} --env.split {args.split}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
