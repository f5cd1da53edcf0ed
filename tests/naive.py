"""Slow, obviously correct reference implementations (the tests' oracles)."""
from __future__ import annotations

import bisect
import threading


class NaivePQ:
    """An exact min-priority queue over a sorted list."""

    def __init__(self):
        self._items: list[tuple] = []

    def push(self, key, value):
        bisect.insort(self._items, (key, value))

    def pop(self):
        if not self._items:
            raise IndexError("pop from an empty NaivePQ")
        return self._items.pop(0)

    def __len__(self):
        return len(self._items)


def rank_errors(initial_keys, ops):
    """Rank error of each pop in a sequential history.

    initial_keys: keys present at the start. ops: ("push", key, ...) / ("pop", key, ...)
    in program order. The rank error of a pop is the number of keys present at
    that moment that are strictly smaller than the key it returned.
    """
    present = sorted(initial_keys)
    errors = []
    for op, key, *_ in ops:
        if op == "push":
            bisect.insort(present, key)
        else:
            i = bisect.bisect_left(present, key)
            if i == len(present) or present[i] != key:
                raise AssertionError(f"pop returned {key}, which is not in the queue")
            errors.append(i)
            del present[i]
    return errors


def delays(initial, ops):
    """Delay of each popped element: how many pops, while it was present, returned a
    strictly larger key. Elements are (key, value) pairs with unique values.
    initial: list of (key, value); ops: ("push"|"pop", key, value). Quadratic."""
    present = {v: [k, 0] for k, v in initial}
    out = []
    for op, key, value in ops:
        if op == "push":
            present[value] = [key, 0]
            continue
        k, d = present.pop(value)
        assert k == key, f"pop returned ({key}, {value}) but that value has key {k}"
        out.append(d)
        for item in present.values():
            if item[0] < key:
                item[1] += 1
    return out


class LockedCounter:
    """An exact counter behind a lock."""

    def __init__(self):
        self._n = 0
        self._lock = threading.Lock()

    def increment(self, k=1):
        with self._lock:
            self._n += k

    def value(self):
        return self._n
