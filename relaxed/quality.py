"""Relaxation quality of a priority queue: rank error and delay, replayed from a log.

After the methodology of Williams, Sanders, Dementiev (ESA 2021) and their
``multiqueue_experiments`` (operation logs replayed afterwards):

* **rank error** of a pop: how many elements present at that moment had a
  strictly smaller key than the one returned (0 for an exact queue);
* **delay** of an element: how many pops, while it was present, returned an
  element with a strictly larger key (how often it was skipped).

A log is a sequence of events (tick, op, key, value) with op 1 = push, 2 = pop;
the MultiQueue's ``_hold(..., log=...)`` stamps each event while the queue's lock
is held, so sorting by tick gives a valid linearization. Elements are identified
by (key, value); a pop is matched to the latest earlier unmatched push of the
same pair. The replay is O(E log E) with two Fenwick trees (Numba).

Example::

    from relaxed.quality import rank_errors_sequential
    errs = rank_errors_sequential(initial_keys, popped_keys, pushed_keys)
"""
from __future__ import annotations

import threading

import numba as nb
import numpy as np

from relaxed._multiqueue import _as_1d

__all__ = ["replay", "rank_errors_sequential", "merge_logs", "logged_hold",
           "theory_rank_error"]


def theory_rank_error(n_queues: int) -> float:
    """Expected long-run rank error of two-choice pops with replacement,
    5/6·n − 1 + 1/(6n) (Walzer and Williams 2025)."""
    if isinstance(n_queues, (bool, np.bool_)) or not isinstance(n_queues, (int, np.integer)):
        raise TypeError(f"n_queues must be an int, got {type(n_queues).__name__} {n_queues!r}")
    if n_queues < 1:
        raise ValueError(f"n_queues must be >= 1, got {n_queues}")
    return 5 / 6 * n_queues - 1 + 1 / (6 * n_queues)


@nb.njit(cache=True, nogil=True)
def _fen_add(tree, i, v):
    i += 1
    n = tree.shape[0]
    while i < n:
        tree[i] += v
        i += i & (-i)


@nb.njit(cache=True, nogil=True)
def _fen_prefix(tree, i):
    # sum of positions [0, i)
    s = 0
    while i > 0:
        s += tree[i]
        i -= i & (-i)
    return s


@nb.njit(cache=True, nogil=True)
def _replay(op, key, value, by_kv, by_time):
    # slot of every event in (key, value, time) order
    n = op.shape[0]
    slot = np.empty(n, dtype=np.int64)
    for s in range(n):
        slot[by_kv[s]] = s
    # first slot with the same key (for "strictly smaller key")
    key_start = np.empty(n, dtype=np.int64)
    for s in range(n):
        e = by_kv[s]
        if s > 0 and key[by_kv[s - 1]] == key[e]:
            key_start[s] = key_start[s - 1]
        else:
            key_start[s] = s
    # match each pop to the latest unmatched earlier push with the same (key, value)
    match = np.full(n, -1, dtype=np.int64)     # pop event -> slot of its push
    stack = np.empty(n, dtype=np.int64)
    s = 0
    while s < n:
        t = s
        while t + 1 < n and key[by_kv[t + 1]] == key[by_kv[s]] and value[by_kv[t + 1]] == value[by_kv[s]]:
            t += 1
        top = 0
        for u in range(s, t + 1):
            e = by_kv[u]
            if op[e] == 1:
                stack[top] = u
                top += 1
            elif top > 0:
                top -= 1
                match[e] = stack[top]
        s = t + 1
    present = np.zeros(n + 1, dtype=np.int64)
    skipped = np.zeros(n + 2, dtype=np.int64)   # difference tree: range add, point query
    base = np.zeros(n, dtype=np.int64)
    n_pops = 0
    for e in range(n):
        if op[e] == 2:
            n_pops += 1
    rank = np.empty(n_pops, dtype=np.int64)
    delay = np.empty(n_pops, dtype=np.int64)
    unmatched = 0
    j = 0
    for e in by_time:
        if op[e] == 1:
            s = slot[e]
            _fen_add(present, s, 1)
            base[s] = _fen_prefix(skipped, s + 1)
        else:
            s = match[e]
            if s < 0:
                unmatched += 1
                rank[j] = -1
                delay[j] = -1
                j += 1
                continue
            ks = key_start[s]
            rank[j] = _fen_prefix(present, ks)
            _fen_add(present, s, -1)
            delay[j] = _fen_prefix(skipped, s + 1) - base[s]
            # every element with a strictly smaller key was skipped once more
            _fen_add(skipped, 0, 1)
            _fen_add(skipped, ks, -1)
            j += 1
    return rank, delay, unmatched


