"""Float32 end to end: a float32 model (``sgd_shm.torch.TorchModel``) keeps every
buffer of ``ps.train`` and ``eager.train`` in float32 (the store's weights, the
workers' pulled copies and gradients, messages, error-feedback memory, collective
buffers, checkpoints, ``coef_``), and the bytes the runs count are 4 per value; the
kit's own models stay float64.

Oracles (tests/naive.py): ``store_pushes_naive`` (the store's update rule written out
in the weights' float type), ``topk_feedback_naive`` (TopK with error feedback in the
gradients' float type), ``eager_sparse_mean_sgd_naive`` (replicas applying the mean
message), ``torch_sgd_naive`` (serial ``torch.optim.SGD``), ``error_feedback_naive``
(replayed error feedback). Float64 runs equal to before are the older oracle tests
(tests/test_ps_*.py, tests/test_eager*.py, tests/test_compress*.py, ...)."""
from __future__ import annotations

import copy
import json
import os
import pickle

import multiprocess as mp
import numpy as np
import pytest
from naive import (
    eager_sparse_mean_sgd_naive,
    error_feedback_naive,
    store_pushes_naive,
    topk_feedback_naive,
)

from sgd_shm import eager, ps
from sgd_shm.compress import (
    QSGD,
    Dense,
    RandomK,
    TopK,
    add_packed,
    pack,
    packed_size,
    unpack,
)
from sgd_shm.models import SoftmaxRegression
from sgd_shm.ps import shm_backend
from sgd_shm.ps.checkpoint import load_checkpoint
from sgd_shm.ps.store import ParameterStore

F32 = np.dtype(np.float32)
#: |coef_ - serial torch.optim.SGD| after one epoch of 19 steps: a few float32 ulps of
#: weights of magnitude <= 1 (the trainers round w - lr * g once per step, torch in its
#: own order of operations)
ATOL_SGD = 1e-6


# ---- the store in float32 ----------------------------------------------------------------
def test_store_keeps_float32_weights_and_applies_pushes_in_them():
    """Dense, partial and sparse pushes on float32 weights: the weights stay float32
    and equal the store's rule written out; a dense push counts 4 bytes a weight."""
    n, rng = 37, np.random.default_rng(0)               # odd: the words after stay aligned
    w0 = rng.standard_normal(n).astype(np.float32)
    with ParameterStore(n, n_shards=3, n_workers=2, shared=False, init=w0,
                        dtype=np.float32) as s:
        assert s.dtype == F32 and s.weights.dtype == F32 and s.dense_bytes == 4 * n
        w, v = s.pull(worker=0)
        assert w.dtype == F32 and np.array_equal(w, w0)
        g = rng.standard_normal(n).astype(np.float32)
        idx = np.array([1, 5, 20, 36])
        vals = rng.standard_normal(4).astype(np.float32)
        s.push(g, v, lr=0.3, worker=0)
        s.push(g, v, lr=0.1, worker=1, scale=0.5, shards=[0, 2])
        s.push_sparse(idx, vals, v, lr=0.7, worker=0)
        part = np.zeros(n, np.float32)
        part[s.bounds[0]:s.bounds[1]] = g[s.bounds[0]:s.bounds[1]]
        part[s.bounds[2]:] = g[s.bounds[2]:]
        want = store_pushes_naive(w0, [(None, g, 0.3), (None, part, 0.1 * 0.5),
                                       (idx, vals, 0.7)])
        np.testing.assert_array_equal(s.weights, want)
        assert s.slot(0)["bytes_dense"] == 2 * 4 * n and s.slot(1)["bytes_dense"] == 4 * n
        assert s.slot(0)["bytes_sent"] == 4 * n + 4 * 8 + 4 * 4     # int64 indices, f32
        snap, vers, version = s.snapshot()
        assert snap.dtype == F32 and version == 3
        s.restore(w0, vers, version, slack=s.slack)
        np.testing.assert_array_equal(s.weights, w0)
        with pytest.raises(ValueError, match="float32"):
            s.pull(out=np.empty(n))
        assert s._check()


def _push_in_child(store, g):
    w, v = store.pull(worker=1)
    store.push(g, v, lr=1.0, worker=1)
    return str(w.dtype)


def test_shared_float32_store_reattaches_as_float32(no_shm_leak):
    """A shared float32 store pickles as a handle: a worker process maps float32
    weights and its pushes land in them."""
    g = np.arange(10, dtype=np.float32)
    with ParameterStore(10, n_shards=2, n_workers=2, dtype="float32") as s:
        with pickle.loads(pickle.dumps(s)) as other:
            assert other.dtype == F32 and other.weights.dtype == F32
        with mp.get_context("fork").Pool(1) as pool:
            assert pool.apply(_push_in_child, (s, g)) == "float32"
        np.testing.assert_array_equal(s.weights, -g)
        assert s.slot(1)["bytes_sent"] == 40


