"""SWE-smith instances: the published row shape, where rows come from (the bundled offline set, a JSONL/JSON
file, a saved dataset, the hub), which rows are usable, and each repository's test command (SWE-smith's
profiles)."""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
import re
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from environments.hermes_base_env import HermesEnvError
from environments.jsonl import jsonl_lines
from environments.saved_datasets import saved_rows
from environments.swe_smith.mirror import BUG_COMMIT, REMOVE_TESTS_COMMIT, build_mirror
from environments.verifier import runs_pytest

__all__ = [
    "DEFAULT_TEST_CMD",
    "IMAGE_ENV_PREFIX",
    "OFFLINE_DATA",
    "SweSmithInstance",
    "build_test_command",
    "check_dataset",
    "default_cache",
    "load_instances",
    "load_offline_instances",
    "profile_for",
    "read_rows",
]

OFFLINE_DATA = Path(__file__).parents[1] / "data" / "swe_smith"
PROFILES = OFFLINE_DATA / "profiles.json"
HUB_DATASET = "SWE-bench/SWE-smith"
DEFAULT_TEST_CMD = "pytest --disable-warnings --color=no --tb=no --verbose"  # SWE-smith's PythonProfile
# The published Python test commands start by activating the image's conda env; on our base there is none.
IMAGE_ENV_PREFIX = re.compile(r"^\s*source /opt/miniconda3/bin/activate;\s*conda activate \w+;\s*")


class SweSmithInstance(BaseModel):
    model_config = ConfigDict(extra="ignore")

    instance_id: str
    repo: str = Field(..., description="The mirror, swesmith/<owner>__<name>.<sha8>")
    patch: str = Field(..., description="The diff that introduced the bug (already committed at base_commit)")
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    problem_statement: str = ""
    base_commit: str | None = Field(
        None, description="The head of the branch named instance_id (used when the mirror has no such branch)"
    )
    image_name: str | None = Field(None, description="The instance's Docker image (its repository's environment)")
    repo_url: str | None = Field(None, description="git URL or local path overriding the mirror")

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value  # the hub stores them as JSON text

    @property
    def repo_name(self) -> str:
        return self.repo.split("/")[-1]

    @property
    def name(self) -> str:
        """The upstream project's name: the workspace directory the agent works in."""
        m = re.match(r"^(?:.+?__)?(.+?)(?:\.[0-9a-f]{7,8})?$", self.repo_name)
        return re.sub(r"[^A-Za-z0-9_.-]", "_", m.group(1) if m else self.repo_name)[:60].lstrip(".") or "repo"

    def source(self, mirror_base: str) -> str:
        if self.repo_url:
            return self.repo_url
        if "://" in mirror_base or mirror_base.startswith("git@"):
            return f"{mirror_base.rstrip('/')}/{self.repo}.git"
        base = Path(mirror_base)
        return str(
            next((p for p in (base / f"{self.repo}.git", base / self.repo) if p.exists()), base / f"{self.repo}.git")
        )

    @property
    def test_files(self) -> list[str]:
        return sorted({t.split("::")[0] for t in self.FAIL_TO_PASS + self.PASS_TO_PASS})


# -- datasets ---------------------------------------------------------------------------------------


