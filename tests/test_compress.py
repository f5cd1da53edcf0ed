"""Compressors with error feedback (sgd_shm.compress) against naive oracles."""
from __future__ import annotations

import numpy as np
import pytest

from sgd_shm import _select
from sgd_shm.compress import (QSGD, Channel, Compressor, Dense, RandomK, SparseMessage,
                              ThresholdTopK, TopK, make_compressor)
from tests.naive import topk_naive


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", range(20))
def test_topk_exact_with_ties(dtype, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    g = np.round(rng.normal(size=n) * 3).astype(dtype)          # many ties, zeros
    k = int(rng.integers(1, n + 1))
    msg = TopK(k=k).compress(g)
    np.testing.assert_array_equal(msg.indices, topk_naive(g, k))
    np.testing.assert_array_equal(msg.values, g[msg.indices])
    assert msg.nbytes == msg.indices.nbytes + msg.values.nbytes


def _hard_inputs(rng):
    """Inputs that defeat a sampled threshold: big values away from the sampled
    positions, mostly zeros, all equal, a few nonzeros, huge ties, float32."""
    n = 50_000
    pos = _select._sample_positions(n, 4096, n)
    g = np.zeros(n)
    off = np.setdiff1d(np.arange(n), pos)[:300]
    g[off] = rng.normal(size=300) * 100                   # the sample sees only zeros
    yield g, 200
    g2 = np.zeros(n)
    g2[pos] = 1000.0                                      # the sample sees only giants
    g2[off] = 5.0
    yield g2, 10
    yield np.full(n, -2.5), 77                            # every entry ties
    g3 = np.zeros(n)
    g3[rng.choice(n, 7, replace=False)] = rng.normal(size=7)
    yield g3, 50                                          # fewer nonzeros than k
    yield np.round(rng.normal(size=n) * 2).astype(np.float32), 1000
    yield rng.standard_cauchy(n), 50                      # heavy tails
    yield np.zeros(n), 3


@pytest.mark.parametrize("seed", range(3))
def test_topk_kernel_exact_on_hard_inputs(seed):
    rng = np.random.default_rng(seed)
    for g, k in _hard_inputs(rng):
        want = topk_naive(g, k)
        np.testing.assert_array_equal(_select.topk_indices(g, k), want)
        for sample, margin in [(1, 0.0), (64, 0.0), (50_000, 3.0)]:
            got = _select.topk_indices(g, k, sample=sample, margin=margin)
            np.testing.assert_array_equal(got, want)


def test_threshold_topk_sends_everything_above_its_threshold():
    rng = np.random.default_rng(4)
    comp = ThresholdTopK(ratio=0.01, sample=0.05, seed=1)
    sizes = []
    for _ in range(50):
        g = rng.normal(size=20_000) * rng.random(20_000)
        msg = comp.compress(g)
        sent = np.zeros(g.size, bool)
        sent[msg.indices] = True
        assert np.all(np.diff(msg.indices) > 0)
        np.testing.assert_array_equal(msg.values, g[msg.indices])
        # a threshold rule: nothing left out is larger than anything sent
        assert np.abs(g[~sent]).max() < np.abs(g[sent]).min()
        sizes.append(msg.indices.size)
    # the sampled threshold lands near k = 200 (a sample of 1000: rank 10 of it)
    assert 100 < np.median(sizes) < 400, sizes


def test_qsgd_unbiased_and_bounded():
    """E[decoded] = g: each coordinate's mean over N draws lies within 5 of its
    standard errors, bounded by ||g|| / (2 s sqrt(N)) (a level is l or l + 1, so the
    variance is at most (||g|| / s)^2 / 4); the false-alarm chance per coordinate
    is below 1e-6."""
    rng = np.random.default_rng(2)
    g = rng.normal(size=24) * np.linspace(0.1, 3, 24)
    g[5] = 0.0
    s, draws = 4, 20000
    comp = QSGD(levels=s, seed=7)
    mean = np.zeros(g.size)
    norm = np.linalg.norm(g)
    for _ in range(draws):
        msg = comp.compress(g)
        lv = np.abs(msg.values)
        assert np.all(lv == np.round(lv)) and lv.max() <= s and 5 not in msg.indices
        assert np.all(np.sign(msg.values) == np.sign(g[msg.indices]))
        assert msg.scale == pytest.approx(norm / s)
        msg.add_to(mean)
    bound = 5 * norm / (2 * s * np.sqrt(draws))
    assert np.all(np.abs(mean / draws - g) < bound), (np.abs(mean / draws - g).max(), bound)


def test_qsgd_buckets_unbiased_and_bounded():
    """With buckets each run of d entries is quantized against its own norm: every sent
    value is a signed level l in [1, s] times its bucket's norm / s, the sign of its
    entry, and E[decoded] = g within 5 standard errors of each coordinate (bounded by
    its bucket's norm / (2 s sqrt(N)))."""
    rng = np.random.default_rng(4)
    g = rng.normal(size=50) * np.repeat([0.01, 1.0, 100.0, 0.0, 3.0], 10)
    s, d, draws = 4, 10, 20000
    comp = QSGD(levels=s, seed=5, bucket=d)
    norms = np.repeat([np.linalg.norm(g[i:i + d]) for i in range(0, 50, d)], d)
    mean = np.zeros(g.size)
    for _ in range(draws):
        msg = comp.compress(g)
        assert msg.scale == 1.0 and not np.isin(np.arange(30, 40), msg.indices).any()
        lv = np.abs(msg.values) / (norms[msg.indices] / s)
        np.testing.assert_allclose(lv, np.round(lv), rtol=0, atol=1e-9)
        assert lv.min() > 0.5 and lv.max() < s + 1e-9
        assert np.all(np.sign(msg.values) == np.sign(g[msg.indices]))
        msg.add_to(mean)
    bound = 5 * norms / (2 * s * np.sqrt(draws))
    assert np.all(np.abs(mean / draws - g) <= bound), (np.abs(mean / draws - g) - bound).max()


def test_qsgd_one_bucket_is_the_whole_gradient_and_buckets_lower_the_variance():
    """bucket >= n draws the same uniforms against the same norm: the same message as
    no bucket, bit for bit once decoded (float64 and float32). Smaller buckets lower the
    error E||Q(g) - g||^2 / ||g||^2 and keep it under the stated factor omega."""
    rng = np.random.default_rng(0)
    for dt in (np.float64, np.float32):
        g = rng.normal(size=3000).astype(dt)
        a = QSGD(levels=4, seed=3).compress(g)
        for bucket in (3000, 10**6):
            b = QSGD(levels=4, seed=3, bucket=bucket).compress(g)
            assert np.array_equal(a.indices, b.indices) and b.values.dtype == dt
            assert np.array_equal(a.to_dense(dt), b.to_dense(dt)) and a.nbytes == b.nbytes
    g = rng.normal(size=3000)
    errs = {}
    for bucket in (None, 512, 64):
        q = QSGD(levels=4, seed=1, bucket=bucket)
        errs[bucket] = np.mean([np.sum((q.compress(g).to_dense() - g) ** 2)
                                for _ in range(300)]) / np.sum(g ** 2)
        assert errs[bucket] <= q.omega(g.size), (bucket, errs[bucket], q.omega(g.size))
    assert errs[64] < errs[512] < errs[None]
    assert QSGD(levels=4, bucket=64).omega(3000) == 2.0 == QSGD(levels=4).omega(64)


def test_qsgd_bucket_bytes_error_feedback_and_bad_input():
    g = np.random.default_rng(1).normal(size=1000)
    msg = QSGD(levels=16, bucket=300).compress(g)         # 4 buckets: 4 norms
    assert msg.nbytes == -(-(4 * 32 + min(1000 * 6, msg.indices.size * 38)) // 8)
    with pytest.raises(ValueError, match=r"levels > sqrt\(d\) = 18 \(d = 300"):
        QSGD(levels=17, error_feedback=True).memory(300)
    QSGD(levels=17, error_feedback=True, bucket=256).memory(300)   # omega = 16/17 < 1
    assert repr(make_compressor("qsgd:8:512")) == \
        "QSGD(levels=8, error_feedback=False, bucket=512)"
    for bad in (0, True, 2.5, "512"):
        with pytest.raises(ValueError, match="bucket must be None"):
            QSGD(levels=4, bucket=bad)
    with pytest.raises(ValueError, match="bucket must be None.*'qsgd:8:0'"):
        make_compressor("qsgd:8:0")


def test_odd_arguments_are_refused_by_name():
    """An empty or float16 gradient, a memory of no weights or of an integer type, a
    keep_lost that is not a bool and a spec with a bad number are refused by name
    (ZeroDivisionError, numpy's or numba's words, or a truthy "no" before); a numpy
    float ratio is a ratio."""
    for comp in (TopK(ratio=0.5), RandomK(ratio=0.5), ThresholdTopK(ratio=0.5), QSGD(4),
                 Dense()):
        with pytest.raises(ValueError, match="g is empty"):
            comp.compress(np.zeros(0))
        with pytest.raises(TypeError, match="g must be a 1-D float64 or float32"):
            comp.compress(np.ones(4, np.float16))
    assert TopK(ratio=np.float32(0.5)).k_for(10) == 5
    for n, err in ((2.5, TypeError), (-1, ValueError), (0, ValueError)):
        with pytest.raises(err, match="n: the model's weights, an int >= 1"):
            TopK(ratio=0.5).memory(n)
    with pytest.raises(TypeError, match="dtype"):
        TopK(ratio=0.5).memory(4, dtype=np.int64)
    with pytest.raises(TypeError, match="keep_lost: must be True or False"):
        Channel(Dense(), 4, keep_lost="no")
    with pytest.raises(ValueError, match=r"levels must be an int >= 1, got 'x' \(in 'qsgd:x'\)"):
        make_compressor("qsgd:x")
    with pytest.raises(ValueError, match="bucket must be None or an int >= 1, got 'x'"):
        make_compressor("qsgd:8:x")


def test_qsgd_norm_neither_overflows_nor_underflows():
    """The bucket norm is summed in float64 (a float32 gradient's squares overflowed at
    1e20: an empty message of scale inf) and rescaled by the largest entry where the
    squares overflow or vanish (1e160 decoded to 0); |g_i| / norm comes before the
    levels' factor (s |g_i| overflowed near 1e308: flipped signs). The decoding is still
    unbiased: each entry lies between the levels around it."""
    for g in (np.array([1e20, -2e20], np.float32), np.array([1e-25, 2e-25], np.float32),
              np.array([1e160, -1e160, 1.0]), np.array([1e308, 1e308, -1e308]),
              np.array([1e-200, 0.0, -1e-200])):
        q = QSGD(levels=4, seed=0)
        msg = q.compress(g)
        g64 = g.astype(np.float64)
        norm = np.max(np.abs(g64)) * np.linalg.norm(g64 / np.max(np.abs(g64)))
        assert msg.scale == pytest.approx(norm / 4, rel=1e-6), g
        dec = msg.to_dense().astype(np.float64)
        assert np.all(np.sign(dec) * np.sign(g64) >= 0), (g, dec)        # no flipped sign
        assert np.all(np.abs(dec) <= norm * (1 + 1e-6)) and dec[np.argmax(np.abs(g64))] != 0
    with pytest.raises(ValueError, match="norm overflows float64"):
        QSGD(levels=4).compress(np.full(4, 1.5e308))


def test_qsgd_bytes():
    comp = QSGD(levels=16)
    g = np.random.default_rng(0).normal(size=10_000)
    msg = comp.compress(g)
    nnz = msg.indices.size                                   # sign + 5 level bits each
    assert msg.nbytes == 4 + -(-min(10_000 * 6, nnz * 38) // 8)
    assert QSGD(levels=1000).compress(g).nbytes == 4 + 10_000 * 11 // 8   # dense wins
    sparse = np.zeros(10_000)
    sparse[[3, 9000]] = [0.75, -1.0]                         # |g| / ||g|| = 0.6, 0.8
    m2 = QSGD(levels=5).compress(sparse)                     # levels 3 and 4: exact
    assert m2.indices.tolist() == [3, 9000] and m2.nbytes == 4 + -(-2 * 36 // 8)
    np.testing.assert_allclose(m2.to_dense(), sparse, rtol=1e-15)


@pytest.mark.parametrize("comp", [TopK(ratio=0.05), RandomK(ratio=0.1, seed=3),
                                  ThresholdTopK(ratio=0.05, seed=2)])
def test_error_feedback_conserves_mass(comp):
    rng = np.random.default_rng(1)
    n = 400
    mem = comp.memory(n)
    total_in, total_sent = np.zeros(n), np.zeros(n)
    for t in range(200):
        g = rng.integers(-50, 50, n).astype(np.float64)
        total_in += g
        msg = mem.step(g)
        if t % 7 == 3:
            mem.keep(msg)                                 # lost: back into the memory
        else:
            msg.add_to(total_sent)
    np.testing.assert_array_equal(total_sent + mem.residual, total_in)


def test_qsgd_error_feedback_conserves_mass_to_rounding():
    rng = np.random.default_rng(3)
    with pytest.raises(ValueError, match="levels > sqrt"):
        QSGD(levels=17, error_feedback=True).memory(300)     # omega = 1.02: diverges
    mem = QSGD(levels=32, error_feedback=True, seed=1).memory(300)
    total_in, total_sent = np.zeros(300), np.zeros(300)
    for _ in range(300):
        g = rng.normal(size=300)
        total_in += g
        mem.step(g).add_to(total_sent)
    np.testing.assert_allclose(total_sent + mem.residual, total_in, atol=1e-9)
    # the residual stays bounded (error feedback does not let it grow)
    assert np.linalg.norm(mem.residual) < 10 * np.sqrt(300)


def test_streams_differ_and_repeat():
    """Workers' memories draw from (seed, worker): different per worker, the same
    for the same worker in another run."""
    g = np.arange(1.0, 1001.0)
    for comp in (RandomK(k=20, seed=5), QSGD(levels=2, seed=5),
                 ThresholdTopK(k=20, sample=0.1, seed=5)):
        a, b, a2 = (comp.memory(1000, stream=s) for s in (0, 1, 0))
        ma, mb, ma2 = a.step(g), b.step(g), a2.step(g)
        assert not (np.array_equal(ma.indices, mb.indices)
                    and np.array_equal(ma.values, mb.values)), comp
        np.testing.assert_array_equal(ma.indices, ma2.indices)
        np.testing.assert_array_equal(ma.values, ma2.values)
    top = TopK(k=3)
    assert top.for_stream(4) is top and Dense().for_stream(1).__class__ is Dense


def test_no_error_feedback_keeps_nothing():
    mem = TopK(k=2, error_feedback=False).memory(5)
    msg = mem.step(np.array([1.0, -5.0, 2.0, 0.5, 3.0]))
    assert msg.indices.tolist() == [1, 4] and not mem.residual.any()


@pytest.mark.parametrize("comp", [Dense(), QSGD(levels=4, seed=1), TopK(k=3, error_feedback=False),
                                  RandomK(k=3, rescale=True, error_feedback=False, seed=2)],
                         ids=repr)
def test_kept_messages_come_back_without_error_feedback(comp):
    """A message kept (eager-SGD's late="carry") goes out again with the next step also
    when the compressor keeps no error feedback (it was dropped): over a run, the
    messages applied plus what is held equal the inputs minus only what compression
    itself dropped (nothing for Dense)."""
    ch = Channel(comp, 40, keep_lost=True)
    rng = np.random.default_rng(0)
    total_in, applied, kept = np.zeros(40), np.zeros(40), 0
    for t in range(60):
        g = rng.integers(-9, 9, 40).astype(np.float64)
        total_in += g
        msg = ch.message(g)
        late = t % 4 == 1
        ch.delivered(msg, applied=not late)
        if late:
            kept += 1
            assert ch.memory.residual.any()
        else:
            msg.add_to(applied)
            assert not ch.memory.residual.any()          # carried out with this message
    assert kept == 15
    if isinstance(comp, Dense):
        np.testing.assert_array_equal(applied + ch.memory.residual, total_in)
    q = Channel(Dense(), 3, keep_lost=True)
    q.delivered(q.message(np.array([1.0, 2.0, 3.0])), applied=False)
    assert q.message(np.zeros(3)).to_dense().tolist() == [1.0, 2.0, 3.0]


def test_rescaled_randomk_refuses_error_feedback_and_user_compressors_see_g_read_only():
    """RandomK(rescale=True) with error feedback takes back n/k - 1 times each sent entry:
    its residual grows without bound, so a memory refuses it (as QSGD with too few
    levels). A user's compressor that edits its input would take mass out of the memory
    (sent + residual no longer the inputs): it gets the input read-only."""
    with pytest.raises(ValueError, match=r"RandomK\(rescale=True\) with error_feedback=True "
                                         r"diverges: each sent entry is scaled by n/k = 10"):
        RandomK(ratio=0.1, rescale=True).memory(100)
    RandomK(ratio=1.0, rescale=True).memory(100)            # n/k = 1: nothing rescaled
    assert repr(RandomK(k=3, rescale=True, error_feedback=False)).endswith("rescale=True)")

    class Edits(Compressor):
        def compress(self, g):
            g[0] = 0.0
            return SparseMessage(np.array([1]), g[1:2].copy(), g.size, 8)
    for ef in (True, False):
        Edits.error_feedback = ef
        with pytest.raises(ValueError, match="read-only"):
            Edits().memory(6).step(np.arange(1.0, 7.0))


def test_randomk_uniform_and_unbiased():
    comp = RandomK(k=3, seed=0, rescale=True)
    g = np.arange(1.0, 11.0)
    counts, mean = np.zeros(10), np.zeros(10)
    draws = 20000
    for _ in range(draws):
        msg = comp.compress(g)
        assert len(set(msg.indices.tolist())) == 3
        counts[msg.indices] += 1
        msg.add_to(mean)
    # each index is drawn with p = 0.3: binomial sd = sqrt(20000 * 0.21) ~ 65
    assert np.all(np.abs(counts - 6000) < 6 * 65), counts
    # the rescaled message is unbiased: each coordinate's mean within 6 standard errors
    se = g * (10 / 3) * np.sqrt(0.3 * 0.7) / np.sqrt(draws)
    assert np.all(np.abs(mean / draws - g) < 6 * se), (mean / draws, g)


def test_specs_and_errors():
    assert repr(make_compressor("topk:0.01")) == "TopK(ratio=0.01, error_feedback=True)"
    assert isinstance(make_compressor("dense"), Dense) and make_compressor(None) is None
    assert repr(make_compressor("qsgd:4")) == "QSGD(levels=4, error_feedback=False)"
    assert isinstance(make_compressor("threshold:0.01"), ThresholdTopK)
    for bad in ("topk", "topk:2", "qsgd:0", "qsgd:1.5", "threshold:0", "bogus", 3):
        with pytest.raises(ValueError, match="compress"):
            make_compressor(bad)
    with pytest.raises(ValueError, match="exactly one"):
        TopK()
    with pytest.raises(ValueError, match="exceeds"):
        TopK(k=10).compress(np.ones(3))
    with pytest.raises(ValueError, match="NaN"):
        TopK(k=1).compress(np.array([np.nan, 1.0]))
    with pytest.raises(TypeError):
        TopK(k=1).compress(np.ones((2, 2)))
    with pytest.raises(ValueError, match="levels"):
        QSGD(levels=0)
    with pytest.raises(ValueError, match="sample"):
        ThresholdTopK(ratio=0.1, sample=0)
