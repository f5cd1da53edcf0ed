"""The results of the trainers: one family, the same record in every trainer.

A :class:`Result` carries the trained model and the run's record:

* ``history``: one record per sample of the run, each a dict with the same keys in
  every trainer: ``seconds`` (since the start), ``step`` (the parameter server: the
  global version, i.e. pushes applied in full; eager-SGD: the round) and ``loss`` (the
  training loss, regulariser included, on a fixed sample of up to 4096 rows); given
  ``eval_set=(X_val, y_val)``, also ``val_loss`` and ``val_score`` (the held-out loss
  and accuracy on a fixed sample of up to 4096 held-out rows; the last record's on
  all of them), measured by one :class:`Evaluator`;
* ``final_loss``, ``seconds``, ``time_to_target`` (seconds until the loss first
  reached ``target_loss``; None if it did not or none was given);
  :meth:`Result.time_to_score` (seconds until the held-out accuracy first reached a
  level);
* ``val_loss`` and ``val_score`` (the final model's loss and accuracy on all the
  held-out data) when the trainer was given ``eval_set``, else None;
* ``coef_`` (the flat weights), ``classes_``, ``model``; ``decision_function``,
  ``predict``, ``score`` and, where the model gives probabilities, ``predict_proba``
  (an attribute error otherwise, so ``hasattr`` tells);
* ``to_dict()``: everything above as JSON-safe values (no arrays; the weights are
  left out, the model is its repr).

The trainers' results (``sgd_shm.ps.TrainResult``, ``sgd_shm.eager.EagerResult``)
are dataclasses that add their own record; their repr is one short line.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from sgd_shm.core.validation import model_X

__all__ = ["Result", "HISTORY_KEYS", "EVAL_KEYS", "Evaluator", "json_safe", "held_out",
           "figure"]

#: the keys of every history record, in every trainer
HISTORY_KEYS = ("seconds", "step", "loss")
#: the keys a history record adds when the trainer has held-out data
EVAL_KEYS = ("val_loss", "val_score")
#: rows of the fixed samples a history record is measured on
SAMPLE_ROWS = 4096


def json_safe(v):
    """``v`` with numpy scalars and arrays as Python numbers and lists, tuples as lists,
    non-finite floats as None, other objects as their repr."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, np.ndarray):
        return json_safe(v.tolist())
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if v is None or isinstance(v, str):
        return v
    return repr(v)


