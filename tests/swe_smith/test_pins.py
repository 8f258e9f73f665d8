"""The repository's own test/development pins, read from its files (environments/swe_smith/pins.py)."""

from __future__ import annotations

from pathlib import Path

from environments.swe_smith.pins import repo_pins


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_charset_normalizers_dev_requirements(tmp_path):
    # as on jawah/charset_normalizer's main at 1fdd6463: pytest-cov for its addopts, pytest capped
    files = {
        "dev-requirements.txt": "pytest-cov==4.1.0\npytest>=7.4.4,<=8.3.4\n",
        "setup.cfg": "[flake8]\nignore = W503\n",
    }
    assert repo_pins(write(tmp_path, files)) == ["-r", "dev-requirements.txt"]


def test_extras_groups_setup_cfg_and_unconditional_tox_deps(tmp_path):
    pyproject = (
        '[project]\nname = "x"\n[project.optional-dependencies]\ntests = ["pytest"]\ndocs = ["sphinx"]\n'
        '[dependency-groups]\nlint = ["ruff"]\ntest = ["hypothesis==6.1", {include-group = "lint"}]\n'
    )
    tox = (
        "[tox]\nenvlist = py311-m3\n[testenv]\nextras = tests\ndeps =\n    coverage>=7\n"
        "    m3: marshmallow<4\n    {[base]deps}\n    -r requirements/ci.txt\n"
    )
    files = {
        "pyproject.toml": pyproject,
        "setup.cfg": "[options.extras_require]\ndev =\n    tox\n",
        "tox.ini": tox,
        "requirements-test.txt": "mock==5.0\n",
    }
    assert repo_pins(write(tmp_path, files)) == [
        *("-r", "requirements-test.txt", "-e", ".[dev,tests]", "hypothesis==6.1", "ruff"),
        *("coverage>=7", "-r", "requirements/ci.txt"),
    ]


def test_a_repository_naming_no_pins(tmp_path):
    assert repo_pins(write(tmp_path, {"pyproject.toml": '[project]\nname = "x"\n', "tox.ini": "[tox]\n"})) == []
    assert repo_pins(write(tmp_path / "broken", {"pyproject.toml": "[project\n"})) == []
