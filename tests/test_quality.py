"""The log replay (rank error, delay) against the naive oracles."""
import numpy as np
import pytest

from naive import delays, rank_errors
from relaxed import MultiQueue
from relaxed.quality import (logged_hold, merge_logs, rank_errors_sequential, replay,
                             theory_rank_error)


def random_history(rng, n_init, n_ops):
    """Duplicate keys on purpose (ties), unique values (element identity)."""
    init = [(int(rng.integers(0, 50)), v) for v in range(n_init)]
    present = list(init)
    ops = []
    for i in range(n_ops):
        if present and rng.random() < 0.5:
            k, v = present.pop(int(rng.integers(len(present))))   # any element: a relaxed pop
            ops.append(("pop", k, v))
        else:
            k, v = int(rng.integers(0, 50)), n_init + i
            present.append((k, v))
            ops.append(("push", k, v))
    return init, ops


@pytest.mark.parametrize("seed", range(5))
def test_replay_matches_naive_rank_error_and_delay(seed):
    rng = np.random.default_rng(seed)
    init, ops = random_history(rng, 30, 300)
    kind = np.array([1 if o == "push" else 2 for o, _, _ in ops])
    keys = np.array([k for _, k, _ in ops])
    vals = np.array([v for _, _, v in ops])
    rank, delay = replay(np.arange(len(ops)), kind, keys, vals,
                         [k for k, _ in init], [v for _, v in init])
    assert rank.tolist() == rank_errors([k for k, _ in init], ops)
    assert delay.tolist() == delays(init, ops)


def test_replay_ticks_reorder_and_unmatched_pop():
    # events given out of time order are sorted by tick
    rank, _ = replay([5, 1, 3], [2, 1, 1], [7, 7, 3], [0, 0, 1])
    assert rank.tolist() == [1]
    with pytest.raises(ValueError, match="never pushed"):
        replay([0], [2], [1], [1])
    with pytest.raises(ValueError, match="ops must be"):
        replay([0], [3], [1], [1])


def test_bad_logs_are_refused_by_name():
    """Float keys were truncated (1.7 and 1.2 both became 1: a wrong rank), a float op
    passed as a push, a short pushed array was broadcast, theory_rank_error(0) divided
    by zero, and merge_logs dropped the logs past its lengths."""
    with pytest.raises(TypeError, match="keys must hold integers, got dtype float64"):
        replay([1, 2], [2, 2], [1.7, 1.2], [1, 0], initial_keys=[12, 17],
               initial_values=[0, 1])
    with pytest.raises(TypeError, match="initial_keys must hold integers"):
        replay([1], [2], [1], [0], initial_keys=[1.5], initial_values=[0])
    with pytest.raises(TypeError, match="ops must hold integers"):
        replay([0], [1.5], [1], [1])
    with pytest.raises(TypeError, match="ops must hold integers, got dtype bool"):
        replay([0], [True], [1], [1])
    with pytest.raises(ValueError, match="popped and pushed must be 1-D of one length"):
        rank_errors_sequential([1, 2], [1, 2], [3])
    with pytest.raises(ValueError, match="n_queues must be >= 1"):
        theory_rank_error(0)
    for bad in (True, 2.5):
        with pytest.raises(TypeError, match="n_queues must be an int"):
            theory_rank_error(bad)
    assert theory_rank_error(1) == pytest.approx(0.0, abs=1e-15)   # one queue: exact
    log = np.zeros((3, 4), np.int64)
    with pytest.raises(ValueError, match="one length per log: got 2 logs and 1 lengths"):
        merge_logs([log, log], [2])
    for n in (-1, 4, 1.0):
        with pytest.raises(ValueError, match=r"lengths\[0\] must be an int in \[0, 3\]"):
            merge_logs([log], [n])
    with pytest.raises(ValueError, match="rows \\(tick, op, key, value\\)"):
        merge_logs([np.zeros((3, 3))], [1])


def test_sequential_helper_matches_naive():
    rng = np.random.default_rng(3)
    init = rng.integers(0, 1 << 30, 2000)
    mq = MultiQueue(3000, n_queues=8, seed=3)
    mq.push_many(init, np.arange(2000))
    popped, pushed, ops = [], [], []
    for i in range(2000):
        k, v = mq.pop()
        k2 = k + int(rng.integers(0, 1 << 30))
        mq.push(k2, v)
        popped.append(k)
        pushed.append(k2)
        ops += [("pop", k), ("push", k2)]
    assert rank_errors_sequential(init, popped, pushed).tolist() == rank_errors(init.tolist(), ops)


def test_logged_hold_two_threads_replays_cleanly():
    n = 20_000
    mq = MultiQueue(3 * n, n_queues=4, seed=4)
    init = np.random.default_rng(4).integers(0, 1 << 30, n)
    mq.push_many(init, np.arange(n))
    logs, lens = logged_hold(mq, 2, n, 1 << 30)
    assert lens == [2 * n, 2 * n]
    ticks, ops, keys, vals = merge_logs(logs, lens)
    rank, delay = replay(ticks, ops, keys, vals, init, np.arange(n))
    assert len(rank) == 2 * n and rank.min() >= 0 and delay.min() >= 0
    mq._check()


def test_one_queue_under_two_threads_replays_exact():
    """One queue is an exact priority queue, so its log, stamped under the lock,
    must replay with rank error 0 and delay 0 for every pop, whichever core stamps
    (a stamp read before the lock's CAS completed would misorder events)."""
    n, it = 50_000, 100_000
    for seed in range(3):
        mq = MultiQueue(n + 2, n_queues=1, seed=seed)
        init = np.random.default_rng(seed).integers(0, 1 << 32, n)
        mq.push_many(init, np.arange(n))
        logs, lens = logged_hold(mq, 2, it, (1 << 32) - 1)
        mq._check()
        mq.close()
        rank, delay = replay(*merge_logs(logs, lens), init, np.arange(n))
        assert len(rank) == 2 * it
        assert rank.max() == 0 and delay.max() == 0, (seed, int((rank > 0).sum()))
