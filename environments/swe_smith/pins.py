"""A repository's own test and development pins, as pip arguments (`repo_pins`).

SWE-smith's images hold what the repository's tests need: its profile's install (often only `pip install -e .`)
plus what its installer added to make the test suite run, which is what the repository's own development
files name (e.g. charset_normalizer's dev-requirements.txt pins pytest-cov 4.1.0, which its pytest addopts
need, and pytest <= 8.3.4). Read from a checkout of the original project:

- requirement files for development or tests (`dev-requirements.txt`, `requirements-test.txt`, ...);
- pyproject.toml's `[project.optional-dependencies]` and setup.cfg's `[options.extras_require]` named
  test/tests/testing/dev (installed as `-e .[names]`), and `[dependency-groups]` of those names (PEP 735,
  expanded here: the venv's pip predates `--group`);
- tox.ini's `[testenv] deps` lines without a factor condition or substitution.
"""

from __future__ import annotations

import configparser
import re
import tomllib
from pathlib import Path

__all__ = ["repo_pins"]

NAMES = ("test", "tests", "testing", "dev")
REQUIREMENT_FILES = (
    "dev-requirements.txt",
    "requirements-dev.txt",
    "requirements_dev.txt",
    "test-requirements.txt",
    "tests-requirements.txt",
    "requirements-test.txt",
    "requirements_test.txt",
    "requirements-tests.txt",
    "requirements_tests.txt",
    "requirements/dev.txt",
    "requirements/test.txt",
    "requirements/tests.txt",
    "tests/requirements.txt",
)
_FACTOR = re.compile(r"^[\w.,!-]+\s*:\s")  # tox: "py38,py39: pkg" applies to some environments only


def repo_pins(checkout: Path) -> list[str]:
    """pip install arguments for the repository's own test/development pins (empty: it names none)."""
    args: list[str] = []
    for name in REQUIREMENT_FILES:
        if (checkout / name).is_file():
            args += ["-r", name]
    pyproject = _toml(checkout / "pyproject.toml")
    extras = set(pyproject.get("project", {}).get("optional-dependencies", {})) & set(NAMES)
    extras |= set(_ini(checkout / "setup.cfg", "options.extras_require")) & set(NAMES)
    if extras:
        args += ["-e", f".[{','.join(sorted(extras))}]"]
    groups = pyproject.get("dependency-groups", {})
    for name in NAMES:
        if name in groups:
            args += _group(groups, name, set())
    deps = _ini(checkout / "tox.ini", "testenv").get("deps", "")
    for line in (x.strip() for x in deps.splitlines()):
        if not line or line.startswith("#") or "{" in line or _FACTOR.match(line):
            continue
        if line.startswith("-r"):
            args += ["-r", line[2:].strip()]
        elif not line.startswith("-"):
            args.append(line)
    return args


def _group(groups: dict, name: str, seen: set[str]) -> list[str]:
    """A PEP 735 group's requirements, its `{include-group = ...}` entries expanded."""
    if name in seen:
        return []
    seen.add(name)
    out: list[str] = []
    for entry in groups.get(name, []):
        if isinstance(entry, str):
            out.append(entry)
        elif isinstance(entry, dict) and isinstance(entry.get("include-group"), str):
            out += _group(groups, entry["include-group"], seen)
    return out


def _toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text()) if path.is_file() else {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}


def _ini(path: Path, section: str) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(path.read_text()) if path.is_file() else None
    except (configparser.Error, UnicodeDecodeError):
        return {}
    return dict(parser[section]) if parser.has_section(section) else {}
