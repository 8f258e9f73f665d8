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


def test_a_glibc_hwcaps_entry_is_what_the_loader_takes_for_its_soname():
    """A cache rebuilt with `ldconfig -f` listing /app/lib/glibc-hwcaps/x86-64-v2/libz.so.1 puts it under its own
    `hwcap:` key; glibc prefers it, so it must stand in the soname's place (then the review sees it changed)."""
    from environments.terminal_tasks.py_imports import cache_map

    image = "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n"
    agent = '\tlibz.so.1 (libc6,x86-64, hwcap: "x86-64-v2") => /app/lib/glibc-hwcaps/x86-64-v2/libz.so.1\n' + image
    key = ("libz.so.1", "libc6,x86-64")
    assert cache_map(image)[key] == "/lib/x86_64-linux-gnu/libz.so.1"
    assert cache_map(agent)[key] == "/app/lib/glibc-hwcaps/x86-64-v2/libz.so.1"
    assert cache_map(image + agent.splitlines()[0] + "\n")[key] == "/app/lib/glibc-hwcaps/x86-64-v2/libz.so.1"
