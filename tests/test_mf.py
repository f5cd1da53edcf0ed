"""Matrix factorization: the kernel against a serial oracle, accuracy, bad input."""
import numpy as np
import pytest

from naive import serial_mf_epoch
from sgd_shm import MatrixFactorization, WorkerError
from sgd_shm.hogwild import _mf
from sgd_shm.data import make_ratings


def replay_second_epoch_against_serial_oracle(change=None, **kw):
    """One worker (``kw``: backend, start_method): fit one epoch to initialise, then
    check that partial_fit's epoch equals the serial oracle replayed by hand on the
    same order (its session's split, then the worker's shuffle); ``change``: settings
    set between the two (learning_rate, reg, reg_bias), which its epoch must use."""
    change = change or {}
    X, y = make_ratings(50, 40, 800, rank=3, random_state=1)
    mf = MatrixFactorization(n_factors=4, n_workers=1, max_iter=1, decay=1.0, random_state=2,
                             **kw)
    mf.fit(X, y)
    P, Q = mf.user_factors_.copy(), mf.item_factors_.copy()
    bu, bi = mf.user_bias_.copy(), mf.item_bias_.copy()
    rng = np.random.default_rng()
    rng.bit_generator.state = mf._rng.bit_generator.state
    order = rng.permutation(len(y))
    _mf.shuffle_part(order, 0, len(y), rng.integers(0, 2**63 - 1, size=1)[0])
    mf.set_params(**change).partial_fit(X, y)
    serial_mf_epoch(X[:, 0], X[:, 1], y, order, P, Q, bu, bi,
                    lr=change.get("learning_rate", 0.01), reg=change.get("reg", 0.02),
                    reg_bias=change.get("reg_bias", 0.02), mu=mf.global_mean_)
    for got, want in ((mf.user_factors_, P), (mf.item_factors_, Q), (mf.user_bias_, bu),
                      (mf.item_bias_, bi)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_one_worker_epoch_equals_serial_oracle(backend, no_shm_leak):
    replay_second_epoch_against_serial_oracle(backend=backend)


def test_settings_changed_between_partial_fits_are_used():
    """A learning_rate set between calls is the next epoch's step (fit's decayed one went
    on before), and reg / reg_bias too; n_factors, which shapes the tables, is refused
    by name rather than ignored."""
    replay_second_epoch_against_serial_oracle(
        change=dict(learning_rate=0.004, reg=0.05, reg_bias=0.01))
    X, y = make_ratings(50, 40, 800, rank=3, random_state=1)
    mf = MatrixFactorization(n_factors=4, max_iter=1, random_state=2).fit(X, y)
    with pytest.raises(ValueError, match="n_factors: set to 6 after the tables were built "
                                         "with 4"):
        mf.set_params(n_factors=6).partial_fit(X, y)


def test_shuffle_part_permutes_its_part_only_and_uniformly():
    """Each worker's in-place Fisher-Yates: a permutation of its part, nothing outside
    it moved, and every element equally likely at every position (chi-square over
    6000 seeds on a part of 6, against an independent count)."""
    base = np.arange(20)
    counts = np.zeros((6, 6))
    seen = set()
    for seed in range(6000):
        a = base.copy()
        _mf.shuffle_part(a, 7, 13, seed)
        assert (a[:7] == base[:7]).all() and (a[13:] == base[13:]).all()
        assert sorted(a[7:13]) == list(range(7, 13))
        counts[np.arange(6), a[7:13] - 7] += 1
        seen.add(tuple(a[7:13]))
    expected = 6000 / 6
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 70, chi2                  # 25 degrees of freedom: p < 1e-5 beyond 70
    assert len(seen) > 600                  # of the 720 orders of 6
    one = np.arange(1000)
    _mf.shuffle_part(one, 0, 1000, 1)
    two = np.arange(1000)
    _mf.shuffle_part(two, 0, 1000, 2)
    assert (one != two).any() and (one != np.arange(1000)).any()


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_learns_low_rank_ratings_with_two_workers(backend, no_shm_leak):
    X, y = make_ratings(3000, 800, 150_000, rank=5, noise=0.3, random_state=0)
    idx = np.random.default_rng(0).permutation(len(y))
    tr, te = idx[:120_000], idx[120_000:]
    base = np.sqrt(np.mean((y[te] - y[tr].mean()) ** 2))
    r = {}
    for nw in (1, 2):
        mf = MatrixFactorization(n_factors=5, n_workers=nw, max_iter=15, random_state=0,
                                 backend=backend)
        r[nw] = mf.fit(X[tr], y[tr]).rmse(X[te], y[te])
        assert mf.loss_curve_[-1] < mf.loss_curve_[0]
    assert r[1] < 0.8 * base, f"test RMSE {r[1]:.3f} vs predicting the mean {base:.3f}"
    assert r[2] < 1.03 * r[1], f"2 workers RMSE {r[2]:.4f} vs 1 worker {r[1]:.4f}"
    assert 0.0 < mf.score(X[te], y[te]) <= 1.0


def test_cold_start_and_partial_fit():
    X, y = make_ratings(30, 20, 300, random_state=3)
    mf = MatrixFactorization(n_factors=2, max_iter=3, random_state=0).fit(X, y)
    p = mf.predict(np.array([[10_000, 0], [0, 10_000], [10_000, 10_000]]))
    assert np.isfinite(p).all()
    assert p[2] == pytest.approx(mf.global_mean_)
    mf.partial_fit(X, y)
    assert mf.n_iter_ == 4
    with pytest.raises(ValueError, match="beyond the fitted model"):
        mf.partial_fit(np.array([[10_000, 0]]), np.array([3.0]))
    # rmse takes one finite rating per row: a column or a single value broadcast before
    for bad, match in ((y[:, None], r"y must have shape \(\d+,\): one rating per row"),
                       (y[:1], "shape"), (np.full(len(y), np.nan), "NaN")):
        with pytest.raises(ValueError, match=match):
            mf.rmse(X, bad)
    assert mf.rmse(X, y) == pytest.approx(np.sqrt(np.mean((mf.predict(X) - y) ** 2)))


@pytest.mark.parametrize("X, y, exc, match", [
    (np.array([[0, -1]]), np.array([3.0]), ValueError, "negative ids"),
    (np.array([[0.5, 1]]), np.array([3.0]), ValueError, "integer ids"),
    (np.array([[0, 1, 2]]), np.array([3.0]), ValueError, "shape"),
    (np.array([["a", "b"]]), np.array([3.0]), ValueError, "string"),
    (np.array([[0, 1]]), np.array([np.nan]), ValueError, "NaN"),
    (np.array([[0, 1]]), np.array([1.0, 2.0]), ValueError, "inconsistent numbers of samples"),
    # raw ids index the tables: 10^15 users would need far more memory than any machine has
    (np.array([[10**15, 1]]), np.array([3.0]), ValueError, r"X: .* renumber the ids"),
    # ids past int64 were reported as negative (they wrapped in the int64 copy)
    (np.array([[2**63 + 5, 1]], dtype=np.uint64), np.array([3.0]), ValueError,
     r"X holds ids of 2\*\*63 or more \(9223372036854775813\); renumber"),
    (np.array([[1e19, 1]]), np.array([3.0]), ValueError, r"ids of 2\*\*63 or more"),
])
def test_bad_input(X, y, exc, match):
    mf = MatrixFactorization()
    with pytest.raises(exc, match=match):
        mf.fit(X, y)
    assert not hasattr(mf, "n_users_")              # nothing of a half-made fit is left


def test_bad_parameters_and_divergence():
    X, y = make_ratings(30, 20, 300, random_state=3)
    with pytest.raises(ValueError, match="backend: must be one of \\('threads', 'processes'\\)"):
        MatrixFactorization(backend="gpu").fit(X, y)
    with pytest.raises(ValueError, match="learning_rate: must be a finite number > 0"):
        MatrixFactorization(learning_rate=0.0).fit(X, y)
    for bad in ("no", None, 1):                    # ("no" fitted biases)
        with pytest.raises(TypeError, match="fit_bias: must be True or False"):
            MatrixFactorization(fit_bias=bad).fit(X, y)
    with pytest.raises(ValueError, match="verbose: must be an int >= 0"):
        MatrixFactorization(verbose=-1).fit(X, y)
    from sgd_shm import DivergenceError
    with pytest.raises(DivergenceError, match="diverged"):
        MatrixFactorization(learning_rate=1e6, decay=1.0, max_iter=5, random_state=0).fit(X, y)


def test_processes_worker_failure_releases_everything(monkeypatch, no_shm_leak):
    """A worker that raises or is SIGKILLed stops the fit with a WorkerError (the public
    sgd_shm.WorkerError, as the docs say to catch it); the shared segment is gone and
    the estimator keeps private factors."""
    import os
    import signal

    from sgd_shm.hogwild import _pool as _procs
    X, y = make_ratings(200, 100, 5000, random_state=4)
    parent, real = os.getpid(), _procs.mf_epoch     # the caller is worker 0

    def boom(*args):
        raise RuntimeError("injected failure")
    monkeypatch.setattr(_procs, "mf_epoch", boom)      # forked workers inherit it
    mf = MatrixFactorization(n_workers=2, backend="processes", max_iter=2)
    with pytest.raises(WorkerError, match="(?s)worker 0 .*injected.*worker 1 .*inj"):
        mf.fit(X, y)

    def die(*args):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        real(*args)
    monkeypatch.setattr(_procs, "mf_epoch", die)
    with pytest.raises(WorkerError, match="worker 1 .*died"):
        mf.fit(X, y)
    monkeypatch.undo()
    mf.fit(X, y)                                        # and it works again
    assert mf.user_factors_.flags.owndata               # private again, not a shm view
    assert np.isfinite(mf.user_factors_).all() and mf.n_iter_ == 2


#: scikit-learn's checks that fit on real-valued matrices (3-10 columns, non-integer or
#: negative entries): MatrixFactorization's X is (user id, item id) pairs, so it refuses
#: them (with its ValueError). The properties they test are checked on id data below.
NOT_ID_PAIRS = "the check fits on a real-valued matrix; X here must be (user id, item id) pairs"
EXPECTED_FAILURES = {name: NOT_ID_PAIRS for name in (
    "check_dict_unchanged", "check_dont_overwrite_parameters", "check_dtype_object",
    "check_estimators_dtypes", "check_estimators_fit_returns_self", "check_estimators_nan_inf",
    "check_estimators_overwrite_params", "check_estimators_partial_fit_n_features",
    "check_estimators_pickle", "check_f_contiguous_array_estimator", "check_fit2d_1feature",
    "check_fit2d_1sample", "check_fit2d_predict1d", "check_fit_check_is_fitted",
    "check_fit_idempotent", "check_fit_score_takes_y", "check_methods_sample_order_invariance",
    "check_methods_subset_invariance", "check_n_features_in",
    "check_n_features_in_after_fitting", "check_non_transformer_estimators_n_iter",
    "check_pipeline_consistency", "check_positive_only_tag_during_fit",
    "check_readonly_memmap_input", "check_regressor_data_not_an_array",
    "check_regressors_int", "check_regressors_no_decision_function",
    "check_regressors_train", "check_supervised_y_2d")}


def test_sklearn_estimator_checks():
    """The checks that apply pass (cloning, params, tags, sparse/complex/empty input and
    y=None refused with scikit-learn's messages, unfitted errors, ...); the others are
    listed above with the reason."""
    import warnings

    from sklearn.utils.estimator_checks import check_estimator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = check_estimator(MatrixFactorization(max_iter=2, n_workers=1),
                              expected_failed_checks=EXPECTED_FAILURES, on_fail=None)
    assert not [r["check_name"] for r in res if r["status"] == "failed"]
    assert sum(r["status"] == "passed" for r in res) >= 15


def test_estimator_properties_on_id_data(tmp_path):
    """What the skipped checks test, on (user, item) data: fit returns self, a refit
    with the same seed is identical, pickling keeps predictions, predictions do not
    depend on row order or batch, read-only input is fine, predict does not change
    the estimator, and the feature count is enforced with scikit-learn's message."""
    import pickle
    X, y = make_ratings(200, 80, 4000, random_state=5)
    mf = MatrixFactorization(n_factors=3, max_iter=3, n_workers=1, random_state=1)
    assert mf.fit(X, y) is mf and mf.n_features_in_ == 2
    p = mf.predict(X)
    again = MatrixFactorization(n_factors=3, max_iter=3, n_workers=1, random_state=1)
    np.testing.assert_array_equal(again.fit(X, y).predict(X), p)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(mf)).predict(X), p)
    perm = np.random.default_rng(0).permutation(len(y))
    np.testing.assert_array_equal(mf.predict(X[perm]), p[perm])
    np.testing.assert_array_equal(mf.predict(X[:17]), p[:17])
    before = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in mf.__dict__.items()}
    mf.predict(X)
    for k, v in before.items():
        assert np.array_equal(mf.__dict__[k], v) if isinstance(v, np.ndarray) \
            else mf.__dict__[k] == v, k
    Xr, yr = X.copy(), y.copy()
    Xr.setflags(write=False)
    yr.setflags(write=False)
    MatrixFactorization(n_factors=3, max_iter=1, random_state=1).fit(Xr, yr)
    with pytest.raises(ValueError, match="X has 3 features, but MatrixFactorization is "
                                         "expecting 2"):
        mf.predict(np.c_[X, X[:, :1]])
    import scipy.sparse as sp
    with pytest.raises(TypeError, match="[Ss]parse"):
        MatrixFactorization().fit(sp.csr_matrix(X), y)
