"""Pure parts of the genuine-file review: which published wheel is fetched first, pytest's entry points."""

from environments.terminal_tasks.genuine import _wheel_rank
from environments.terminal_tasks.py_imports import pytest11_modules

BCRYPT = [  # bcrypt 4.3.0's x86_64 Linux wheels, as PyPI lists them
    "bcrypt-4.3.0-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "bcrypt-4.3.0-cp39-abi3-manylinux_2_28_x86_64.whl",
    "bcrypt-4.3.0-cp39-abi3-manylinux_2_34_x86_64.whl",
    "bcrypt-4.3.0-cp39-abi3-musllinux_1_1_x86_64.whl",
    "bcrypt-4.3.0-cp39-abi3-musllinux_1_2_x86_64.whl",
    "bcrypt-4.3.0-cp38-abi3-manylinux_2_34_x86_64.whl",
]


def test_the_wheel_the_installed_tags_name_is_fetched_first():
    """pip installed the manylinux_2_34 wheel (its WHEEL file's Tag line); with four wheels tried, rank alone put it
    fifth behind the other glibc and musl ones, and the installed `.so` was called not genuine (pypi-server)."""
    tags = frozenset({"cp39-abi3-manylinux_2_34_x86_64"})
    first = sorted(BCRYPT, key=lambda f: _wheel_rank(f, "cp313", tags))[0]
    assert first == "bcrypt-4.3.0-cp39-abi3-manylinux_2_34_x86_64.whl"
    compressed = frozenset({"cp39-abi3-manylinux2014_x86_64"})  # one tag of a compressed tag set
    assert sorted(BCRYPT, key=lambda f: _wheel_rank(f, "cp313", compressed))[0] == BCRYPT[0]


def test_pytest11_entry_points_name_their_top_level_modules():
    text = "[console_scripts]\nx = a.b:main\n\n[pytest11]\ntimeout = pytest_timeout\nctrf = pkg.plugin:obj\n"
    assert pytest11_modules(text) == {"pytest_timeout", "pkg"}
    assert pytest11_modules("[console_scripts]\npytest = pytest:console_main\n") == set()