@pytest.mark.parametrize("dtype", [np.int32, np.float16, None, "nonsense"])
def test_store_rejects_other_dtypes(dtype):
    with pytest.raises(TypeError, match="dtype"):
        ParameterStore(4, n_shards=1, shared=False, dtype=dtype)


def test_store_default_is_float64():
    with ParameterStore(4, n_shards=1, shared=False) as s:
        assert s.dtype == np.float64 and s.weights.dtype == np.float64
        assert s.dense_bytes == 32


# ---- messages and error feedback in float32 ------------------------------------------------
@pytest.mark.parametrize("comp", [TopK(ratio=0.05), QSGD(levels=16),
                                  RandomK(k=7, rescale=True), Dense()], ids=repr)
def test_pack_float32_round_trip(comp):
    """A float32 message packs into a float32 buffer (at any offset, as eager-SGD's
    payload after its vote) and unpacks bit for bit: values float32, the decoding scale
    exact (its float64 bytes travel in the header), 4 bytes an element."""
    n = 1000
    g = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    msg = comp.compress(g)
    m = msg.indices.size
    assert msg.values.dtype == F32
    assert packed_size(m, n, np.float32) == 6 + m + m           # header, int32 idx, values
    assert packed_size(m, n) == 3 + -(-m // 2) + m               # float64: as it was
    buf = np.full(packed_size(m, n, np.float32) + 1, np.nan, np.float32)
    assert pack(msg, buf[1:]) == buf.size - 1
    back = unpack(buf[1:], n)
    assert back.values.dtype == F32 and back.nbytes == 4 * (buf.size - 1)
    np.testing.assert_array_equal(back.indices, msg.indices)
    np.testing.assert_array_equal(back.values, msg.values)
    assert back.scale == msg.scale                               # e.g. 1000 / 7, unrounded
    np.testing.assert_array_equal(add_packed(buf[1:], n, np.zeros(n, np.float32)),
                                  msg.to_dense(np.float32))
    with pytest.raises(ValueError, match="float64 or float32"):
        pack(msg, np.zeros(buf.size, np.int64))


@pytest.mark.parametrize("comp", [TopK(k=40), QSGD(levels=64, error_feedback=True)],
                         ids=repr)
def test_error_feedback_conserves_mass_in_float32(comp):
    """A float32 memory: residual and messages float32; the replayed residual equals
    the memory's bit for bit, and sent + residual = the gradients' sum to float32
    rounding (one rounding of acc_t = r_t + g_t, and of the residual, per step)."""
    n, T = 1000, 30
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(T)]
    mem = comp.memory(n, np.float32)
    assert mem.residual.dtype == F32
    sents = []
    for g in grads:
        msg = mem.step(g)
        assert msg.values.dtype == F32
        sents.append(msg.to_dense(np.float32))
        assert mem.residual.dtype == F32
    total, acc = error_feedback_naive(grads, sents)
    resid = acc[-1] - sents[-1]                                  # float32, as the memory
    np.testing.assert_array_equal(mem.residual, resid)
    mass = total + mem.residual.astype(np.float64)
    bound = 2 * T * np.finfo(np.float32).eps * max(np.abs(a).max() for a in acc)
    assert np.abs(mass - np.sum(grads, axis=0, dtype=np.float64)).max() <= bound
    if isinstance(comp, TopK):                                   # values travel verbatim
        want, last = topk_feedback_naive(grads, 40)
        np.testing.assert_array_equal(mem.residual, last)
        for s, (idx, vals) in zip(sents, want):
            np.testing.assert_array_equal(s[idx], vals)


# ---- the trainers on a float32 model -------------------------------------------------------
torch_needed = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def digits():
    from sgd_shm.data import load_digits_split
    X, Xte, y, yte = load_digits_split(0.2, random_state=0)
    return X[:600], Xte, y[:600], yte