def replay(ticks, ops, keys, values, initial_keys=None, initial_values=None):
    """Rank error and delay of every pop in a log; returns (rank_errors, delays).

    ticks, ops, keys, values: 1-D arrays of equal length (op 1 = push, 2 = pop);
    initial_*: the elements present before the first event. Keys must be
    integers in a consistent order (the MultiQueue log holds mapped uint64 keys
    viewed as int64; pass ``keys ^ np.int64(-(1 << 63))``, which maps them back, or
    use :func:`merge_logs`).
    Raises ValueError if a pop cannot be matched to a push.
    """
    ticks, ops, keys, values = (_as_1d(name, a, np.int64, "integer") for name, a in (
        ("ticks", ticks), ("ops", ops), ("keys", keys), ("values", values)))
    if not (ticks.shape == ops.shape == keys.shape == values.shape) or ticks.ndim != 1:
        raise ValueError("ticks, ops, keys and values must be 1-D arrays of one length")
    if ops.size and not np.isin(ops, (1, 2)).all():
        raise ValueError("ops must be 1 (push) or 2 (pop)")
    if initial_keys is not None:
        ik = _as_1d("initial_keys", initial_keys, np.int64, "integer")
        iv = (_as_1d("initial_values", initial_values, np.int64, "integer")
              if initial_values is not None else np.arange(ik.size, dtype=np.int64))
        if ik.shape != iv.shape:
            raise ValueError("initial_keys and initial_values must have one length")
        t0 = (ticks.min() if ticks.size else 0) - 1
        ticks = np.concatenate([np.full(ik.size, t0, dtype=np.int64), ticks])
        ops = np.concatenate([np.ones(ik.size, dtype=np.int64), ops])
        keys = np.concatenate([ik, keys])
        values = np.concatenate([iv, values])
    # time order: by tick, ties by position (stable)
    order_time = np.empty(ticks.size, dtype=np.int64)
    order_time[np.argsort(ticks, kind="stable")] = np.arange(ticks.size)
    by_kv = np.lexsort((order_time, values, keys))
    by_time = np.argsort(order_time, kind="stable")
    rank, delay, unmatched = _replay(ops, keys, values, by_kv, by_time)
    if unmatched:
        raise ValueError(f"{unmatched} pops returned an element that was never pushed")
    return rank, delay


def rank_errors_sequential(initial_keys, popped, pushed):
    """Rank errors of a one-thread hold run: pop popped[i], then push pushed[i]."""
    popped = _as_1d("popped", popped, np.int64, "integer")
    pushed = _as_1d("pushed", pushed, np.int64, "integer")
    if popped.shape != pushed.shape:
        raise ValueError(f"popped and pushed must be 1-D of one length (one push after each "
                         f"pop), got shapes {popped.shape} and {pushed.shape}")
    initial_keys = _as_1d("initial_keys", initial_keys, np.int64, "integer")
    n = popped.size
    ticks = np.arange(2 * n, dtype=np.int64)
    ops = np.tile(np.array([2, 1], dtype=np.int64), n)
    keys = np.empty(2 * n, dtype=np.int64)
    keys[0::2] = popped
    keys[1::2] = pushed
    # identify elements by key alone: values are taken from a running id so that a
    # pop matches the most recent push of its key
    vals = np.zeros(2 * n, dtype=np.int64)
    rank, _ = replay(ticks, ops, keys, vals, initial_keys, np.zeros(len(initial_keys), np.int64))
    return rank


def logged_hold(mq, threads, iters, max_increment):
    """The hold model on ``threads`` threads started together: each repeats ``iters``
    times "pop, then push the key plus a uniform in [0, max_increment)" through
    ``mq._hold``, logging every event. Returns (logs, lengths) for :func:`merge_logs`."""
    logs = [np.zeros((2 * iters, 4), dtype=np.int64) for _ in range(threads)]
    lens = [0] * threads
    barrier = threading.Barrier(threads)

    def body(i):
        barrier.wait()
        lens[i] = mq._hold(iters, max_increment, log=logs[i])[1]
    ts = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return logs, lens


def merge_logs(logs, lengths):
    """Concatenate per-thread MultiQueue logs (rows of tick, op, mapped key, value)
    into (ticks, ops, keys, values) with keys mapped back to int64 order."""
    logs, lengths = list(logs), list(lengths)
    if len(logs) != len(lengths):                 # (zip dropped the extra logs)
        raise ValueError(f"logs and lengths must match, one length per log: got "
                         f"{len(logs)} logs and {len(lengths)} lengths")
    for i, (lg, n) in enumerate(zip(logs, lengths)):
        if np.ndim(lg) != 2 or np.shape(lg)[1] != 4:
            raise ValueError(f"logs[{i}] must be an array of rows (tick, op, key, value), "
                             f"got shape {np.shape(lg)}")
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) \
                or not 0 <= n <= len(lg):
            raise ValueError(f"lengths[{i}] must be an int in [0, {len(lg)}] (the rows "
                             f"logged), got {n!r}")
    parts = [np.asarray(lg)[:n] for lg, n in zip(logs, lengths)]
    rows = np.concatenate(parts) if parts else np.empty((0, 4), dtype=np.int64)
    keys = rows[:, 2] ^ np.int64(-(1 << 63))
    return rows[:, 0], rows[:, 1], keys, rows[:, 3]
