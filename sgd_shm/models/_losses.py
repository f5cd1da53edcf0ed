"""The losses of the kit's linear models, as Numba functions of the prediction p and
the label y (in {-1, +1} for the classification losses): their codes, the loss and
its derivative. Shared by the linear :class:`sgd_shm.models.Linear` (parameter server,
eager-SGD) and Hogwild's kernels, so that every trainer optimises the same function.
The formulas are scikit-learn's (``sklearn.linear_model._sgd_fast``): log loss with
its overflow guards at |z| > 18, hinge, modified Huber (Zhang 2004) and squared error.
"""
from __future__ import annotations

import math

import numba as nb

# loss codes
LOG, HINGE, SQUARED, MODIFIED_HUBER = 0, 1, 2, 3
#: name -> code
LOSSES = {"log_loss": LOG, "hinge": HINGE, "squared_error": SQUARED,
          "modified_huber": MODIFIED_HUBER}
#: the loss derivative is clipped to +-MAX_DLOSS (as scikit-learn does); clips are counted
MAX_DLOSS = 1e12


@nb.njit(cache=True, nogil=True, inline="always")
def dloss(code, p, y):
    """Derivative of the loss ``code`` with respect to the prediction p."""
    if code == LOG:
        z = p * y
        if z > 18.0:
            return -y * math.exp(-z)
        if z < -18.0:
            return -y
        return -y / (math.exp(z) + 1.0)
    if code == HINGE:
        return -y if p * y < 1.0 else 0.0
    if code == MODIFIED_HUBER:
        z = p * y
        if z >= 1.0:
            return 0.0
        if z >= -1.0:
            return -2.0 * (1.0 - z) * y
        return -4.0 * y
    return p - y          # squared


@nb.njit(cache=True, nogil=True, inline="always")
def loss(code, p, y):
    """The loss ``code`` of the prediction p for the label y."""
    if code == LOG:
        z = p * y
        if z > 18.0:
            return math.exp(-z)
        if z < -18.0:
            return -z
        return math.log1p(math.exp(-z))
    if code == HINGE:
        return max(0.0, 1.0 - p * y)
    if code == MODIFIED_HUBER:
        z = p * y
        if z >= 1.0:
            return 0.0
        if z >= -1.0:
            return (1.0 - z) * (1.0 - z)
        return -4.0 * z
    return 0.5 * (p - y) * (p - y)
