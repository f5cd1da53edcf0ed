"""The eager-SGD trainer (sgd_shm.eager): exactness of synchronous data-parallel SGD
against a serial oracle, the partial collectives' runs (replicas equal, participation),
the shared-seed imbalance draw, faults, bad input, the command line (shm and MPI)."""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import new_segments, shm_names
from sgd_shm.collectives import RankFailure
from sgd_shm.data import make_rcv1_like
from sgd_shm.eager import sleepers, train
from tests.naive import data_parallel_sgd_naive, eager_round_batches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def problem():
    X, y = make_rcv1_like(600, 40, random_state=3)
    return X, y


@pytest.mark.parametrize("P", [1, 2, 3])
def test_sync_equals_serial_oracle(problem, P):
    X, y = problem
    ys = np.where(y == np.unique(y)[1], 1.0, -1.0)
    b, epochs, lr, alpha = 16, 2, 0.7, 1e-3
    r = train(X, y, n_workers=P, collective="sync", epochs=epochs, batch_size=b, lr=lr,
              alpha=alpha, max_seconds=60, seed=5, progress=False)
    steps = math.ceil(epochs * X.shape[0] / (P * b))
    assert r.rounds == steps
    want = data_parallel_sgd_naive(X, ys, eager_round_batches(X.shape[0], P, b, 5, steps), lr,
                                   alpha)
    np.testing.assert_allclose(r.coef_, want, rtol=1e-10, atol=1e-12)
    assert r.replicas_equal and r.participation == [1.0] * P and r.late == [0] * P
    assert r.mean_contributors == P


@pytest.mark.parametrize("collective", ["solo", "majority"])
@pytest.mark.parametrize("late", ["carry", "drop"])
def test_partial_collectives_train(problem, collective, late):
    X, y = problem
    r = train(X, y, n_workers=3, collective=collective, late=late, imbalance=(1, 0.002),
              max_seconds=0.6, lr=2.0, seed=1, progress=False)
    assert r.replicas_equal                     # every rank applied every round alike
    assert r.rounds > 20
    assert r.history[0]["loss"] == pytest.approx(math.log(2))
    assert r.final_loss < 0.9 * math.log(2)
    # a rank's gradient is in some rounds and not in others
    assert all(0 < p < 1 for p in r.participation)
    assert sum(r.late) > 0
    assert 1 <= r.mean_contributors < 3
    assert r.score(X, y) > 0.6


def test_stop_at_target_and_time(problem):
    X, y = problem
    r = train(X, y, n_workers=2, collective="solo", target_loss=0.68, max_seconds=30,
              lr=2.0, progress=False)
    assert r.time_to_target is not None and r.seconds < 10
    assert r.time_to(0.68) == r.time_to_target
    r = train(X, y, n_workers=2, collective="sync", max_seconds=0.3, progress=False)
    assert 0.3 <= r.seconds < 5


def test_sleepers_draw():
    draws = [sleepers(7, r, 4, 2) for r in range(4000)]
    assert all(len(set(d)) == 2 and all(0 <= k < 4 for k in d) for d in draws)
    assert sleepers(7, 11, 4, 2) == draws[11]          # every rank draws alike
    counts = np.bincount(np.concatenate(draws), minlength=4)
    # each rank is drawn with probability 1/2: 4000 draws, binomial sd ~32
    assert np.all(np.abs(counts - 2000) < 6 * 32)
    assert sleepers(7, 0, 4, 0) == ()


@pytest.mark.exclusive
def test_delays_and_imbalance_slow_sync(problem):
    X, y = problem
    fast = train(X, y, n_workers=2, collective="sync", max_seconds=0.4, progress=False)
    slow = train(X, y, n_workers=2, collective="sync", max_seconds=0.4, progress=False,
                 imbalance=(1, 0.003), delay=("pareto", 0.001, 2.5))
    assert slow.rounds < fast.rounds


def test_dead_rank_raises_and_leaves_nothing(problem):
    from sgd_shm.models import Linear
    X, y = problem
    before = shm_names()
    parent = os.getpid()

    class Dying(Linear):                   # the forked rank 1 kills itself mid-run
        calls = 0

        def grad(self, w, data, rows, g, block=None):
            if os.getpid() != parent and rows[0] % 3 == 1:   # rank 1 of 3: rows 1, 4, ...
                Dying.calls += 1
                if Dying.calls == 30:
                    os.kill(os.getpid(), signal.SIGKILL)
            super().grad(w, data, rows, g, block)

    with pytest.raises(RankFailure, match="rank 1"):
        train(X, y, n_workers=3, collective="sync", max_seconds=30, progress=False,
              model=Dying(X.shape[1]))
    assert new_segments(before) == set()


