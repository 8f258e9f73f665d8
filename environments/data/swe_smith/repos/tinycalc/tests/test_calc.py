import pytest

from tinycalc import add, div, mean, mul, sub


def test_add():
    assert add(2, 3) == 5


def test_sub():
    assert sub(2, 3) == -1


def test_mul():
    assert mul(4, 3) == 12


def test_div():
    assert div(7, 2) == 3.5


def test_div_by_zero():
    with pytest.raises(ZeroDivisionError):
        div(1, 0)


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])
