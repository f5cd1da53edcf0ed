"""Held-out scores in every estimator's per-epoch record (``history_``): the keys of
the trainers' histories, the last record's score equal to ``score`` on the held-out
data (an independent computation from the fitted attributes), and clear errors on a
bad ``eval_set``."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from sgd_shm import (HogwildClassifier, HogwildMLPClassifier, HogwildRegressor,
                     MatrixFactorization)
from sgd_shm.core.results import HISTORY_KEYS
from sgd_shm.data import make_ratings
from sgd_shm.ps import ParameterServerClassifier


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return train_test_split(X / 16.0, y, test_size=0.25, random_state=0)


def _check_records(hist, epochs, key="val_score"):
    assert [h["step"] for h in hist] == list(range(1, epochs + 1))
    assert all(tuple(h) == HISTORY_KEYS + (key,) for h in hist)
    secs = [h["seconds"] for h in hist]
    assert secs == sorted(secs) and secs[0] > 0


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_hogwild_classifier_scores_held_out_data_every_epoch(digits, backend, no_shm_leak):
    Xt, Xv, yt, yv = digits
    clf = HogwildClassifier(loss="log_loss", max_iter=4, tol=None, n_workers=2,
                            backend=backend, random_state=0).fit(Xt, yt, eval_set=(Xv, yv))
    _check_records(clf.history_, 4)
    assert clf.history_[-1]["val_score"] == clf.score(Xv, yv) > 0.85
    assert [h["loss"] for h in clf.history_] == clf.loss_curve_
    clf.partial_fit(Xt, yt)                       # goes on: one more record, no score
    assert len(clf.history_) == 5 and "val_score" not in clf.history_[-1]
    assert clf.history_[-1]["seconds"] >= clf.history_[-2]["seconds"]


def test_hogwild_regressor_records_held_out_r2(digits):
    Xt, Xv, yt, yv = digits
    reg = HogwildRegressor(max_iter=3, tol=None, random_state=0).fit(
        Xt, yt.astype(float), eval_set=(Xv, yv.astype(float)))
    _check_records(reg.history_, 3)
    assert reg.history_[-1]["val_score"] == pytest.approx(reg.score(Xv, yv), abs=1e-12)


def test_a_regressors_held_out_targets_are_checked(digits):
    """NaN targets scored nan in every record, strings failed with numpy's words."""
    Xt, Xv, yt, yv = digits
    reg = HogwildRegressor(max_iter=1, tol=None, random_state=0)
    bad_nan = yv.astype(float)
    bad_nan[3] = np.nan
    for bad, exc, words in ((bad_nan, ValueError, "eval_set: y_val holds NaN or inf"),
                            (yv.astype(str), TypeError, "eval_set: y_val must hold numbers")):
        with pytest.raises(exc, match=words):
            reg.fit(Xt, yt.astype(float), eval_set=(Xv, bad))
    reg.fit(Xt, yt.astype(float), eval_set=(Xv, yv))            # integer targets: numbers
    assert reg.history_[-1]["val_score"] == pytest.approx(reg.score(Xv, yv), abs=1e-12)
    for same in ((yv > 4), yv.astype(object)):                 # as training y takes them
        reg.fit(Xt, yt > 4, eval_set=(Xv, same))
        assert np.isfinite(reg.history_[-1]["val_score"])
    assert reg.history_[-1]["val_score"] == pytest.approx(reg.score(Xv, yv), abs=1e-12)


def test_mlp_records_held_out_accuracy(digits):
    Xt, Xv, yt, yv = digits
    mlp = HogwildMLPClassifier(hidden_layer_sizes=(32,), max_iter=3, learning_rate_init=0.1,
                               random_state=0)
    with pytest.warns(Warning):                   # 3 epochs do not converge
        mlp.fit(Xt, yt, eval_set=(Xv, yv))
    _check_records(mlp.history_, 3)
    assert mlp.history_[-1]["val_score"] == mlp.score(Xv, yv) > 0.8


def test_matrix_factorization_records_held_out_rmse():
    X, y = make_ratings(200, 100, 4_000, random_state=0)
    cut = 3 * X.shape[0] // 4
    mf = MatrixFactorization(n_factors=4, max_iter=3, random_state=0)
    mf.fit(X[:cut], y[:cut], eval_set=(X[cut:], y[cut:]))
    _check_records(mf.history_, 3, key="val_rmse")
    assert mf.history_[-1]["val_rmse"] == mf.rmse(X[cut:], y[cut:])


def test_parameter_server_classifier_keeps_the_runs_history(digits, no_shm_leak):
    Xt, Xv, yt, yv = digits
    bt, bv = (yt >= 5).astype(int), (yv >= 5).astype(int)
    clf = ParameterServerClassifier(policy="asp", n_workers=2, max_iter=2, random_state=0)
    clf.fit(Xt, bt, eval_set=(Xv, bv))
    assert clf.history_ is clf.result_.history and clf.history_[-1]["val_score"] == \
        clf.score(Xv, bv)


@pytest.mark.parametrize("bad, exc, words", [
    ("nope", TypeError, "eval_set: expected a pair"),
    ((np.zeros((3, 64)), np.zeros(4)), ValueError, "y_val has shape"),
    ((np.zeros((3, 5)), np.zeros(3)), ValueError, "features"),
    ((np.zeros((3, 64)), np.array([0, 1, 42])), ValueError, "not among the training classes"),
])
def test_a_bad_eval_set_is_a_clear_error(digits, bad, exc, words):
    Xt, _, yt, _ = digits
    for est in (HogwildClassifier(max_iter=1), HogwildMLPClassifier(max_iter=1)):
        with pytest.raises(exc, match=words):
            est.fit(Xt, yt, eval_set=bad)
