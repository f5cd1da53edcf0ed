"""``python -m sgd_shm selftest``: a smoke test of every component of an installed kit
(``--only NAMES`` runs some of the checks).

Each check runs a component briefly on a tiny input and asserts a property with an
independent answer (a count, a sequential result, a closed form), so a broken build, a
missing compiled module or a platform that cannot share memory shows up in seconds, from
an installed wheel or sdist with no checkout on the path. It ends by checking that
nothing it made is left in /dev/shm. Exit status 0 when every check passed.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
import warnings

import numpy as np


def _shm_names():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("rlx_")}
    except OSError:
        return set()


def _leaked(name):
    """A kit segment (rlx_<pid>_...) made by this process, or by a process that has
    exited (a worker of a check); segments of other live processes are theirs."""
    pid = name.split("_")[1]
    if not pid.isdigit() or int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def check_multiqueue():
    from relaxed import MultiQueue
    with MultiQueue(10_000, n_queues=4, shared=True, seed=0) as mq:
        mq.push_many(np.arange(1000), np.arange(1000))
        keys, _ = mq.pop_many(1000)
        assert sorted(keys.tolist()) == list(range(1000)) and len(mq) == 0
        mq._check()


def check_multicounter():
    from relaxed import MultiCounter
    c = MultiCounter(16)
    c.increment_many(5000)
    assert c.exact() == 5000 and abs(c.read() - 5000) <= c.error_bound()


def check_greedy():
    import relaxed
    from relaxed.graphs import erdos_renyi
    g = erdos_renyi(2000, 8000, seed=1)
    res = relaxed.greedy_mis(g, seed=3, n_threads=2)
    seq = relaxed.sequential_greedy_mis(g, seed=3)
    assert (np.asarray(res.mask) == np.asarray(seq)).all()
    relaxed.greedy.check_mis(g, res.mask)


def check_stm_and_conflict():
    from relaxed import TL2, conflict
    stm = TL2(10, shared=True, conflict="randomized")
    try:
        def move(tx):
            tx.write(1, tx.read(1) - 3)
            tx.write(2, tx.read(2) + 3)
        stm.atomically(move)
        assert stm.snapshot()[1:3].tolist() == [-3, 3]
    finally:
        stm.close()
    assert 0 <= conflict.policy("randomized", B=1e-6).delay(np.random.default_rng(0)) <= 1e-6


def check_hogwild():
    from sgd_shm import HogwildClassifier
    from sgd_shm.data import make_rcv1_like
    X, y = make_rcv1_like(3000, 300, random_state=0)
    for backend in ("threads", "processes"):
        clf = HogwildClassifier(loss="log_loss", n_workers=2, backend=backend,
                                max_iter=5, random_state=0).fit(X, y)
        assert clf.score(X, y) > 0.7, backend


def check_mf():
    from sgd_shm import MatrixFactorization
    from sgd_shm.data import make_ratings
    X, r = make_ratings(300, 100, 8000, random_state=0)
    mf = MatrixFactorization(n_factors=4, n_workers=2, max_iter=5, random_state=0).fit(X, r)
    assert mf.rmse(X, r) < r.std()


def check_parameter_server():
    from sgd_shm.data import make_rcv1_like
    from sgd_shm.ps import train
    X, y = make_rcv1_like(3000, 300, random_state=0)
    r = train(X, y, n_workers=2, policy="saps", epochs=2, max_seconds=30, seed=0,
              compress="topk:0.05", progress=False)
    assert r.batches["lost"] == 0 and r.final_loss < np.log(2.0)
    assert 0 < r.bytes_sent < r.bytes_dense


def check_spawned_workers():
    """The installed kit imports in a fresh interpreter and gets its data through
    shared memory: the parameter server and Hogwild's processes under spawn."""
    from sgd_shm import HogwildClassifier
    from sgd_shm.data import make_rcv1_like
    from sgd_shm.ps import train
    X, y = make_rcv1_like(3000, 300, random_state=0)
    r = train(X, y, n_workers=2, policy="asp", epochs=1, max_seconds=30, seed=0,
              start_method="spawn", progress=False)
    assert r.batches["lost"] == 0 and sum(r.batches["applied"]) == r.updates > 0
    clf = HogwildClassifier(n_workers=2, backend="processes", start_method="spawn",
                            max_iter=3, tol=None, random_state=0).fit(X, y)
    assert clf.score(X, y) > max(np.mean(y > 0), np.mean(y <= 0))


