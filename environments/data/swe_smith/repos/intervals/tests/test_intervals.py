from intervals import merge, total_length


def test_merge_disjoint():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_merge_overlapping():
    assert merge([(1, 4), (2, 6)]) == [(1, 6)]


def test_merge_touching():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_total_length():
    assert total_length([(1, 3), (2, 5), (10, 11)]) == 5