class Result:
    """The base of the trainers' results (see the module notes). Subclasses are
    dataclasses with ``history``, ``final_loss``, ``seconds``, ``time_to_target``,
    ``coef_``, ``classes_``, ``model``, ``val_loss`` and ``val_score``."""

    #: the fields a short repr shows (beside the class name)
    _repr_fields: tuple = ("final_loss", "val_score", "seconds")

    def __repr__(self):
        parts = []
        for f in self._repr_fields:
            v = getattr(self, f, None)
            if v is None:
                continue
            parts.append(f"{f}={v:.4g}" if isinstance(v, float) else f"{f}={v!r}")
        parts.append(f"history=[{len(self.history)} records]")
        return f"{type(self).__name__}({', '.join(parts)})"

    def time_to(self, target) -> float | None:
        """Seconds of the first record whose loss is <= target (None: not reached)."""
        return next((h["seconds"] for h in self.history if h["loss"] <= target), None)

    def time_to_score(self, target) -> float | None:
        """Seconds of the first record whose held-out accuracy is >= target (None: not
        reached). Needs a run given ``eval_set``."""
        if not self.history or "val_score" not in self.history[-1]:
            raise ValueError("time_to_score: this run recorded no held-out accuracy; pass "
                             "eval_set=(X_val, y_val) to the trainer")
        return next((h["seconds"] for h in self.history if h["val_score"] >= target), None)

    def _X(self, X):
        return model_X(X, self.model)

    def decision_function(self, X) -> np.ndarray:
        """The model's scores of the rows of X."""
        return self.model.decision_function(self.coef_, self._X(X))

    @property
    def predict_proba(self):
        """Class probabilities (n_samples, classes): only where the model gives them
        (an AttributeError otherwise, so ``hasattr(result, "predict_proba")`` tells)."""
        if not self.model.has_proba:
            raise AttributeError(f"predict_proba: {self.model!r} gives no probabilities; "
                                 "use decision_function")
        return lambda X: self.model.predict_proba(self.coef_, self._X(X))

    def predict(self, X) -> np.ndarray:
        """The predicted labels (among ``classes_``)."""
        return self.classes_[self.model.predict(self.coef_, self._X(X))]

    def score(self, X, y) -> float:
        """Accuracy of :meth:`predict` on (X, y)."""
        pred, y = self.predict(X), np.asarray(y)
        if y.shape != pred.shape:
            raise ValueError(f"y: expected one label per row of X, shape {pred.shape}, got "
                             f"shape {y.shape}")
        return float(np.mean(pred == y))

    def to_dict(self) -> dict:
        """The result as JSON-safe values: every field but the weights, the model as
        its repr, plus ``updates`` and the other derived figures a subclass names."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name == "coef_":
                continue
            out[f.name] = json_safe(getattr(self, f.name))
        for name in getattr(self, "_derived", ()):
            out[name] = json_safe(getattr(self, name))
        return out


def _spread(n, rows):
    """Up to ``rows`` row indices spread evenly over 0..n-1 (a fixed sample that
    draws nothing from the run's generator)."""
    return np.unique(np.linspace(0, n - 1, min(rows, n)).astype(np.int64))


class Evaluator:
    """What a history record measures, the same in every trainer: the model's training
    loss on a fixed sample of the training rows and, given held-out data, its loss and
    accuracy on a fixed sample of up to ``rows`` held-out rows (``final=True``: on all
    of them). Pickles (it travels to eager-SGD's ranks).

    ``sample_rows``: the training rows of the loss sample (as the trainer drew them);
    ``eval_data``: (X_val, y_val as class indices), as
    :func:`sgd_shm.core.validation.check_eval_set` returns, or None."""

    def __init__(self, model, X, yi, sample_rows, eval_data=None, rows=SAMPLE_ROWS):
        self.model = model
        self.sample = model.prepare(X[sample_rows], yi[sample_rows])
        self.val = self.full = None
        if eval_data is not None:
            Xv, yv = eval_data
            r = _spread(Xv.shape[0], rows)
            self.val = (model.prepare(Xv[r], yv[r]), Xv[r], yv[r])
            self.full = eval_data

    def loss(self, w) -> float:
        """The training loss on the fixed sample."""
        return float(self.model.loss(w, self.sample))

    def __call__(self, w, final=False) -> dict:
        """{"loss": ...} and, with held-out data, "val_loss" and "val_score"."""
        out = {"loss": self.loss(w)}
        if self.val is not None:
            if final:
                out["val_loss"], out["val_score"] = held_out(self.model, w, self.full)
            else:
                data, Xv, yv = self.val
                out["val_loss"] = float(self.model.loss(w, data))
                out["val_score"] = float(np.mean(self.model.predict(w, Xv) == yv))
        return out


def held_out(model, w, eval_data):
    """(val_loss, val_score) of weights ``w`` on ``eval_data`` (X, y class indices,
    as :func:`sgd_shm.core.validation.check_eval_set` returns; None: (None, None))."""
    if eval_data is None:
        return None, None
    Xv, yv = eval_data
    data = model.prepare(Xv, yv)
    return float(model.loss(w, data)), float(np.mean(model.predict(w, Xv) == yv))


def figure(fig, size):
    """``fig`` if given (checked), else a new Figure of ``size`` inches outside pyplot."""
    from matplotlib.figure import Figure      # no pyplot: the caller's backend is left alone
    if fig is None:
        return Figure(figsize=size)
    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib.figure.Figure (e.g. plt.figure()), got "
                        f"{type(fig).__name__}; pass fig=None for a new one")
    return fig
