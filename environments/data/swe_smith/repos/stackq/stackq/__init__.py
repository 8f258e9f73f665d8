"""A stack and a bounded queue."""


class Stack:
    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        if not self._items:
            raise IndexError("pop from an empty stack")
        return self._items.pop()

    def peek(self):
        if not self._items:
            raise IndexError("peek at an empty stack")
        return self._items[-1]

    def __len__(self):
        return len(self._items)


class BoundedQueue:
    def __init__(self, capacity):
        self.capacity = capacity
        self._items = []

    def put(self, item):
        if len(self._items) >= self.capacity:
            raise OverflowError("queue is full")
        self._items.append(item)

    def get(self):
        if not self._items:
            raise IndexError("get from an empty queue")
        return self._items.pop(0)