@pytest.mark.parametrize("kw, match", [
    ({"collective": "gossip"}, "collective"),
    ({"late": "keep"}, "late"),
    ({"average": "all"}, "average"),
    ({"imbalance": (5, 0.1)}, "imbalance"),
    ({"imbalance": (1, -1)}, "imbalance"),
    ({"imbalance": 3}, "imbalance"),
    ({"delay": ("normal", 1)}, "delay"),
    ({"delay": ("pareto", 0.01, 1.0)}, "delay"),
    ({"n_workers": 0}, "n_workers"),
    ({"max_seconds": 0}, "max_seconds"),
    ({"epochs": -1}, "epochs"),
    ({"lr": float("nan")}, "lr"),
    ({"backend": "ray"}, "backend"),
    ({"comm": object()}, "comm"),
    ({"seed": -2}, "seed"),
    ({"target_loss": "low"}, "target_loss"),
    ({"timeout": 0}, "timeout"),
])
def test_bad_input(problem, kw, match):
    X, y = problem
    with pytest.raises((ValueError, TypeError), match=match):
        train(X, y, **{"n_workers": 2, "progress": False, **kw})


def test_cli_shm(tmp_path):
    p = subprocess.run([sys.executable, "-m", "sgd_shm", "eager", "--seconds", "0.5",
                        "--samples", "3000", "--features", "300", "--target", "0.68",
                        "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "majority" in p.stdout and "speed-up" in p.stdout
    d = json.loads((tmp_path / "eager-main.json").read_text())
    assert set(d["summary"]) == {"sync", "solo", "majority"}
    assert (tmp_path / "eager-main.png").stat().st_size > 1000


def _mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


@pytest.mark.parametrize("P", [2, 4])
def test_cli_mpi(tmp_path, P):
    pytest.importorskip("mpi4py")
    exe = _mpiexec()
    if exe is None:
        pytest.skip("no mpiexec")
    p = subprocess.run([exe, "-n", str(P), sys.executable, "-m", "sgd_shm", "eager",
                        "--backend", "mpi", "--seconds", "0.5", "--samples", "3000",
                        "--features", "300", "--target", "0.68", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    d = json.loads((tmp_path / "eager-main.json").read_text())
    assert d["ranks"] == P
    assert all(o["replicas_equal"] for o in d["summary"].values())


def _run_script_on_two_ranks(tmp_path, text, *args):
    """``text`` as a script run by 2 MPI ranks (skipped without mpi4py or mpiexec)."""
    pytest.importorskip("mpi4py")
    exe = _mpiexec()
    if exe is None:
        pytest.skip("no mpiexec")
    script = tmp_path / "script.py"
    script.write_text(text)
    return subprocess.run([exe, "-n", "2", sys.executable, str(script), *args],
                          capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})


MPI_ARGS = r'''
import numpy as np, sys
from mpi4py import MPI
from sgd_shm import eager
from sgd_shm.collectives.base import CollectiveError
from sgd_shm.data import make_rcv1_like
rank = MPI.COMM_WORLD.Get_rank()
X, y = make_rcv1_like(400, 30 + rank, random_state=0)      # rank 1: one feature more
kw = dict(n_workers=None, backend="mpi", epochs=1, progress=False, timeout=30)
for bad, err in ((dict(comm="world"), TypeError), (dict(comm=MPI.COMM_NULL), TypeError),
                 (dict(n_workers=True), ValueError), (dict(n_workers=2.0), ValueError)):
    try:
        eager.train(X, y, **{**kw, **bad})
    except err as e:
        assert ("comm: must be an mpi4py" in str(e)) or ("n_workers" in str(e)), e
    else:
        raise AssertionError(f"{bad} was accepted")
try:                          # the ranks' models differ (n): refused on every rank
    eager.train(X, y, **kw)
except CollectiveError as e:
    assert "different settings (n: [" in str(e), e
else:
    raise AssertionError("ranks with different features trained")
print("OK rank", rank, flush=True)
'''


def test_mpi_arguments_and_ranks_that_disagree(tmp_path):
    """comm= and n_workers= are checked by name (a string comm raised an
    AttributeError, COMM_NULL became COMM_WORLD, n_workers=True passed); ranks whose
    data have different widths are refused on every rank (they trained, replicas
    differing)."""
    p = _run_script_on_two_ranks(tmp_path, MPI_ARGS)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert p.stdout.count("OK rank") == 2, p.stdout


MPI_ONE_FAILS = r'''
import sys
from mpi4py import MPI
import sgd_shm.eager.__main__ as cli
from sgd_shm.__main__ import build_parser
real = cli.compare
def compare(*a, **k):
    if MPI.COMM_WORLD.Get_rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    return real(*a, **k)
cli.compare = compare
ap = build_parser()[1]["eager"]
args = cli.check(ap, ap.parse_args(["--backend", "mpi", "--seconds", "30", "--samples", "600",
                                    "--features", "50", "--out", sys.argv[1]]))
cli.run(args)
'''


def test_cli_mpi_rank_that_fails_ends_the_job(tmp_path):
    """One rank fails: the command ends the job (MPI_Abort, the rank's traceback on
    stderr) instead of leaving rank 0 in the round's collective forever."""
    p = _run_script_on_two_ranks(tmp_path, MPI_ONE_FAILS, str(tmp_path))
    assert p.returncode != 0
    assert "rank 1 fails on purpose" in p.stderr, p.stderr[-3000:]
    assert not (tmp_path / "eager-main.json").exists()


def test_cli_mpi_compressed(tmp_path):
    """The sparse allgather on MPI: every replica applies the same bits, an epochs
    budget stops the runs at equal work, and a top-1% message is ~1/67 of dense."""
    pytest.importorskip("mpi4py")
    exe = _mpiexec()
    if exe is None:
        pytest.skip("no mpiexec")
    p = subprocess.run([exe, "-n", "2", sys.executable, "-m", "sgd_shm", "eager",
                        "--backend", "mpi", "--seconds", "60", "--epochs", "2",
                        "--samples", "3000", "--features", "500", "--collectives",
                        "sync,solo", "--compress", "topk:0.01", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    d = json.loads((tmp_path / "eager-main.json").read_text())
    assert all(o["replicas_equal"] for o in d["summary"].values())
    sync = d["runs"]["sync"][0]
    assert sync["rounds"] == -(-2 * 3000 // (2 * 64))      # 2 epochs, 128 rows a round
    # 5 entries of 500: 5 int32 indices + 5 float64 values = 60 bytes against 4000
    assert sync["bytes_sent"] * 4000 == sync["bytes_dense"] * 60
    assert sync["final_loss"] < np.log(2.0)


def test_compressed_exchange_with_every_entry_equals_dense(problem):
    from sgd_shm.compress import TopK
    X, y = problem
    kw = dict(n_workers=3, collective="sync", epochs=2, batch_size=16, lr=0.7, seed=2,
              max_seconds=60, progress=False)
    dense = train(X, y, **kw)
    full = train(X, y, compress=TopK(ratio=1.0), **kw)
    np.testing.assert_array_equal(full.coef_, dense.coef_)   # same sums, same order
    assert full.bytes_dense == dense.bytes_dense == dense.bytes_sent


@pytest.mark.parametrize("collective", ["sync", "majority"])
def test_topk_sends_fewer_bytes_and_trains(problem, collective):
    from sgd_shm.compress import TopK
    X, y = problem
    r = train(X, y, n_workers=2, collective=collective, compress="topk:0.05", lr=2.0,
              epochs=3, max_seconds=60, progress=False)
    k = TopK(ratio=0.05).k_for(X.shape[1])
    assert r.replicas_equal and r.final_loss < 0.95 * math.log(2)
    assert 0 < r.bytes_sent <= r.bytes_dense * k * 12 / (8 * X.shape[1]) + 1e-9
    # the gathers carry k-entry messages: a vote, a header, k indices and k values
    assert r.bytes_moved <= 8 * (1 + 3 + k // 2 + 1 + k) * 2 * r.rounds


def test_epochs_run_records_the_final_loss(problem):
    X, y = problem
    r = train(X, y, n_workers=2, epochs=1, lr=1.0, max_seconds=60, progress=False)
    assert r.history[-1]["step"] == r.rounds and r.final_loss < math.log(2)


def test_default_sampling_period_stretches_for_a_costly_record(problem):
    """With sample_every=None rank 0 samples every 0.05 s, or, where a record costs
    more than a tenth of that (a network's forward passes), often enough that records
    take at most a tenth of its time: a model whose loss takes 30 ms (a record: 60 ms,
    training and held-out) gets a record every 0.54 s or more, at most 4 in a 1.5 s run
    beside the first and the last (every 0.05 s it would be about 14), while an explicit
    sample_every is kept as given."""
    import time
    from types import SimpleNamespace

    from sgd_shm.eager.trainer import SAMPLE_EVERY, _period
    from sgd_shm.models import Linear
    X, y = problem
    none, given = SimpleNamespace(sample_every=None), SimpleNamespace(sample_every=0.01)
    assert _period(none, 0.001) == SAMPLE_EVERY and _period(given, 1.0) == 0.01
    assert _period(none, 0.06) == pytest.approx(0.54)

    class SlowLoss(Linear):
        def loss(self, w, data):
            time.sleep(0.03)
            return super().loss(w, data)

    r = train(X, y, n_workers=2, max_seconds=1.5, model=SlowLoss(X.shape[1]),
              eval_set=(X[:100], y[:100]), progress=False)
    gaps = np.diff([h["seconds"] for h in r.history[:-1]])
    assert len(r.history) <= 6 and (gaps >= 0.5).all()
