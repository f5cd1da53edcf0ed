"""The argument checks every public entry point of the kit uses.

Each check returns the value in its canonical type or raises with the argument's
name, the rule and the value: :class:`~sgd_shm.core.errors.ParameterError` (a
``TypeError``) for a value of the wrong type (``lr="0.1"``, ``progress="yes"``), a
``ValueError`` for a value out of range. The data checks (:func:`model_data`,
:func:`model_X`) read a matrix and its labels for a :class:`~sgd_shm.core.model.Model`.

Conventions the trainers share: ``n_workers=-1`` means every CPU of this machine
(:func:`resolve_workers`, as scikit-learn's ``n_jobs=-1``); a trainer's seed is
``seed`` and an estimator's ``random_state`` (scikit-learn's name), both an int >= 0
or None (:func:`check_seed`).
"""
from __future__ import annotations

import math
import numbers
import os
import sys
import warnings

import numpy as np
import scipy.sparse as sp

from sgd_shm.core.errors import ParameterError

__all__ = ["check_int", "check_number", "check_positive", "check_bool", "check_choice", "check_seed",
           "resolve_workers", "n_columns", "model_data", "model_X", "check_eval_set", "eval_pair",
           "check_callbacks", "model_dtype", "check_shards", "DEFAULT_SHARDS", "warn_caller"]

#: the parameter server's weight shards when ``n_shards`` is not given (or the model's
#: weights, where it has fewer)
DEFAULT_SHARDS = 8


def warn_caller(message, category=UserWarning):
    """``warnings.warn``, attributed to the first frame outside the kit: the user's call,
    however deep in the kit the rule that warns sits."""
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in (
            "sgd_shm", "relaxed"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v):
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def check_int(name, v, lo=1, hi=None) -> int:
    """``v`` as an int in [lo, hi] (hi None: no upper bound)."""
    if not _is_int(v):
        raise ParameterError(f"{name}: must be an int, got {type(v).__name__} {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rule = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: must be an int {rule}, got {v!r}")
    return int(v)


def check_shards(n_shards, n_params) -> int:
    """The weight shards of a parameter-server run over ``n_params`` weights: ``n_shards``
    (an int >= 1, or None: ``DEFAULT_SHARDS``, or ``n_params`` where the model has fewer).
    Every shard owns a weight at least, so asking for more shards than weights is an
    error, not cut down silently."""
    if n_shards is None:
        return min(DEFAULT_SHARDS, int(n_params))
    n_shards = check_int("n_shards", n_shards)
    if n_shards > n_params:
        raise ValueError(f"n_shards: {n_shards} shards for {n_params} weights; every shard "
                         f"must own at least one weight; use n_shards <= {n_params}, or "
                         "n_shards=None")
    return n_shards


def check_number(name, v, lo=None, hi=None, lo_open=False, hi_open=False) -> float:
    """``v`` as a finite float in the range given (open or closed at each end)."""
    if not _is_real(v):
        raise ParameterError(f"{name}: must be a number, got {type(v).__name__} {v!r}")
    v = float(v)
    bad = not math.isfinite(v)
    bad = bad or (lo is not None and (v <= lo if lo_open else v < lo))
    bad = bad or (hi is not None and (v >= hi if hi_open else v > hi))
    if bad:
        lo_s = "" if lo is None else f"{'>' if lo_open else '>='} {lo}"
        hi_s = "" if hi is None else f"{'<' if hi_open else '<='} {hi}"
        rule = " and ".join(s for s in (lo_s, hi_s) if s)
        raise ValueError(f"{name}: must be a finite number{' ' + rule if rule else ''}, "
                         f"got {v!r}")
    return v


def check_positive(name, v) -> float:
    """``v`` as a finite float > 0 (a step, a duration, a period)."""
    return check_number(name, v, lo=0, lo_open=True)


def check_momentum(v, name="momentum") -> float:
    """Heavy-ball momentum: a finite number in [0, 1) (0: plain SGD)."""
    v = check_number(name, v, lo=0)
    if v >= 1.0:
        raise ValueError(f"{name}: must be < 1, got {v}; 0.9 is usual (0: plain SGD)")
    return v


def check_bool(name, v) -> bool:
    """``v`` as a bool (True/False or numpy's bool; no strings, no ints)."""
    if not isinstance(v, (bool, np.bool_)):
        raise ParameterError(f"{name}: must be True or False, got {type(v).__name__} {v!r}")
    return bool(v)


