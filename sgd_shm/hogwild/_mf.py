"""Numba kernel for matrix factorization by Hogwild SGD (private; see sgd_shm.hogwild.mf).

The biased model of Funk (2006) and Koren, Bell, Volinsky ("Matrix factorization
techniques for recommender systems", 2009): r̂(u, i) = mu + b_u + b_i + p_u · q_i,
trained on the observed ratings by SGD with L2 on the rows it touches. Workers
walk their part of a shuffled index array and update user and item rows without
locks, as in the Netflix experiments of Hogwild! (Niu et al. 2011): two ratings
rarely share a user or an item, so collisions are rare (intended race: a lost
update of a row only loses one step).
"""
import math

import numba as nb
import numpy as np

from sgd_shm.core.atomics import DISTANCE, prefetch, prefetch_once

# out slots
MO_LOSS, MO_STEPS, MO_DIVERGED = range(3)
MN_OUT = 3


@nb.njit(cache=True, nogil=True)
def mf_run(P, Q, bu, bi, users, items, ratings, order, lo, hi, lr, reg, reg_bias, mu,
           fit_bias, out):
    k = P.shape[1]
    sq = 0.0
    for t in range(lo, hi):
        if t + 2 * DISTANCE < hi:        # the rating's ids and value, further ahead
            m = order[t + 2 * DISTANCE]
            prefetch_once(users, m)
            prefetch_once(items, m)
            prefetch_once(ratings, m)
        if t + DISTANCE < hi:            # then its rows (ids now in cache), every line
            m = order[t + DISTANCE]
            u = users[m]
            i = items[m]
            for f in range(0, k, 8):
                prefetch(P, u * k + f)
                prefetch(Q, i * k + f)
            prefetch(P, u * k + k - 1)
            prefetch(Q, i * k + k - 1)
            if fit_bias:
                prefetch(bu, u)
                prefetch(bi, i)
        n = order[t]
        u = users[n]
        i = items[n]
        pred = mu
        if fit_bias:
            pred += bu[u] + bi[i]
        for f in range(k):
            pred += P[u, f] * Q[i, f]
        if not math.isfinite(pred):
            out[MO_DIVERGED] = 1.0
            out[MO_LOSS] = sq
            out[MO_STEPS] = t - lo
            return
        e = ratings[n] - pred
        sq += e * e
        if fit_bias:
            bu[u] += lr * (e - reg_bias * bu[u])
            bi[i] += lr * (e - reg_bias * bi[i])
        for f in range(k):
            pu = P[u, f]
            qi = Q[i, f]
            P[u, f] = pu + lr * (e * qi - reg * pu)
            Q[i, f] = qi + lr * (e * pu - reg * qi)
    out[MO_LOSS] = sq
    out[MO_STEPS] = hi - lo


@nb.njit(cache=True, nogil=True)
def shuffle_part(order, lo, hi, seed):
    """Shuffle order[lo:hi] in place (Fisher-Yates) with a splitmix64 stream from
    ``seed``: each MF worker shuffles its own part of the ratings at the start of an
    epoch, in parallel, instead of the driver permuting all of them serially, and so
    does each Hogwild worker of the linear models. Positions are
    drawn as floor(u·(i+1)) with u a 53-bit uniform: a bias below (hi-lo)·2^-53."""
    state = np.uint64(seed)
    golden = np.uint64(0x9E3779B97F4A7C15)
    m1 = np.uint64(0xBF58476D1CE4E5B9)
    m2 = np.uint64(0x94D049BB133111EB)
    for i in range(hi - lo - 1, 0, -1):
        state += golden
        z = state
        z = (z ^ (z >> np.uint64(30))) * m1
        z = (z ^ (z >> np.uint64(27))) * m2
        z = z ^ (z >> np.uint64(31))
        u = float(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)
        j = int(u * (i + 1))
        a = order[lo + i]
        order[lo + i] = order[lo + j]
        order[lo + j] = a
