"""Data: the RCV1-like generator and the LIBSVM loader."""
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file
from sklearn.linear_model import SGDClassifier

from sgd_shm.data import load_svmlight, make_ratings, make_rcv1_like


def test_rcv1_like_shape_density_norms_and_seed():
    X, y = make_rcv1_like(5000, 20_000, density=0.002, random_state=3)
    assert sp.isspmatrix_csr(X) and X.shape == (5000, 20_000) and X.has_sorted_indices
    assert 0.0015 < X.nnz / (5000 * 20_000) < 0.0025
    assert np.allclose(np.sqrt(X.multiply(X).sum(axis=1)).A.ravel(), 1.0)
    assert (X.data > 0).all() and set(np.unique(y)) == {-1.0, 1.0}
    assert 0.4 < (y > 0).mean() < 0.6
    counts = np.bincount(X.indices, minlength=20_000)
    assert counts.max() > 50 * max(np.median(counts), 1), (
        f"feature popularity is not Zipf-like: top {counts.max()}, median {np.median(counts)}")
    X2, y2 = make_rcv1_like(5000, 20_000, density=0.002, random_state=3)
    assert (X != X2).nnz == 0 and np.array_equal(y, y2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_samples=0), "n_samples: must be an int >= 1"),
    (dict(density=0.0), "density"),
    (dict(noise=0.6), "noise"),
    (dict(margin=0.95), "margin"),
    (dict(margin=-0.1), "margin"),
    (dict(focus=-1.0), "focus"),
    (dict(zipf=-70.0), "zipf: must be a finite number >= 0"),
    (dict(zipf=400.0), "zipf: 400.0 is too steep for 10 features"),   # (NaN rows before)
    (dict(random_state=-1), "random_state: must be an int >= 0 or None"),
])
def test_rcv1_like_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_rcv1_like(**{"n_samples": 10, "n_features": 10, **kwargs})



@pytest.mark.parametrize("kwargs, match", [
    (dict(n_ratings=10), r"n_ratings: at most n_users \* n_items = 9 unique"),
    (dict(rank=0), "rank: must be an int >= 1"),
    (dict(noise=-0.1), "noise: must be a finite number >= 0"),
    (dict(noise=float("nan")), "noise: must be a finite number"),
    (dict(zipf=-1.0), "zipf: must be a finite number >= 0"),
    (dict(random_state=-1), "random_state: must be an int >= 0 or None"),
])
def test_ratings_bad_arguments(kwargs, match):
    """make_ratings refuses what it cannot make: more unique (user, item) pairs than exist
    (it used to return fewer ratings than asked, without a word), or a bad noise or skew."""
    with pytest.raises(ValueError, match=match):
        make_ratings(**{"n_users": 3, "n_items": 3, "n_ratings": 5, **kwargs})


def test_ratings_pairs_are_unique_up_to_every_pair():
    X, y = make_ratings(3, 3, 9, random_state=0)
    assert len({tuple(r) for r in X}) == len(X) <= 9 and ((1 <= y) & (y <= 5)).all()


def _held_out_accuracy(X, y, n_train):
    """SGDClassifier(log loss, alpha 1e-4, 5 epochs) trained on the first n_train rows,
    scored on the rest (rows are independent draws in random order)."""
    clf = SGDClassifier(loss="log_loss", max_iter=5, tol=None, random_state=0)
    clf.fit(X[:n_train], y[:n_train])
    return clf.score(X[n_train:], y[n_train:])


def test_rcv1_like_learns_like_rcv1():
    """The generator's problem is close to linearly separable, as RCV1 is.

    20,000 x 5,000 at density 0.015 (about 66 nonzeros per row, as the default
    200,000 x 50,000 has about 69), default noise (Bayes accuracy 0.97), margin and
    focus; split 80/20: the first 16,000 rows train, the last 4,000 are held out.
    Bound: SGDClassifier(loss="log_loss", max_iter=5, tol=None) reaches >= 0.90
    held-out accuracy (measured 0.960-0.966 over seeds 0-2; at the default size
    0.946-0.954), and cannot beat the Bayes accuracy 0.97 by more than the
    held-out sampling error (about 0.003 per standard deviation, bound 0.985).
    """
    X, y = make_rcv1_like(20_000, 5_000, density=0.015, random_state=0)
    assert 60 < X.nnz / X.shape[0] < 75
    acc = _held_out_accuracy(X, y, 16_000)
    assert 0.90 <= acc < 0.985, acc


def test_rcv1_like_noise_is_the_bayes_error():
    """`noise` raises the held-out error by about its value.

    Same seed, noise 0 and noise q: X and the noiseless labels are the same, a fraction
    q of the labels differ, the noiseless rule scores about 1 - q on the noisy held-out
    labels (the Bayes accuracy), and a model trained on noisy labels loses about q
    held-out accuracy against the noiseless problem (within 0.03; measured within 0.02
    for q in 0.03, 0.1, 0.2 and seeds 0-2). Split as above: 16,000 train, 4,000 held out.
    """
    X, y_clean = make_rcv1_like(20_000, 5_000, density=0.015, noise=0.0, random_state=0)
    acc_clean = _held_out_accuracy(X, y_clean, 16_000)
    assert acc_clean > 0.97, acc_clean
    for noise in (0.03, 0.1, 0.2):
        X_n, y = make_rcv1_like(20_000, 5_000, density=0.015, noise=noise, random_state=0)
        assert (X_n != X).nnz == 0
        assert abs(np.mean(y != y_clean) - noise) < 0.01
        rule = np.mean(y_clean[16_000:] == y[16_000:])     # the noiseless rule, held out
        assert abs(rule - (1 - noise)) < 0.02, (noise, rule)
        acc = _held_out_accuracy(X, y, 16_000)
        assert abs((acc_clean - acc) - noise) < 0.03, (noise, acc_clean, acc)
        assert acc < rule + 0.015, (noise, acc, rule)


def test_load_svmlight_roundtrip_and_errors(tmp_path):
    X, y = make_rcv1_like(200, 300, density=0.05, random_state=0)
    path = tmp_path / "d.svm"
    dump_svmlight_file(X, y, str(path))
    X2, y2 = load_svmlight(path, n_features=300)
    assert np.allclose(X2.toarray(), X.toarray()) and np.array_equal(y2, y)
    with pytest.raises(FileNotFoundError, match="no LIBSVM file"):
        load_svmlight(tmp_path / "missing.svm")
    bad = tmp_path / "bad.svm"
    bad.write_text("1 3:abc\n")
    with pytest.raises(ValueError, match="not a valid LIBSVM"):
        load_svmlight(bad)
    # a bad n_features is the argument's fault, not the file's
    with pytest.raises(ValueError, match="n_features: must be an int >= 1"):
        load_svmlight(path, n_features=0)
    with pytest.raises(TypeError, match="n_features: must be an int"):
        load_svmlight(path, n_features=2.5)
    with pytest.raises(ValueError, match="n_features: .*set to 5.*give at least the file's"):
        load_svmlight(path, n_features=5)