def check_faults(faults, n_workers) -> dict:
    """``faults`` ({worker: seconds}: the worker dies that many seconds into the run)
    as {int: float}; None: none."""
    if faults is None:
        return {}
    if not isinstance(faults, dict):
        raise TypeError(f"faults: expected {{worker: seconds}} (a dict), got "
                        f"{type(faults).__name__} {faults!r}")
    out = {}
    for k, t in faults.items():
        if not _is_int(k) or not 0 <= k < n_workers:       # (True was worker 1)
            raise (ValueError if _is_int(k) else ParameterError)(
                f"faults: expected {{worker in [0, {n_workers}): seconds >= 0}}, got "
                f"{{{k!r}: {t!r}}}")
        out[int(k)] = check_number("faults", t, lo=0)
    return out


def check_verbose(v) -> int:
    """An estimator's ``verbose``: a bool or an int >= 0 (as scikit-learn's)."""
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    return check_int("verbose", v, lo=0)


def check_choice(name, v, options):
    """``v`` if it is one of ``options``."""
    if v not in options:
        raise ValueError(f"{name}: must be one of {tuple(options)}, got {v!r}")
    return v


def check_seed(name, v):
    """A seed: None (fresh entropy) or an int >= 0."""
    if v is None:
        return None
    if not _is_int(v):
        raise ParameterError(f"{name}: must be an int >= 0 or None, got {type(v).__name__} "
                             f"{v!r}")
    if v < 0:
        raise ValueError(f"{name}: must be an int >= 0 or None, got {v!r}")
    return int(v)


def resolve_workers(n_workers, name="n_workers") -> int:
    """``n_workers`` as a count: an int >= 1, or -1 for every CPU of this machine (as
    scikit-learn's ``n_jobs=-1``)."""
    if _is_int(n_workers) and n_workers == -1:
        return os.cpu_count() or 1
    if not _is_int(n_workers):
        raise ParameterError(f"{name}: must be an int >= 1 or -1 (every CPU), got "
                             f"{type(n_workers).__name__} {n_workers!r}")
    if n_workers < 1:
        raise ValueError(f"{name}: must be an int >= 1 or -1 (every CPU), got {n_workers!r}")
    return int(n_workers)


def check_callbacks(callbacks) -> tuple:
    """``callbacks`` as a tuple of callables (None: none; one callable: one)."""
    if callbacks is None:
        return ()
    if callable(callbacks):
        return (callbacks,)
    try:
        out = tuple(callbacks)
    except TypeError:
        raise ParameterError(f"callbacks: expected a callable or a sequence of them, got "
                             f"{type(callbacks).__name__}") from None
    for c in out:
        if not callable(c):
            raise ParameterError(f"callbacks: every entry must be callable (called with "
                                 f"each history record), got {type(c).__name__} {c!r}")
    return out


def _numeric(X, dtype, name):
    """X as a C-contiguous array of ``dtype``; strings, bytes and values that do not
    convert are a ValueError naming ``name`` (numpy would parse numeric strings)."""
    if not hasattr(X, "dtype"):
        X = np.asarray(X)
    if X.dtype.kind in ("U", "S"):
        raise ValueError(f"{name}: expected numbers, got an array of strings; convert the "
                         "data to numbers first (e.g. X.astype(float) or an encoder)")
    try:
        return np.ascontiguousarray(X, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: expected numbers, and a value does not convert to "
                         f"{np.dtype(dtype).name} ({e}); convert the data to numbers "
                         "first") from None


def _matrix(X, name="X"):
    X = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else \
        _numeric(X, np.float64, name)
    if X.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D matrix, got {X.ndim} dimensions")
    if not np.isfinite(X.data if sp.issparse(X) else X).all():
        raise ValueError(f"{name}: contains NaN or inf; clean or impute the data first")
    return X


def n_columns(X) -> int:
    """The number of values of one sample of X: the columns of a matrix, or, for an
    array of samples of more than one dimension (images (n, C, H, W) for a model with
    an ``input_shape``), the size of one sample. A ValueError for fewer than 2
    dimensions."""
    shape = X.shape if hasattr(X, "shape") else np.shape(X)
    if len(shape) < 2:
        raise ValueError(f"X: expected a 2-D matrix (or an array of samples shaped like a "
                         f"model's input_shape), got {len(shape)} dimensions")
    return int(np.prod(shape[1:]))


