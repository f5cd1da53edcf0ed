"""The errors every trainer of the kit raises alike."""
from __future__ import annotations

__all__ = ["DivergenceError", "ParameterError", "WorkerError"]


class DivergenceError(FloatingPointError, ValueError):
    """Training produced non-finite weights, gradients or predictions (the step is too
    large for the problem). Hogwild, the parameter server and eager-SGD all raise it;
    it is a ``FloatingPointError`` (and, as before, a ``ValueError``)."""


class ParameterError(TypeError, ValueError):
    """An argument of the wrong type. A ``TypeError``, and a ``ValueError`` too so
    that code which caught the ``ValueError`` that some arguments used to raise keeps
    working (scikit-learn's ``InvalidParameterError`` does the same)."""


class WorkerError(RuntimeError):
    """A worker process of a fit (Hogwild's processes backend, matrix factorization, the
    MLP, Hogwild on a torch module) raised or died. The message names each failed worker
    and its traceback or exit code; training has stopped and its shared memory is gone."""