def load_offline_instances(
    data_dir: Path = OFFLINE_DATA, cache_dir: Path | None = None
) -> tuple[Path, list[SweSmithInstance]]:
    """The bundled bugs as a local mirror of the published shape: (mirror_base, instances)."""
    lines = (data_dir / "instances.jsonl").read_text()
    # The branch layout is part of the key: a mirror cached by an older build is never reused.
    key = hashlib.sha1(f"{BUG_COMMIT} -> {REMOVE_TESTS_COMMIT}\n".encode() + lines.encode())
    for p in sorted((data_dir / "repos").rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            key.update(str(p.relative_to(data_dir)).encode() + b"\0" + p.read_bytes())
    out = (cache_dir or default_cache()) / f"offline-{key.hexdigest()[:12]}"
    done = out / "instances.jsonl"
    if not done.exists():
        bugs = []
        for _, line in jsonl_lines(lines):
            row = json.loads(line)
            name = row["repo_url"].rstrip("/").split("/")[-1]
            bugs.append(
                {k: v for k, v in row.items() if k not in ("repo_url", "base_commit", "instance_id", "repo")}
                | {"name": name, "bug_id": row["instance_id"].rsplit(".", 1)[-1]}
            )
        repos = {b["name"]: data_dir / "repos" / b["name"] for b in bugs}
        staging = out.with_name(out.name + f".tmp{os.getpid()}")
        rows = build_mirror(repos, bugs, staging)
        (staging / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        try:
            staging.rename(out)
        except OSError:  # another process built it first
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    return out, [SweSmithInstance.model_validate_json(line) for _, line in jsonl_lines(done.read_text())]


def default_cache() -> Path:
    path = Path(tempfile.gettempdir()) / "hermes-rl-swe-smith"
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_rows(dataset: str, split: str) -> list[dict[str, Any]]:
    """Rows from a JSONL/JSON file, a `datasets` save_to_disk directory, or a hub dataset name."""
    path = Path(dataset)
    if path.is_file():
        text = path.read_text()
        if path.suffix == ".json" or text.lstrip().startswith("["):
            return list(json.loads(text))
        return [json.loads(line) for _, line in jsonl_lines(text)]
    if path.is_dir():
        return saved_rows(path, split, HermesEnvError)
    check_dataset(dataset)
    from datasets import load_dataset

    return list(load_dataset(dataset, split=split))


def check_dataset(dataset: str) -> None:
    """Refuse, in one line, a --env.dataset that is no known source (before anything starts)."""
    if dataset == "offline" or Path(dataset).exists():
        return
    if re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", dataset) and not dataset.endswith((".jsonl", ".json")):
        return  # a hub dataset name
    raise HermesEnvError(
        f"--env.dataset {dataset!r} is neither 'offline', an existing JSONL/JSON file or saved dataset directory, "
        "nor a hub dataset name (owner/name)"
    )


def load_instances(
    rows: list[dict[str, Any]],
    *,
    run_images: bool,
    mirror_base: str,
    profiles: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[list[SweSmithInstance], collections.Counter]:
    """Usable instances and the counted reasons for every row left out."""
    skipped: collections.Counter = collections.Counter()
    out: list[SweSmithInstance] = []
    seen: set[str] = set()
    for row in rows:
        try:
            inst = SweSmithInstance.model_validate(row)
        except ValidationError as exc:
            skipped[f"invalid row ({', '.join(str(e['loc'][0]) for e in exc.errors()[:3])})"] += 1
            continue
        profile = profile_for(inst.repo, profiles)
        if not inst.problem_statement.strip():
            skipped["empty problem_statement"] += 1
        elif not inst.FAIL_TO_PASS:
            skipped["no FAIL_TO_PASS tests"] += 1
        elif inst.instance_id in seen:
            skipped["duplicate instance_id"] += 1
        elif profile.get("language", "python") != "python" and not run_images:
            skipped[f"{profile['language']} repository: needs its image, the base environment runs Python"] += 1
        elif inst.image_name and not run_images:
            skipped[
                "needs its image (image_name); this backend runs only its base environment (--env.image_policy base)"
            ] += 1
        elif not inst.repo_url and "://" not in mirror_base and not Path(inst.source(mirror_base)).exists():
            skipped[f"no mirror under {mirror_base}"] += 1
        else:
            seen.add(inst.instance_id)
            out.append(inst)
    return out, skipped


# -- test commands: SWE-smith's repository profiles ------------------------------------------------


def profile_for(repo: str, extra: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The profile of a mirror (swesmith/<owner>__<name>.<sha8>): test_cmd, language; {} if unknown."""
    if extra and repo in extra:
        return dict(extra[repo])
    return dict(_published_profiles().get(repo, {}))


@functools.cache
def _published_profiles() -> Mapping[str, Mapping[str, Any]]:
    """SWE-smith's profiles, read once (an immutable view)."""
    return MappingProxyType(json.loads(PROFILES.read_text())["profiles"] if PROFILES.exists() else {})


def build_test_command(inst: SweSmithInstance, profile: Mapping[str, Any], *, python: str, on_image: bool) -> str:
    """The profile's test command (pytest if none), on the base environment with `python` (shell words).

    Like SWE-smith's harness, a pytest command gets the instance's test files appended; unlike it,
    those of PASS_TO_PASS too, since a test missing from the output counts as failed here.
    """
    command = profile.get("test_cmd") or DEFAULT_TEST_CMD
    pytest = runs_pytest(command)  # decided before `python` (a path that may contain "pytest") goes in
    if not on_image:
        command = IMAGE_ENV_PREFIX.sub("", command)
        command = re.sub(
            r"(^|[;&|]\s*)(pytest|python3?)(?=\s|$)",
            lambda m: m.group(1) + (f"{python} -m pytest" if m.group(2) == "pytest" else python),
            command,
        )
    if pytest:
        command += " -p no:cacheprovider " + " ".join(shlex.quote(f) for f in inst.test_files)
    return command
