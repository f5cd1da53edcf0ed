"""Data for the SGD side of the kit: LIBSVM files and generated problems.

* :func:`load_svmlight` reads LIBSVM/svmlight text files into CSR (scikit-learn's
  parser, with the checks this kit needs).
* :func:`make_ratings` draws a Netflix-shaped ratings problem for matrix factorization.
* :func:`make_rcv1_like` draws a large synthetic sparse binary problem shaped like
  RCV1 (Lewis et al. 2004): Zipf-like feature popularity, about 0.15% density,
  nonnegative tf-idf-like values, rows of unit L2 norm, labels from a hidden linear
  rule with a margin and 3% label noise, so that, like RCV1, it is close to linearly
  separable (a linear model reaches about 0.95 held-out accuracy in a few epochs).
  200k × 50k (about 14M nonzeros) takes a few seconds. Real RCV1 comes in through
  :func:`load_svmlight`.
* :func:`load_digits_split` gives scikit-learn's bundled handwritten digits (1,797
  images of 8x8 pixels, real handwriting) as float32 images split into training and
  held-out parts; :func:`make_digits_augmented` derives a larger training set (50,000
  images by default) from the training part only, by small shifts, rotations and
  elastic distortions (Simard, Steinkraus, Platt, ICDAR 2003), and keeps the held-out
  part as it is.

Example::

    from sgd_shm.data import make_rcv1_like
    X, y = make_rcv1_like(200_000, 50_000, random_state=0)   # X: CSR float64, y in {-1, +1}
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sgd_shm.core.validation import check_int, check_number, check_seed

__all__ = ["make_rcv1_like", "make_ratings", "load_svmlight", "load_digits_split",
           "make_digits_augmented"]


def make_rcv1_like(n_samples=200_000, n_features=50_000, *, density=0.0015, zipf=1.1,
                   noise=0.03, margin=0.2, focus=0.5, random_state=None):
    """A synthetic sparse binary classification problem shaped like RCV1 and about as
    learnable: close to linearly separable, with a stated Bayes error.

    Rows look like tf-idf documents: each holds about ``density * n_features`` nonzeros
    (Poisson, at least one) drawn from a Zipf-shaped feature popularity, nonnegative
    values that weigh rare features more, and unit L2 norm. Labels come from a hidden
    linear rule that weighs the popular features most (``focus``), with the rows
    nearest its boundary left out (``margin``), and a fraction ``noise`` of them
    flipped at random.

    The default problem (200,000 × 50,000): about 69 nonzeros per row (density
    0.0014), Bayes error 0.03 (no classifier's expected accuracy exceeds 0.97), and
    ``SGDClassifier(loss="log_loss", max_iter=5, tol=None)`` (alpha 1e-4) reaches about
    0.95 accuracy on held-out rows. ``make_rcv1_like(20_000, 5_000, density=0.015)``
    (about 66 nonzeros per row) learns the same way at a tenth of the size.

    Parameters
    ----------
    n_samples, n_features : size of X.
    density : mean fraction of nonzeros per row before repeated features merge
        (RCV1: about 0.0016).
    zipf : exponent s of feature popularity: a feature's popularity rank r is drawn
        with density ∝ 1 / (r + 10)^s, and a random relabelling decides which feature
        has which rank. Larger s: fewer, more dominant frequent features.
    noise : fraction of labels flipped at random after the noiseless rule; it is the
        problem's Bayes error (the rule itself scores ``1 - noise`` on average). Only
        y depends on it: the same ``random_state`` gives the same X and the same
        noiseless labels for every ``noise``. More noise, a harder problem.
    margin : fraction of the drawn rows nearest the rule's boundary that are left out
        (half just below the median score, half just above; rows are drawn in excess
        so that ``n_samples`` remain). It opens a gap between the classes; 0 keeps
        every row, so that some sit right at the boundary (harder). At most 0.9.
    focus : how much the rule rests on the popular features: feature f's weight is
        Gaussian with standard deviation (p_f / p_max) ** focus, p_f its popularity.
        0 spreads the rule evenly over every feature, the rare ones that few rows show
        included (harder: those weights are learned from few rows); larger values
        concentrate it on the frequent features (easier).
    random_state : seed; the same seed gives the same problem.

    To make the problem harder, raise ``noise`` (higher Bayes error), lower ``margin``
    (rows at the boundary), lower ``focus`` (more of the rule on rare features) or
    lower ``density`` (less evidence per row).

    Returns
    -------
    X : scipy.sparse.csr_matrix (float64, sorted int32 indices, rows of unit norm)
    y : ndarray of ±1.0, about half of each
    """
    n_samples = check_int("n_samples", n_samples)
    n_features = check_int("n_features", n_features)
    density = check_number("density", density, lo=0, lo_open=True, hi=1)
    zipf = check_number("zipf", zipf, lo=0)
    noise = check_number("noise", noise, lo=0, hi=0.5, hi_open=True)
    margin = check_number("margin", margin, lo=0, hi=0.9)
    focus = check_number("focus", focus, lo=0)
    rng = _rng(random_state)
    # draw enough rows that n_samples remain once the `margin` fraction is left out
    n_drawn = n_samples + int(np.ceil(n_samples * margin / (1.0 - margin)))
    lengths = np.maximum(1, rng.poisson(max(1.0, density * n_features), n_drawn))
    indptr = np.zeros(n_drawn + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    total = int(indptr[-1])
    # feature ranks: r = floor(z), z on [0, n_features) with density ∝ (z + 10)^-zipf,
    # drawn by inverting its distribution function; p[r] is the exact chance of rank r
    edges = np.arange(n_features + 1, dtype=np.float64) + 10.0
    log_form, a = abs(zipf - 1.0) < 1e-6, 1.0 - zipf
    with np.errstate(all="ignore"):          # too steep a zipf underflows: refused below
        cum = np.log(edges / 10.0) if log_form else (edges ** a - 10.0 ** a) / a
        p = np.diff(cum) / cum[-1]
    if not (np.isfinite(p).all() and p.min() > 0):
        raise ValueError(f"zipf: {zipf} is too steep for {n_features} features (the rarest "
                         "features' popularity underflows to 0); use a smaller zipf "
                         "(RCV1: about 1.1)")
    u = rng.random(total)
    z = 10.0 * np.exp(u * cum[-1]) if log_form else (10.0 ** a + a * cum[-1] * u) ** (1.0 / a)
    rank = np.minimum(z - 10.0, n_features - 1).astype(np.int32)
    perm = rng.permutation(n_features).astype(np.int32)      # rank -> feature
    # tf-idf-like values: an idf (1 + log 1/p) that grows as the feature gets rarer,
    # times a spread
    data = (1.0 + np.log(1.0 / p))[rank] * rng.exponential(1.0, total)
    X = sp.csr_matrix((data, perm[rank], indptr), shape=(n_drawn, n_features))
    X.sum_duplicates()                     # repeated features in a row add up
    X.sort_indices()
    norms = np.sqrt(np.add.reduceat(X.data * X.data, X.indptr[:-1]))
    X.data /= np.repeat(norms, np.diff(X.indptr))
    # the hidden rule: Gaussian weights scaled by popularity ** focus, threshold at
    # the median score (classes of about equal size)
    w = np.empty(n_features)
    w[perm] = rng.normal(size=n_features) * (p / p.max()) ** focus
    score = X @ w
    threshold = np.median(score)
    if n_drawn > n_samples:
        # leave out the middle ranks of the score: as many rows just below the median
        # as just above it, so the classes stay balanced
        n_out = n_drawn - n_samples
        start = (n_drawn - n_out) // 2
        keep = np.ones(n_drawn, dtype=bool)
        keep[np.argsort(score, kind="stable")[start:start + n_out]] = False
        X, score = X[keep], score[keep]
    y = np.where(score > threshold, 1.0, -1.0)
    flip = rng.random(n_samples) < noise
    y[flip] = -y[flip]
    return X, y


def _rng(random_state):
    """The generator of a ``random_state``: None (fresh entropy), an int >= 0, or a numpy
    Generator (used as it is)."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    return np.random.default_rng(check_seed("random_state", random_state))


def load_svmlight(path, n_features=None, *, dtype=np.float64):
    """Read a LIBSVM/svmlight file; returns (X as CSR, y). Raises a clear error for a
    missing file or malformed content."""
    from sklearn.datasets import load_svmlight_file
    if n_features is not None:
        n_features = check_int("n_features", n_features)
    try:
        X, y = load_svmlight_file(str(path), n_features=n_features, dtype=dtype)
    except FileNotFoundError:
        raise FileNotFoundError(f"no LIBSVM file at {str(path)!r}") from None
    except ValueError as e:
        if n_features is not None and "n_features" in str(e):
            raise ValueError(f"n_features: {e}; give at least the file's count, or None to "
                             "take it from the file") from None
        raise ValueError(f"{str(path)!r} is not a valid LIBSVM/svmlight file: {e}") from None
    if not np.isfinite(X.data).all() or not np.isfinite(y).all():
        raise ValueError(f"{str(path)!r} contains NaN or infinite values")
    return sp.csr_matrix(X), y


def make_ratings(n_users=10_000, n_items=2_000, n_ratings=500_000, *, rank=10, noise=0.5,
                 zipf=0.8, random_state=None):
    """A Netflix-shaped ratings problem: (user, item) pairs with Zipf-like popularity of
    users and items, ratings from a hidden rank-``rank`` biased model plus Gaussian
    noise, clipped to [1, 5]. Pairs are unique.

    Returns
    -------
    X : int64 array of shape (m, 2), columns (user id, item id), m <= n_ratings
    y : float64 ratings
    """
    for name, v in (("n_users", n_users), ("n_items", n_items), ("n_ratings", n_ratings),
                    ("rank", rank)):
        check_int(name, v)
    if n_ratings > n_users * n_items:
        raise ValueError(f"n_ratings: at most n_users * n_items = {n_users * n_items} unique "
                         f"(user, item) pairs exist, got {n_ratings}; ask for fewer ratings or "
                         "more users or items")
    noise = check_number("noise", noise, lo=0)
    zipf = check_number("zipf", zipf, lo=0)
    rng = _rng(random_state)

    def popular(n, size):
        w = 1.0 / (np.arange(n) + 5.0) ** zipf
        cdf = np.cumsum(w)
        cdf /= cdf[-1]
        return rng.permutation(n)[np.minimum(np.searchsorted(cdf, rng.random(size)), n - 1)]
    draw = int(n_ratings * 1.2) + 16
    u = popular(n_users, draw).astype(np.int64)
    i = popular(n_items, draw).astype(np.int64)
    key = u * n_items + i
    # unique pairs by sort + adjacent difference (np.unique is slow on big int64 arrays)
    order = np.argsort(key, kind="stable")
    keep = np.ones(order.size, dtype=bool)
    keep[1:] = np.diff(key[order]) != 0
    sel = np.sort(order[keep])[:n_ratings]
    u, i = u[sel], i[sel]
    P = rng.normal(0, 1 / np.sqrt(rank), (n_users, rank))
    Q = rng.normal(0, 1 / np.sqrt(rank), (n_items, rank))
    bu = rng.normal(0, 0.3, n_users)
    bi = rng.normal(0, 0.5, n_items)
    y = 3.6 + bu[u] + bi[i] + np.einsum("ij,ij->i", P[u], Q[i]) + rng.normal(0, noise, u.size)
    return np.column_stack([u, i]), np.clip(y, 1.0, 5.0)


# ---- handwritten digits: scikit-learn's bundled set and an augmented one ------------------
#: (key) -> arrays of the data sets built so far in this process (never on disk)
_DIGITS_CACHE = {}


def _check_split(test_size, random_state):
    test_size = check_number("test_size", test_size, lo=0, hi=1, lo_open=True, hi_open=True)
    if random_state is not None and (isinstance(random_state, bool) or
                                     not isinstance(random_state, (int, np.integer))
                                     or random_state < 0):
        raise ValueError(f"random_state: must be an int >= 0 or None, got {random_state!r}")
    return test_size, None if random_state is None else int(random_state)


def load_digits_split(test_size=0.2, *, random_state=0, flat=False):
    """scikit-learn's handwritten digits (UCI ML hand-written digits: 1,797 images of
    8x8 pixels, ten classes) as float32 pixels in [0, 1] (the 0..16 grey levels / 16),
    split into training and held-out parts with every class in each part in its
    proportion (a stratified split).

    Parameters
    ----------
    test_size : fraction of the images held out, in (0, 1).
    random_state : seed of the split (an int >= 0; None: a fresh one).
    flat : False (default): images shaped (n, 1, 8, 8), what a CNN takes; True: rows
        of 64 pixels, what the kit's linear models and MLP take.

    Returns
    -------
    X_train, X_test, y_train, y_test : X float32 (C-contiguous), y int64 in 0..9.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    test_size, random_state = _check_split(test_size, random_state)
    if not isinstance(flat, (bool, np.bool_)):
        raise TypeError(f"flat: must be True or False, got {type(flat).__name__} {flat!r}")
    X, y = load_digits(return_X_y=True)
    n_test = int(np.ceil(test_size * len(y)))          # as train_test_split counts
    if min(n_test, len(y) - n_test) < 10:
        raise ValueError(f"test_size: {test_size} holds out {n_test} of {len(y)} images; a "
                         "stratified split needs each of the 10 classes in both parts: use "
                         f"a test_size in [{10 / len(y):.4f}, {1 - 10 / len(y):.4f}]")
    X = (X / 16.0).astype(np.float32)
    Xtr, Xte, ytr, yte = train_test_split(X, y.astype(np.int64), test_size=test_size,
                                          random_state=random_state, stratify=y)
    shape = (-1, 64) if flat else (-1, 1, 8, 8)
    return (np.ascontiguousarray(Xtr.reshape(shape)), np.ascontiguousarray(Xte.reshape(shape)),
            ytr, yte)


def _distort(images, rng, *, shift, degrees, alpha, sigma):
    """Every image (n, 8, 8) moved by one random map: a rotation about the centre by
    up to ``degrees``, a shift of up to ``shift`` pixels along each axis, and an
    elastic displacement (a uniform [-1, 1] field per pixel and axis, smoothed by a
    Gaussian of ``sigma`` pixels and scaled by ``alpha``); sampled bilinearly, zero
    outside the image."""
    from scipy.ndimage import gaussian_filter, map_coordinates
    n, h, w = images.shape
    theta = np.deg2rad(rng.uniform(-degrees, degrees, n))[:, None, None]
    dr = rng.uniform(-shift, shift, n)[:, None, None]
    dc = rng.uniform(-shift, shift, n)[:, None, None]
    field = rng.uniform(-1.0, 1.0, (2, n, h, w))
    field = gaussian_filter(field, sigma=(0, 0, sigma, sigma), mode="constant")
    field *= alpha
    r, c = np.mgrid[0:h, 0:w].astype(np.float64)
    r, c = r - (h - 1) / 2.0, c - (w - 1) / 2.0
    cos, sin = np.cos(theta), np.sin(theta)
    # where each output pixel reads from: the inverse rotation of its position, shifted
    rows = cos * r - sin * c + (h - 1) / 2.0 + dr + field[0]
    cols = sin * r + cos * c + (w - 1) / 2.0 + dc + field[1]
    idx = np.broadcast_to(np.arange(n, dtype=np.float64)[:, None, None], rows.shape)
    out = map_coordinates(images.astype(np.float64), [idx, rows, cols], order=1,
                          mode="constant", cval=0.0)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def make_digits_augmented(n_samples=50_000, *, test_size=0.2, random_state=0, shift=1.0,
                          degrees=12.0, alpha=1.5, sigma=1.0, flat=False):
    """A larger training set derived from the handwritten digits, and the untouched
    held-out images.

    The digits are split as :func:`load_digits_split` splits them (``test_size``,
    ``random_state``). The training set holds the training images themselves and,
    up to ``n_samples``, copies of them (drawn uniformly, so the classes keep their
    proportions) each moved by its own random map: a rotation about the centre by up to
    ``degrees``, a shift of up to ``shift`` pixels along each axis (uniform, sub-pixel),
    and an elastic distortion (Simard, Steinkraus, Platt, "Best practices for
    convolutional neural networks applied to visual document analysis", ICDAR 2003): a
    random displacement field, uniform in [-1, 1] per pixel and axis, smoothed by a
    Gaussian of ``sigma`` pixels and scaled by ``alpha`` pixels; the image is resampled
    bilinearly, zero outside. The defaults are Simard's (sigma 4, alpha 34 on 28x28
    images) scaled to 8x8 and kept mild, so that a distorted digit stays legible. The
    held-out images are never used to make training images: held-out accuracy measures
    generalisation to other writers' digits (sklearn's set has 43 writers, mixed in
    both parts).

    The result is seeded (the same arguments give the same arrays) and kept in memory
    for the life of the process (a second call returns copies without recomputing;
    ``random_state=None`` draws a fresh set every call); nothing is written to disk.

    Returns
    -------
    X_train (n_samples, 1, 8, 8) float32, X_test, y_train (int64, 0..9), y_test; with
    ``flat=True`` X has rows of 64 pixels. The training rows are shuffled.
    """
    n_samples = check_int("n_samples", n_samples)
    test_size, random_state = _check_split(test_size, random_state)
    shift = check_number("shift", shift, lo=0, hi=3)
    degrees = check_number("degrees", degrees, lo=0, hi=45)
    alpha = check_number("alpha", alpha, lo=0)
    sigma = check_number("sigma", sigma, lo=0, lo_open=True)
    if not isinstance(flat, (bool, np.bool_)):
        raise TypeError(f"flat: must be True or False, got {type(flat).__name__} {flat!r}")
    key = ("augmented", n_samples, test_size, random_state, shift, degrees, alpha, sigma)
    if key not in _DIGITS_CACHE or random_state is None:
        Xtr, Xte, ytr, yte = load_digits_split(test_size, random_state=random_state)
        if n_samples < Xtr.shape[0]:
            raise ValueError(f"n_samples: must be at least the {Xtr.shape[0]} training "
                             f"images it derives from, got {n_samples}; use "
                             "load_digits_split for the images alone")
        rng = np.random.default_rng(None if random_state is None else
                                    [0xD161, random_state])
        src = rng.integers(0, Xtr.shape[0], n_samples - Xtr.shape[0])
        moved = _distort(Xtr[src, 0], rng, shift=shift, degrees=degrees, alpha=alpha,
                         sigma=sigma)
        X = np.concatenate([Xtr[:, 0], moved])
        y = np.concatenate([ytr, ytr[src]])
        order = rng.permutation(n_samples)
        X, y = X[order][:, None], y[order]
        for a in (X, y, Xte, yte):
            a.setflags(write=False)
        _DIGITS_CACHE[key] = (X, Xte, y, yte)
    X, Xte, y, yte = _DIGITS_CACHE[key]
    if flat:
        X, Xte = X.reshape(-1, 64), Xte.reshape(-1, 64)
    return (np.array(X, order="C"), np.array(Xte, order="C"), y.copy(), yte.copy())
