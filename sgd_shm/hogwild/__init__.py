"""sgd_shm.hogwild: lock-free shared-memory SGD (Hogwild!, Niu, Recht, Ré, Wright 2011).

    Problem             training data laid out for the kernels (CSR or dense, hot-first)
    HogwildSGD          weights + schedule; ``epoch()`` runs n_workers lock-free workers
    DivergenceError     raised instead of returning NaN weights (sgd_shm.core.errors)

The estimators built on it (scikit-learn API) live beside it: ``estimators``
(HogwildClassifier, HogwildRegressor), ``mlp`` (HogwildMLPClassifier, any
sgd_shm.models.Model), ``mf`` (MatrixFactorization); they are exported by ``sgd_shm``.
"""
from sgd_shm.core.errors import DivergenceError
from sgd_shm.hogwild.engine import (AUTO_ALL_HOT_NNZ_PER_FEATURE, AUTO_HOT_FEATURES,
                                    AUTO_HOT_MIN_EPOCHS, AUTO_HOT_MIN_NNZ, HogwildSGD, Problem,
                                    auto_hot_features, clear_layout_cache, hot_rows,
                                    layout_kept, run_workers, staleness_summary)

__all__ = ["Problem", "HogwildSGD", "DivergenceError", "auto_hot_features", "run_workers",
           "staleness_summary", "clear_layout_cache", "hot_rows", "layout_kept",
           "AUTO_HOT_FEATURES", "AUTO_HOT_MIN_EPOCHS", "AUTO_HOT_MIN_NNZ",
           "AUTO_ALL_HOT_NNZ_PER_FEATURE"]
