"""Compressors with error feedback (sgd_shm.compress) against naive oracles."""
from __future__ import annotations

import numpy as np
import pytest

from sgd_shm.compress import Dense, RandomK, TopK, make_compressor
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


@pytest.mark.parametrize("comp", [TopK(ratio=0.05), RandomK(ratio=0.1, seed=3)])
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


def test_no_error_feedback_keeps_nothing():
    mem = TopK(k=2, error_feedback=False).memory(5)
    msg = mem.step(np.array([1.0, -5.0, 2.0, 0.5, 3.0]))
    assert msg.indices.tolist() == [1, 4] and not mem.residual.any()


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
    for bad in ("topk", "topk:2", "qsgd:4", "bogus", 3):
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
