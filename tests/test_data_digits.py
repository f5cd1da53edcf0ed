"""sgd_shm.data's handwritten digits: the split, and the augmented training set
(seeded, cached, derived from the training images only, labels kept)."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from sgd_shm.data import load_digits_split, make_digits_augmented


def test_split_is_stratified_float32_images():
    Xtr, Xte, ytr, yte = load_digits_split(0.2, random_state=0)
    assert Xtr.shape == (1437, 1, 8, 8) and Xte.shape == (360, 1, 8, 8)
    assert Xtr.dtype == np.float32 and Xtr.flags.c_contiguous
    assert ytr.dtype == np.int64 and set(np.unique(yte)) == set(range(10))
    assert 0.0 <= Xtr.min() and Xtr.max() <= 1.0
    counts = np.bincount(yte, minlength=10) / len(yte)
    full = np.bincount(load_digits().target, minlength=10) / 1797
    assert np.abs(counts - full).max() < 0.01                      # stratified
    # the pixels are sklearn's own, / 16, and every image is in exactly one part
    X = load_digits().data.astype(np.float32) / 16
    both = np.concatenate([Xtr.reshape(-1, 64), Xte.reshape(-1, 64)])
    assert sorted(map(bytes, both)) == sorted(map(bytes, X))
    flat = load_digits_split(0.2, random_state=0, flat=True)
    assert flat[0].shape == (1437, 64) and np.array_equal(flat[0], Xtr.reshape(-1, 64))


def test_augmented_is_derived_from_training_images_only():
    Xtr, Xte, ytr, yte = load_digits_split(0.25, random_state=3)
    X, Xte2, y, yte2 = make_digits_augmented(4000, test_size=0.25, random_state=3)
    assert X.shape == (4000, 1, 8, 8) and X.dtype == np.float32 and y.dtype == np.int64
    assert np.array_equal(Xte2, Xte) and np.array_equal(yte2, yte)   # held out untouched
    assert 0.0 <= X.min() and X.max() <= 1.0
    # the training images themselves are in it, with their labels
    key = {bytes(a): lab for a, lab in zip(X.reshape(len(X), -1), y)}
    assert all(key.get(bytes(a)) == lab for a, lab in zip(Xtr.reshape(len(Xtr), -1), ytr))
    # the made images are legible as their labels: an SVM fitted on the training images
    # alone labels most of them right (it is not shift-invariant, so the shifts cost it
    # points); without shifts nearly all; and each class's mean image is nearest the
    # mean training image of its own class
    from sklearn.svm import SVC
    svm = SVC().fit(Xtr.reshape(len(Xtr), -1), ytr)
    made, labels = X.reshape(len(X), -1), y
    assert svm.score(made, labels) > 0.6
    X0, _, y0, _ = make_digits_augmented(4000, test_size=0.25, random_state=3, shift=0.0)
    assert svm.score(X0.reshape(len(X0), -1), y0) > 0.85
    means = np.stack([made[labels == c].mean(0) for c in range(10)])
    ref = np.stack([Xtr.reshape(len(Xtr), -1)[ytr == c].mean(0) for c in range(10)])
    assert np.array_equal(((means[:, None] - ref[None]) ** 2).sum(-1).argmin(1), np.arange(10))
    # class proportions kept
    assert np.abs(np.bincount(y, minlength=10) / len(y) - np.bincount(ytr) / len(ytr)).max() < 0.02


def test_augmented_is_seeded_and_cached():
    a = make_digits_augmented(2000, random_state=1)
    b = make_digits_augmented(2000, random_state=1)
    c = make_digits_augmented(2000, random_state=2)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not np.array_equal(a[0], c[0])
    a[0][...] = 0                      # the caller's copy: the cache is not touched
    assert make_digits_augmented(2000, random_state=1)[0].any()
    assert make_digits_augmented(2000, random_state=1, flat=True)[0].shape == (2000, 64)


@pytest.mark.parametrize("kw, match", [
    (dict(n_samples=100), "n_samples: must be at least"),
    (dict(n_samples=0), "n_samples"), (dict(test_size=1.0), "test_size"),
    (dict(degrees=90), "degrees"), (dict(sigma=0), "sigma"),
    (dict(random_state=-1), "random_state")])
def test_augmented_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        make_digits_augmented(**{"n_samples": 2000, **kw})


def test_split_bad_arguments():
    with pytest.raises(TypeError, match="flat"):
        load_digits_split(flat="yes")
    with pytest.raises(ValueError, match="test_size"):
        load_digits_split(0.0)
    for ts, held in ((0.999, 1796), (0.001, 2)):  # a class short in a part: sklearn's words
        with pytest.raises(ValueError, match=f"test_size: {ts} holds out {held} of 1797 "
                                             r"images.*\[0\.0056, 0\.9944\]"):
            load_digits_split(ts)
    assert len(load_digits_split(0.0056)[1]) == 11 and len(load_digits_split(0.9944)[0]) == 10