def check_collectives_and_eager():
    from sgd_shm.collectives import ShmGroup
    from sgd_shm.data import make_rcv1_like
    from sgd_shm.eager import train

    def body(comm):
        buf = np.full(8, float(comm.rank + 1))
        comm.allreduce(buf)
        return buf.tolist()

    with ShmGroup(3, 8) as group:
        out = group.run(body)
    assert all(o == [6.0] * 8 for o in out)
    X, y = make_rcv1_like(3000, 300, random_state=0)
    r = train(X, y, n_workers=2, collective="solo", epochs=2, max_seconds=30,
              progress=False)
    assert r.replicas_equal and r.final_loss < np.log(2.0)


def check_compress():
    from sgd_shm.compress import TopK
    g = np.random.default_rng(0).normal(size=100_000).astype(np.float32)
    msg = TopK(k=100).compress(g)
    want = np.sort(np.argsort(-np.abs(g), kind="stable")[:100])
    assert np.array_equal(msg.indices, want)


CHECKS = [check_multiqueue, check_multicounter, check_greedy, check_stm_and_conflict,
          check_hogwild, check_mf, check_parameter_server, check_collectives_and_eager,
          check_compress, check_spawned_workers]


def _name(check):
    return check.__name__[len("check_"):]


def add_arguments(ap):
    """The command's options, on ``ap``."""
    ap.add_argument("--only", default=None, metavar="NAMES",
                    help="comma-separated checks to run, from "
                         f"{', '.join(map(_name, CHECKS))} (default: every check)")
    return ap


def check(ap, args):
    """The options' rules (``ap.error``: exit status 2 naming the option); returns args
    with ``checks``, the check functions to run."""
    names = {_name(c): c for c in CHECKS}
    if args.only is None:
        args.checks = list(CHECKS)
        return args
    want = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in want if n not in names]
    if bad or not want:
        ap.error(f"--only: unknown check(s) {bad}; choose from {', '.join(names)}")
    args.checks = [names[n] for n in want]
    return args


def run(args) -> int:
    """Run the checks (each reported, then the /dev/shm check); 0 when all passed."""
    import relaxed
    print(f"relaxed-sgd-kit {relaxed.__version__} selftest (python {sys.version.split()[0]}, "
          f"from {os.path.dirname(os.path.dirname(os.path.abspath(relaxed.__file__)))})")
    before = _shm_names()
    failed = 0
    for chk in args.checks:
        t = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")             # few iterations on purpose
                chk()
            status = "ok"
        except Exception:                                   # report every check, then fail
            failed += 1
            status = "FAILED\n" + traceback.format_exc()
        print(f"  {_name(chk):28s} {time.perf_counter() - t:6.2f} s  {status}", flush=True)
    left = {n for n in _shm_names() - before if _leaked(n)}
    if left:
        failed += 1
        print(f"  left in /dev/shm: {sorted(left)}")
    print("all checks passed" if not failed else f"{failed} check(s) failed")
    return 1 if failed else 0


def main(argv=None) -> int:
    """``python -m sgd_shm.selftest [options]``: the same as ``python -m sgd_shm selftest``."""
    from sgd_shm.__main__ import standalone
    return standalone("selftest", argv, "python -m sgd_shm.selftest")


if __name__ == "__main__":
    sys.exit(main())