def _recording(module, log, **kw):
    """A TorchModel whose every gradient call appends to ``log`` (a JSON line: the
    float types and layout of the buffers the trainer passed, the rows) and to
    ``log.<pid>`` (the gradient's bytes): forked workers and ranks write them too."""
    from sgd_shm.torch import TorchModel

    class Recording(TorchModel):
        def grad(self, w, data, rows, grad, block=None):
            super().grad(w, data, rows, grad, block)
            rec = {"w": str(w.dtype), "g": str(grad.dtype), "pid": os.getpid(),
                   "flat": bool(w.flags.c_contiguous and grad.flags.c_contiguous
                                and grad.flags.writeable and w.shape == grad.shape
                                == (self.n_params,)),
                   "rows": np.asarray(rows).tolist()}
            with open(self.log, "a") as f:
                f.write(json.dumps(rec) + "\n")
            with open(f"{self.log}.{os.getpid()}", "ab") as f:
                f.write(np.ascontiguousarray(grad).tobytes())

    m = Recording(module, **kw)
    m.log = str(log)
    return m


def _records(log, n_params):
    """(the JSON records, {pid: the gradients it computed, in order})."""
    with open(log) as f:
        recs = [json.loads(line) for line in f]
    grads = {}
    for pid in {r["pid"] for r in recs}:
        raw = np.fromfile(f"{log}.{pid}", dtype=np.float32)
        grads[pid] = list(raw.reshape(-1, n_params))
    return recs, grads


def _store_recorder(monkeypatch):
    """Record the float type of the weights of every ParameterStore (the run's and
    the kernels' warm-up scratch store) and of every model-averaging Mailbox the shm
    and threads backends make."""
    made = []

    class Store(ParameterStore):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self.weights.dtype)

    class Mailbox(shm_backend.Mailbox):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self.box.dtype)
    monkeypatch.setattr(shm_backend, "ParameterStore", Store)
    monkeypatch.setattr(shm_backend, "Mailbox", Mailbox)
    return made


def _all_float32(recs):
    return all(r["w"] == r["g"] == "float32" and r["flat"] for r in recs)


def _only(made, dtype):
    return len(made) >= 2 and all(d == dtype for d in made)


@torch_needed
@pytest.mark.parametrize("backend", ["shm", "threads"])
def test_ps_one_worker_keeps_float32_and_equals_serial_torch_sgd(digits, backend, tmp_path,
                                                                 monkeypatch, no_shm_leak):
    """ps.train on a TorchModel: the store's weights float32, every gradient call
    given float32 flat buffers (used in place by the adapter: no float64 copy a step),
    coef_ and the checkpoint float32, 4 bytes a weight a push; one worker equals serial
    float32 torch.optim.SGD on the same minibatches; a run resumes from the
    checkpoint in float32."""
    from naive import torch_sgd_naive

    from sgd_shm.torch import DigitsCNN
    X, _, y, _ = digits
    made = _store_recorder(monkeypatch)
    net = DigitsCNN(seed=4)
    start = copy.deepcopy(net)
    model = _recording(net, tmp_path / "log")
    ck = tmp_path / "ck.npz"
    r = ps.train(X, y, model=model, n_workers=1, policy="asp", epochs=1, lr=0.1,
                 batch_size=32, n_shards=4, seed=2, backend=backend, checkpoint=ck,
                 progress=False)
    recs, _ = _records(tmp_path / "log", model.n_params)
    assert _only(made, F32) and r.coef_.dtype == F32
    assert _all_float32(recs) and len(recs) == 1 + r.updates == 20     # warm-up + 19
    assert r.bytes_sent == r.bytes_dense == 4 * model.n_params * r.updates
    batches = [np.array(rec["rows"]) for rec in recs[1:]]
    want = torch_sgd_naive(start, X, y, batches, lr=0.1)
    np.testing.assert_allclose(r.coef_, want, rtol=0, atol=ATOL_SGD)
    saved = load_checkpoint(ck)["weights"]
    assert saved.dtype == F32
    np.testing.assert_array_equal(saved, r.coef_)
    more = ps.train(X, y, model=model, n_workers=1, policy="asp", epochs=1, lr=0.1,
                    batch_size=32, n_shards=4, seed=3, backend=backend, resume=ck,
                    progress=False)
    assert more.coef_.dtype == F32 and more.updates > r.updates and _only(made, F32)


@torch_needed
def test_ps_topk_float32_equals_replayed_error_feedback(digits, tmp_path, no_shm_leak):
    """TopK with error feedback on a float32 model, one worker: its messages are the
    written-out TopK of (its float32 gradients + residual), the weights are the store's
    rule applied to them in float32, bit for bit, and each push counts 8 bytes an entry
    (int32 index, float32 value)."""
    from sgd_shm.torch import DigitsCNN
    X, _, y, _ = digits
    model = _recording(DigitsCNN(seed=1), tmp_path / "log")
    w0 = model.init(None).astype(np.float32)
    r = ps.train(X, y, model=model, n_workers=1, policy="asp", epochs=1, lr=0.1,
                 batch_size=32, n_shards=4, seed=0, backend="threads",
                 compress=TopK(k=137), progress=False)
    recs, grads = _records(tmp_path / "log", model.n_params)
    assert _all_float32(recs)
    g = grads[os.getpid()][1:]                                   # after the warm-up's
    assert len(g) == r.updates == 19
    sent, _ = topk_feedback_naive(g, 137)
    want = store_pushes_naive(w0, [(idx, vals, 0.1) for idx, vals in sent])
    np.testing.assert_array_equal(r.coef_, want)
    assert r.bytes_sent == 19 * 137 * 8
    assert r.bytes_dense == 19 * 4 * model.n_params


