"""The compressor contract (GRACE's three roles): a user's Compressor subclass trains
in both trainers with no change to the kit, every compressor runs on eager-SGD (its
messages travel by a real allgather), the wire format is bit-exact, and a compressor
that breaks the contract fails with a clear error."""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from sklearn.model_selection import train_test_split

from sgd_shm import eager, ps
from sgd_shm.compress import (QSGD, Channel, Compressor, Dense, ErrorFeedback, RandomK,
                              SparseMessage, ThresholdTopK, TopK, add_packed,
                              make_compressor, pack, packed_size, unpack)
from sgd_shm.data import make_rcv1_like
from tests.naive import topk_feedback_sgd_naive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ScaledSign(Compressor):
    """Scaled sign-SGD (Bernstein et al. 2018; Karimireddy et al. 2019 with error
    feedback): every entry's sign, decoded with the mean magnitude; one bit per entry
    plus the scale on the wire."""

    def compress(self, g):
        idx = np.arange(g.size, dtype=np.int32)
        return SparseMessage(idx, np.sign(g), g.size, -(-g.size // 8) + 8,
                             float(np.abs(g).mean()))


@pytest.fixture(scope="module")
def split():
    X, y = make_rcv1_like(1500, 40, random_state=3)
    return train_test_split(X, y, test_size=0.3, random_state=0)


def _majority(y):
    return max(np.mean(y == c) for c in np.unique(y))


def test_user_compressor_trains_in_both_trainers(split):
    Xtr, Xte, ytr, yte = split
    assert make_compressor(ScaledSign()).__class__ is ScaledSign     # no whitelist
    base = _majority(yte)
    kw = dict(n_workers=2, compress=ScaledSign(), epochs=3, max_seconds=60,
              progress=False, eval_set=(Xte, yte))
    r_ps = ps.train(Xtr, ytr, **kw)
    r_eager = eager.train(Xtr, ytr, **kw)
    for r in (r_ps, r_eager):
        assert r.val_score > base + 0.05, (r.val_score, base)
        assert r.final_loss < 0.9 * math.log(2)
        assert r.compress == "ScaledSign()"
    # the bytes each applied message cost: n/8 + 8 per message, as the subclass says
    assert r_eager.bytes_sent > 0 and r_eager.bytes_sent % (-(-Xtr.shape[1] // 8) + 8) == 0
    assert r_eager.replicas_equal


@pytest.mark.parametrize("comp", [TopK(ratio=0.1), RandomK(ratio=0.1),
                                  ThresholdTopK(ratio=0.1), QSGD(levels=4), Dense(),
                                  ScaledSign()], ids=repr)
@pytest.mark.parametrize("collective", ["sync", "solo"])
def test_every_compressor_runs_on_eager(split, comp, collective):
    Xtr, Xte, ytr, yte = split
    r = eager.train(Xtr, ytr, n_workers=2, collective=collective, compress=comp, epochs=2,
                    max_seconds=60, progress=False, eval_set=(Xte, yte),
                    imbalance=(1, 0.001) if collective == "solo" else None)
    assert r.replicas_equal                  # every replica decoded the same parts
    assert r.final_loss < math.log(2)
    assert r.val_score > _majority(yte)
    assert 0 < r.bytes_sent and r.bytes_moved > 0


@pytest.mark.parametrize("P", [1, 2, 3])
def test_eager_topk_equals_serial_oracle(P):
    """Sync rounds, TopK with error feedback: every rank's message reaches every rank
    through the allgather; the weights equal a serial replay (independent top-k and
    residuals) to rounding."""
    X, y = make_rcv1_like(600, 40, random_state=3)
    ys = np.where(y == np.unique(y)[1], 1.0, -1.0)
    b, epochs, lr, alpha, k = 16, 2, 0.7, 1e-3, 5
    r = eager.train(X, y, n_workers=P, collective="sync", epochs=epochs, batch_size=b,
                    lr=lr, alpha=alpha, max_seconds=60, seed=5, progress=False,
                    compress=TopK(k=k))
    steps = math.ceil(epochs * X.shape[0] / (P * b))
    from tests.naive import eager_round_batches
    want = topk_feedback_sgd_naive(X, ys, eager_round_batches(X.shape[0], P, b, 5, steps), lr,
                                   alpha, k)
    np.testing.assert_allclose(r.coef_, want, rtol=1e-10, atol=1e-12)
    # k int32 indices + k float64 values per message, every message applied
    assert r.bytes_sent == steps * P * 12 * k


def test_wire_format_is_bit_exact():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 500))
        m = int(rng.integers(0, n + 1))
        idx = np.sort(rng.choice(n, m, replace=False)).astype(np.int32)
        vals = rng.standard_cauchy(m) * 10.0 ** rng.integers(-300, 300, m)
        msg = SparseMessage(idx, vals, n, 123, float(rng.normal()))
        buf = np.full(packed_size(m, n) + 3, np.nan)
        used = pack(msg, buf)
        assert used == packed_size(m, n)
        got = unpack(buf, n)
        assert got.indices.tobytes() == idx.tobytes()
        assert got.values.tobytes() == vals.tobytes() and got.scale == msg.scale
    with pytest.raises(ValueError, match="at least"):
        pack(msg, np.zeros(1))


@pytest.mark.parametrize("head, why", [
    ([7.0, 7.0, 7.0], r"entries 7.0, index width 7.0"),          # no such width
    ([-3.0, 1.0, 4.0], r"entries -3.0"),
    ([11.0, 1.0, 4.0], r"entries 11.0"),                          # more entries than n
    ([np.nan, 1.0, 4.0], r"entries nan"),
    ([3.0, np.inf, 4.0], r"entries 3.0, index width 4.0, scale inf"),
    ([9.0, 1.0, 4.0], r"9 entries need 17 elements"),             # past the buffer's end
])
def test_unpack_refuses_what_pack_did_not_write(head, why):
    """A buffer pack() did not fill (or read with another n) is refused by name before
    anything is decoded: it gave messages whose indices and values had different
    lengths, indices of raw float bits, or a negative byte count."""
    buf = np.zeros(12)
    buf[:3] = head
    for read in (unpack, lambda b, n: add_packed(b, n, np.zeros(n))):
        with pytest.raises(ValueError, match=r"buf \(12 float64 elements\) does not hold a "
                                             r"message pack\(\) wrote for n=10 weights \("
                                             + why):
            read(buf, 10)
    buf[:6] = [3.0, 1.0, 4.0, 0.0, 0.0, 0.0]          # three index 0s: not ascending
    with pytest.raises(ValueError, match="indices are not ascending in"):
        unpack(buf, 10)
    buf[3:5] = np.array([[-1, 2], [3, 0]], np.int32).view(np.float64).ravel()
    with pytest.raises(ValueError, match=r"its indices are not in \[0, n\)"):
        add_packed(buf, 10, np.zeros(10))              # (-1 added to out[-1] before)
    with pytest.raises(ValueError, match="too short for the header"):
        unpack(np.zeros(2), 10)
    with pytest.raises(TypeError, match="buf must be the numpy array"):
        unpack([3.0, 1.0, 4.0], 10)
    with pytest.raises(ValueError, match="n must be the message's dense length"):
        unpack(buf, 0)
    with pytest.raises(TypeError, match="n must be the message's dense length"):
        unpack(buf, 10.0)


def test_channel_keeps_lost_messages_only_when_asked():
    g = np.array([3.0, -1.0, 0.5, 2.0])
    for keep in (True, False):
        ch = Channel(TopK(k=1), 4, keep_lost=keep)
        msg = ch.message(g)
        np.testing.assert_array_equal(msg.indices, [0])
        ch.delivered(msg, applied=False)
        want = g if keep else np.array([0.0, -1.0, 0.5, 2.0])
        np.testing.assert_array_equal(ch.memory.residual, want)
        assert ch.bytes_sent == 0
        ch.delivered(ch.message(np.zeros(4)), applied=True)
        assert ch.bytes_sent == 12


class _Unsorted(Compressor):
    def compress(self, g):
        return SparseMessage(np.array([2, 0]), g[[2, 0]], g.size, 24)


class _WrongN(Compressor):
    def compress(self, g):
        return SparseMessage(np.array([0]), g[:1], g.size + 1, 12)


class _NotAMessage(Compressor):
    def compress(self, g):
        return {"indices": [0], "values": g[:1]}


class _Overflowing(Compressor):
    """Claims messages of at most 1 entry and sends 3."""

    def max_entries(self, n):
        return 1

    def compress(self, g):
        return SparseMessage(np.arange(3, dtype=np.int32), g[:3].copy(), g.size, 36)


def test_contract_violations_are_clear_errors(split):
    g = np.arange(4.0)
    with pytest.raises(ValueError, match="ascending"):
        _Unsorted().memory(4).step(g)
    with pytest.raises(ValueError, match="n=4"):
        _WrongN().memory(4).step(g)
    with pytest.raises(TypeError, match="SparseMessage"):
        _NotAMessage().memory(4).step(g)
    # the message's parts: lists, a NaN or string scale, a bad byte count, NaN values
    # (an AttributeError, numpy's words, or a divergence blamed on the step before)
    for kw, err, match in ((dict(indices=[0]), TypeError, "numpy arrays"),
                           (dict(scale=float("nan")), ValueError, "scale must be a finite"),
                           (dict(scale="2"), ValueError, "scale must be a finite"),
                           (dict(nbytes="many"), ValueError, "nbytes .* an int >= 0"),
                           (dict(values=np.array([np.nan])), ValueError, "values hold NaN")):
        parts = dict(indices=np.array([0]), values=np.array([1.0]), n=4, nbytes=12, scale=1.0)
        parts.update(kw)
        bad = type("Bad", (Compressor,), {"compress": lambda self, g, p=parts: SparseMessage(**p)})
        with pytest.raises(err, match=match):
            bad().memory(4).step(g)
    with pytest.raises(ValueError, match="4 entries"):
        TopK(k=1).memory(4).step(np.zeros(5))          # was a raw broadcast error
    with pytest.raises(TypeError, match="abstract"):
        type("NoCompress", (Compressor,), {})()
    with pytest.raises(ValueError, match="compress"):
        make_compressor(object())
    Xtr, _, ytr, _ = split
    with pytest.raises(Exception, match="ascending"):
        eager.train(Xtr, ytr, n_workers=2, compress=_Unsorted(), epochs=1,
                    max_seconds=30, progress=False)
    with pytest.raises(Exception, match="max_entries"):
        eager.train(Xtr, ytr, n_workers=2, compress=_Overflowing(), epochs=1,
                    max_seconds=30, progress=False)
    # a max_entries that is no count (int() of "abc" or None, or a negative bound that
    # sized the exchange below zero, before)
    for bound in ("abc", None, -3, 2.5, True):
        bad = type("BadBound", (TopK,), {"max_entries": lambda self, n, b=bound: b})(k=1)
        with pytest.raises(ValueError, match=r"BadBound.max_entries\(\d+\) must return an "
                                             r"int >= 0 .*got " + re.escape(repr(bound))):
            eager.train(Xtr, ytr, n_workers=2, compress=bad, epochs=1, max_seconds=30,
                        progress=False)


def test_error_feedback_conserves_mass_for_a_user_compressor():
    """sent + residual == every gradient so far (ScaledSign's error is the residual)."""
    rng = np.random.default_rng(1)
    mem = ErrorFeedback(ScaledSign(), 50)
    total, sent = np.zeros(50), np.zeros(50)
    for _ in range(20):
        g = rng.normal(size=50)
        total += g
        mem.step(g).add_to(sent)
    np.testing.assert_allclose(sent + mem.residual, total, rtol=0, atol=1e-12)


SCRIPT = r'''
import sys
import numpy as np
sys.path.insert(0, {root!r})
from mpi4py import MPI
from sgd_shm import eager
from sgd_shm.data import make_rcv1_like
from tests.test_compress_roles import ScaledSign
X, y = make_rcv1_like(1500, 40, random_state=3)
r = eager.train(X[:1000], y[:1000], n_workers=None, backend="mpi", collective="solo",
                compress=ScaledSign(), epochs=2, max_seconds=60, progress=False,
                eval_set=(X[1000:], y[1000:]))
if MPI.COMM_WORLD.Get_rank() == 0:
    print("RESULT", r.val_score, r.replicas_equal, r.final_loss, r.bytes_sent)
'''


def test_user_compressor_trains_on_mpi(tmp_path):
    pytest.importorskip("mpi4py")
    exe = shutil.which("mpiexec") or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(exe):
        pytest.skip("no mpiexec")
    script = tmp_path / "user_compressor.py"
    script.write_text(SCRIPT.format(root=ROOT))
    p = subprocess.run([exe, "-n", "2", sys.executable, str(script)], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT"))
    score, equal, loss, sent = line.split()[1:]
    assert equal == "True" and float(loss) < math.log(2) and int(sent) > 0
    assert float(score) > 0.8