def _samples(X, model, name="X"):
    """X for a model with an ``input_shape``: a C-contiguous array of the model's
    ``dtype`` shaped (n, *input_shape); a matrix of n_features columns is reshaped
    (a copy only where the dtype or the layout differ)."""
    shape, dtype = tuple(model.input_shape), np.dtype(getattr(model, "dtype", np.float64))
    if sp.issparse(X):
        raise TypeError(f"{name}: this model takes a dense array shaped (n, *{shape}), got a "
                        "sparse matrix; pass X.toarray()")
    X = _numeric(X, dtype, name)
    if X.ndim == 2 and X.shape[1] == model.n_features and len(shape) != 1:
        X = X.reshape((X.shape[0],) + shape)
    if X.shape[1:] != shape:
        raise ValueError(f"{name}: expected samples shaped {shape} (the model's input_shape), "
                         f"i.e. an array ({'n, ' + ', '.join(map(str, shape))}) or a matrix of "
                         f"{model.n_features} columns, got shape {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError(f"{name}: contains NaN or inf; clean or impute the data first")
    return X


def model_data(X, y, model, n_workers):
    """(X as float64 CSR or C-contiguous dense, y as class indices 0..C-1, the C
    classes) for a run of ``model``, checked: 2-D, finite, the model's n_features, as
    many classes as its n_outputs, as many labels as rows, a row per worker at least.
    For a model with an ``input_shape``, X is instead an array (n, *input_shape) of the
    model's ``dtype`` (a matrix of n_features columns is reshaped to it)."""
    if getattr(model, "input_shape", None) is not None:
        X = _samples(X, model)
    else:
        X = _matrix(X)
        if X.shape[1] != model.n_features:
            raise ValueError(f"model: built for n_features={model.n_features}, but X has "
                             f"{X.shape[1]} features; make the model with "
                             "n_features=X.shape[1]")
    y = np.asarray(y)
    if y.shape != (X.shape[0],):
        raise ValueError(f"X has {X.shape[0]} rows but y has shape {y.shape}")
    if y.dtype.kind in "fc":                     # float labels must still be class labels
        if not np.isfinite(y).all():
            raise ValueError("y: holds NaN or infinite labels; drop those rows or fill them in")
        if not np.array_equal(y, np.round(y.real)):
            raise ValueError("y: holds non-integer values (regression targets?); the trainers "
                             "train classifiers on class labels (the linear model's "
                             "squared_error too: its labels map to ±1); for regression use "
                             "sgd_shm.HogwildRegressor")
    classes, idx = np.unique(y, return_inverse=True)
    if classes.size < 2:
        raise ValueError(f"y: holds a single class ({classes[:1].tolist()}); a classifier "
                         "learns from at least two, so give data with both labels")
    if classes.size != model.n_outputs:
        want = "two classes" if model.n_outputs == 2 else f"{model.n_outputs} classes"
        example = ("a network whose last layer has that many outputs"
                   if getattr(model, "input_shape", None) is not None
                   else "e.g. sgd_shm.models.SoftmaxRegression")
        raise ValueError(f"y: expected {want} (the model's n_outputs), got {classes.size} "
                         f"({classes[:5].tolist()}); for {classes.size} classes pass a model "
                         f"with n_outputs={classes.size} ({example})")
    if X.shape[0] < n_workers:
        raise ValueError(f"n_workers: X has only {X.shape[0]} rows, fewer than the {n_workers} "
                         "workers (each needs a partition); use fewer workers")
    return X, idx.astype(np.int64).ravel(), classes


def model_X(X, model, name="X"):
    """X for ``model``'s predictions: float64 CSR or dense, with its n_features (for a
    model with an ``input_shape``: as :func:`model_data` checks it)."""
    if getattr(model, "input_shape", None) is not None:
        return _samples(X, model, name)
    X = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else np.asarray(X, np.float64)
    if X.ndim != 2 or X.shape[1] != model.n_features:
        raise ValueError(f"{name}: expected a 2-D matrix with {model.n_features} features, got "
                         f"shape {X.shape}")
    if not np.isfinite(X.data if sp.issparse(X) else X).all():
        raise ValueError(f"{name}: contains NaN or infinite values; a prediction from them "
                         "is meaningless (impute or drop those rows)")
    return X


#: the float types a trainer keeps a model's weights, gradients and messages in
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def check_float_dtype(name, value, fix) -> np.dtype:
    """``value`` as np.float32 or np.float64 (the two float types a run's buffers
    take); anything else is a ParameterError (a TypeError) naming ``name`` and ``fix``."""
    try:
        got = None if value is None else np.dtype(value)    # (np.dtype(None) is float64)
    except TypeError:
        got = None
    if got is None or got not in FLOAT_DTYPES:
        raise ParameterError(f"{name}: must be np.float32 or np.float64 (the float type of "
                             f"the weights, gradients and messages a trainer keeps), got "
                             f"{value!r}; {fix}")
    return got


def model_dtype(model) -> np.dtype:
    """The float type of ``model``'s buffers (its ``dtype``: float64 for the kit's
    models, float32 for one that computes in it, e.g. a torch module), which every
    buffer of a run takes: the weights, the gradients, the messages and the
    error-feedback memory. Anything else is a ParameterError (a TypeError)."""
    return check_float_dtype("model.dtype", getattr(model, "dtype", np.float64),
                             f"set dtype = np.float32 or np.float64 on "
                             f"{type(model).__name__}'s class")


def eval_pair(eval_set):
    """(X_val, y_val) from ``eval_set`` (None passes through), or a ParameterError (a
    TypeError) that says what to pass."""
    if eval_set is None:
        return None
    try:
        Xv, yv = eval_set
    except (TypeError, ValueError):
        raise ParameterError("eval_set: expected a pair (X_val, y_val) of held-out data, got "
                             f"{type(eval_set).__name__}; pass eval_set=(X_test, y_test)"
                             ) from None
    return Xv, yv


def check_eval_set(eval_set, model, classes):
    """(X, y as class indices) of held-out data, or None: X with the model's features,
    y labels among the training ``classes``."""
    if eval_set is None:
        return None
    Xv, yv = eval_pair(eval_set)
    Xv = model_X(Xv, model, "eval_set")
    if Xv.shape[0] == 0:
        raise ValueError("eval_set: X_val has no rows; pass held-out data, or None")
    yv = np.asarray(yv)
    if yv.shape != (Xv.shape[0],):
        raise ValueError(f"eval_set: X_val has {Xv.shape[0]} rows but y_val has shape "
                         f"{yv.shape}")
    pos = np.searchsorted(classes, yv)
    pos = np.minimum(pos, classes.size - 1)
    if not np.array_equal(classes[pos], yv):
        raise ValueError("eval_set: y_val holds labels that are not among the training "
                         f"classes {classes[:5].tolist()}")
    return Xv, pos.astype(np.int64)


#: the epochs a trainer runs when it is given neither ``epochs`` nor ``max_seconds``
DEFAULT_EPOCHS = 5


def stopping_rule(epochs, max_seconds, check_epochs):
    """(epochs, max_seconds) of a run. Epochs are the default rule (a run repeats its
    work whatever the machine's load): with neither given, ``DEFAULT_EPOCHS``; the
    wall clock is an option (``max_seconds``; ``math.inf`` when None). With both, the
    run stops at whichever comes first. ``check_epochs(name, v)`` checks epochs."""
    if epochs is None and max_seconds is None:
        epochs = DEFAULT_EPOCHS
    epochs = None if epochs is None else check_epochs("epochs", epochs)
    return epochs, math.inf if max_seconds is None else check_positive("max_seconds",
                                                                      max_seconds)


def check_drop(drop, pol, compress):
    """The message-loss probability of a parameter-server run (``drop=``) under policy
    ``pol`` (a :class:`sgd_shm.core.policies.Policy`) and compressor ``compress``, as
    the trainer and the simulator accept it: None (reliable, the plain path) or a float
    in [0, 1); RPS always counts its messages (drop None -> 0.0)."""
    if drop is not None:
        if isinstance(drop, bool) or not isinstance(drop, (int, float, np.integer,
                                                           np.floating)) \
                or not 0 <= drop < 1:
            raise ValueError(f"drop: the probability that a message is lost must be a number "
                             f"in [0, 1) (1 would lose every message), got {drop!r}; e.g. "
                             "drop=0.1")
        if not pol.tolerates_loss:
            raise ValueError(f"drop: policy {pol.name!r} cannot lose messages (its gate counts "
                             "pushes, and a lost push would stall it); use policy='rps' "
                             "(model averaging that tolerates loss) or 'asp', or leave "
                             "drop=None")
    if pol.replicated:
        if compress is not None:
            raise ValueError(f"compress: policy {pol.name!r} sends model blocks, not gradients, "
                             "and error feedback does not apply to them; leave compress=None")
        return 0.0 if drop is None else float(drop)
    return None if drop is None else float(drop)