@torch_needed
@pytest.mark.parametrize("kw", [dict(policy="rps", drop=0.2, n_shards=4),
                                dict(policy="asp", drop=0.2, n_shards=4),
                                dict(policy="asp", partition="blocks"),
                                dict(policy="ssp", compress="qsgd:64")],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_ps_every_path_keeps_float32(digits, kw, tmp_path, monkeypatch, no_shm_leak):
    """Model averaging (its mailbox and averages), lossy links (the workers' views),
    block pushes and QSGD messages on a float32 model, two worker processes: every
    gradient call gets float32 buffers, coef_ is float32, and the bytes count 4 a
    value (a round or a dense push: 4 * n_params; a block: 4 a weight + 16)."""
    from sgd_shm.torch import DigitsCNN
    X, _, y, _ = digits
    made = _store_recorder(monkeypatch)
    model = _recording(DigitsCNN(seed=0), tmp_path / "log")
    # lr 0.05 for 3 epochs: at 0.1 for 2 a stale, quantized run now and then ended above
    # its first sampled loss
    r = ps.train(X, y, model=model, n_workers=2, epochs=3, lr=0.05, batch_size=32, seed=0,
                 progress=False, **kw)
    recs, _ = _records(tmp_path / "log", model.n_params)
    assert _only(made, F32) and r.coef_.dtype == F32 and _all_float32(recs)
    pushes = sum(w["pushes"] for w in r.workers)
    assert r.bytes_dense == 4 * model.n_params * pushes
    if "compress" not in kw and "partition" not in kw:
        assert r.bytes_sent == r.bytes_dense
    if "partition" in kw:
        bounds, owners = model.blocks(2)
        sizes = {int(bounds[b + 1] - bounds[b]) * 4 + 16 for o in owners for b in o}
        assert r.bytes_sent <= max(sizes) * pushes and r.bytes_sent >= min(sizes) * pushes
    assert np.isfinite(r.coef_).all() and r.final_loss < r.history[0]["loss"]


@torch_needed
def test_eager_one_rank_keeps_float32_and_equals_serial_torch_sgd(digits, tmp_path,
                                                                  no_shm_leak):
    """eager.train on a TorchModel: the rank's gradient lands straight in the float32
    collective buffer, coef_ float32, 4 bytes a value; one rank equals serial float32
    torch.optim.SGD on its minibatches."""
    from naive import torch_sgd_naive

    from sgd_shm.torch import DigitsCNN
    X, _, y, _ = digits
    net = DigitsCNN(seed=5)
    start = copy.deepcopy(net)
    model = _recording(net, tmp_path / "log")
    r = eager.train(X, y, model=model, n_workers=1, epochs=1, lr=0.05, batch_size=32,
                    seed=3, sample_every=10.0, progress=False)
    recs, _ = _records(tmp_path / "log", model.n_params)
    assert r.coef_.dtype == F32 and _all_float32(recs) and r.rounds == 19
    d = model.n_params
    assert r.bytes_sent == r.bytes_dense == 19 * 4 * d and r.bytes_moved == 19 * 4 * (d + 1)
    batches = [np.array(rec["rows"]) for rec in recs[1:]]       # after the warm-up's
    want = torch_sgd_naive(start, X, y, batches, lr=0.05)
    np.testing.assert_allclose(r.coef_, want, rtol=0, atol=ATOL_SGD)


@torch_needed
def test_eager_topk_float32_equals_replayed_sparse_mean_sgd(digits, tmp_path, no_shm_leak):
    """Two ranks, sync, TopK with error feedback on a float32 model: each rank's
    messages are the written-out TopK of its float32 gradients + residual, the
    replicas apply their mean in float32 bit for bit, and the bytes are float32's
    (8 an entry sent; 4 an element of the gathered payloads)."""
    torch = pytest.importorskip("torch")
    X, _, y, _ = digits
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 10))
    model = _recording(net, tmp_path / "log", input_shape=(1, 8, 8))
    w0, k = model.init(None).astype(np.float32), 50
    r = eager.train(X, y, model=model, n_workers=2, epochs=2, lr=0.2, batch_size=16,
                    seed=1, compress=TopK(k=k), sample_every=10.0, progress=False)
    recs, grads = _records(tmp_path / "log", model.n_params)
    assert r.replicas_equal and r.coef_.dtype == F32 and _all_float32(recs)
    per_rank = [None, None]
    for pid, gs in grads.items():
        rows = [rec["rows"] for rec in recs if rec["pid"] == pid]
        if pid != os.getpid():                                   # a rank, not the warm-up
            per_rank[rows[0][0] % 2] = gs
    assert all(len(gs) == r.rounds for gs in per_rank)
    sent = [topk_feedback_naive(gs, k)[0] for gs in per_rank]
    want = eager_sparse_mean_sgd_naive(w0, list(zip(*sent)), 0.2)
    np.testing.assert_array_equal(r.coef_, want)
    assert r.bytes_sent == r.rounds * 2 * 8 * k
    assert r.bytes_moved == r.rounds * 2 * 4 * (1 + packed_size(k, model.n_params, F32))
    assert r.bytes_dense == r.rounds * 2 * 4 * model.n_params


