"""The Hogwild estimators' per-epoch record, ``history_``, with held-out scores.

``fit(X, y, eval_set=(X_val, y_val))`` scores the model on the held-out data after
every epoch. Each fit sets ``history_`` (``partial_fit`` appends to it): one dict per
epoch with ``seconds`` (of training, since ``fit`` was called), ``step`` (the epoch,
counted from 1), ``loss`` (the estimator's
training loss of that epoch, as in ``loss_curve_``) and, with ``eval_set``,
``val_score`` (held-out accuracy for a classifier, R^2 for a regressor: the
estimator's ``score``; matrix factorisation records ``val_rmse``, the held-out RMSE,
lower is better). The records have the
keys of the trainers' histories (:mod:`sgd_shm.core.results`), so the same plots
and ``time_to``-style questions apply to them.
"""
from __future__ import annotations

import time


class EpochHistory:
    """The record of one fit: ``start`` it, ``add`` one record per epoch; ``scorer``
    (a callable of no arguments, or None) gives the held-out score of the model as it
    is at the end of the epoch."""

    def __init__(self, scorer=None, records=None, key="val_score"):
        self.t0 = time.perf_counter()
        self.scorer, self.key = scorer, key
        self.records = [] if records is None else records      # partial_fit: go on
        self.t_off = self.records[-1]["seconds"] if self.records else 0.0

    def add(self, step, loss) -> dict:
        """Append (and return) the record of epoch ``step`` with training ``loss``."""
        rec = {"seconds": self.t_off + time.perf_counter() - self.t0, "step": int(step),
               "loss": float(loss)}
        if self.scorer is not None:
            rec[self.key] = float(self.scorer())
        self.records.append(rec)
        return rec


def score_note(rec) -> str:
    """The held-out part of an epoch's log line ('' without held-out data)."""
    if "val_score" in rec:
        return f", held-out score {rec['val_score']:.6f}"
    return f", held-out RMSE {rec['val_rmse']:.4f}" if "val_rmse" in rec else ""
