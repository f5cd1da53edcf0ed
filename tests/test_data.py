"""Data: the RCV1-like generator and the LIBSVM loader."""
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file

from sgd_shm.data import load_svmlight, make_rcv1_like


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
])
def test_rcv1_like_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_rcv1_like(**{"n_samples": 10, "n_features": 10, **kwargs})


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