@torch_needed
def test_ps_float32_on_ray(digits, local_ray):
    """On Ray, node-local (asp) and actor servers (rps with loss): the shard actors and
    global servers hold float32 weights (coef_ is their concatenation) and the hub
    counts 4 bytes a weight."""
    from sgd_shm.torch import DigitsCNN, TorchModel
    X, _, y, _ = digits
    for kw in (dict(policy="asp"), dict(policy="rps", drop=0.1, n_shards=4)):
        model = TorchModel(DigitsCNN(seed=0))
        # lr 0.05 for 3 epochs, as on shared memory: 20 steps at 0.1 sometimes ended above
        # the first sampled loss
        r = ps.train(X, y, model=model, n_workers=2, backend="ray", lr=0.05, batch_size=32,
                     epochs=3, seed=0, progress=False, **kw)
        assert r.backend == "ray" and r.coef_.dtype == F32, kw
        pushes = sum(w["pushes"] for w in r.workers)
        assert r.bytes_dense == 4 * model.n_params * pushes, kw
        assert np.isfinite(r.coef_).all() and r.final_loss < r.history[0]["loss"], kw


# ---- the kit's models stay float64; other float types are refused -------------------------
def test_kit_models_keep_float64_buffers(monkeypatch):
    from sklearn.datasets import make_classification
    X, y = make_classification(200, 8, n_informative=4, n_classes=3, random_state=0)
    made = _store_recorder(monkeypatch)
    r = ps.train(X, y, model=SoftmaxRegression(8, 3), n_workers=1, epochs=1, policy="asp",
                 backend="threads", progress=False)
    assert _only(made, np.float64) and r.coef_.dtype == np.float64
    assert r.bytes_dense == 8 * 27 * r.updates
    e = eager.train(X, y, model=SoftmaxRegression(8, 3), n_workers=1, epochs=1,
                    progress=False)
    assert e.coef_.dtype == np.float64 and e.bytes_dense == 8 * 27 * e.rounds


class _Half(SoftmaxRegression):
    dtype = np.float16


@pytest.mark.parametrize("train", [ps.train, eager.train], ids=["ps", "eager"])
def test_model_dtype_other_than_float32_or_float64_is_a_type_error(train):
    X, y = np.random.default_rng(0).standard_normal((40, 4)), np.arange(40) % 3
    with pytest.raises(TypeError, match=r"model\.dtype: must be np\.float32 or np\.float64"):
        train(X, y, model=_Half(4, 3), n_workers=1, epochs=1, progress=False)


class _WideF32(SoftmaxRegression):
    dtype = np.float32


def test_eager_refuses_a_float32_gather_past_its_count_limit():
    """Shared memory gathers float32 payloads below 2**24 elements: a dense-sized
    message on 2**23 float32 weights is refused up front, naming compress and the
    fix; a sparse one on the same model passes that check (and fails on the data)."""
    model = _WideF32(2 ** 22, 2)
    X, y = np.zeros((2, 3)), np.array([0, 1])
    with pytest.raises(ValueError, match=r"compress: Dense\(\) sends up to 8388610 .*"
                                         r"below 2\*\*24 elements"):
        eager.train(X, y, model=model, n_workers=2, compress="dense", progress=False)
    with pytest.raises(ValueError, match="n_features"):
        eager.train(X, y, model=model, n_workers=2, compress="topk:0.01", progress=False)
