"""sgd_shm.models: every model the kit trains, on flat float64 weights.

    Model               the contract (sgd_shm.core.model): init, prepare, grad /
                        loss_grad, loss, decision_function, predict_proba, predict, blocks
    Linear              L2-regularised linear losses (log loss, hinge, modified Huber,
                        squared error): the parameter server's and eager-SGD's default
    SoftmaxRegression   multinomial logistic regression
    MLP                 ReLU hidden layers and a softmax output (as MLPClassifier)
    one_blas_thread     BLAS on one thread (for a block, or from now on)

Every trainer takes any ``Model`` (``sgd_shm.ps.train(model=...)``,
``sgd_shm.eager.train(model=...)``, ``HogwildMLPClassifier``); see docs/models.md for
writing your own.
"""
from sgd_shm.core.model import Model, one_blas_thread
from sgd_shm.models.linear import Linear
from sgd_shm.models.mlp import MLP, SoftmaxRegression, scratch

__all__ = ["Model", "Linear", "MLP", "SoftmaxRegression", "one_blas_thread", "scratch"]
