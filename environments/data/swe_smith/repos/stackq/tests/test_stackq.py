import pytest

from stackq import BoundedQueue, Stack


def test_stack_lifo():
    s = Stack()
    for i in range(3):
        s.push(i)
    assert [s.pop(), s.pop(), s.pop()] == [2, 1, 0]


def test_stack_peek():
    s = Stack()
    s.push("a")
    s.push("b")
    assert s.peek() == "b" and len(s) == 2


def test_queue_fifo():
    q = BoundedQueue(2)
    q.put(1)
    q.put(2)
    assert q.get() == 1


def test_queue_capacity():
    q = BoundedQueue(1)
    q.put(1)
    with pytest.raises(OverflowError):
        q.put(2)
