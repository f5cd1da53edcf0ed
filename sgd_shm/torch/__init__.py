"""sgd_shm.torch: PyTorch models in the kit (the ``[torch]`` extra; CPU).

    TorchModel            an ``nn.Module`` plus a loss as a kit Model: its parameters are
                          views of one flat float32 buffer, gradients come from autograd
                          into the caller's buffer; for ``ps.train`` / ``eager.train``
    HogwildNetClassifier  Hogwild SGD of an ``nn.Module`` (threads or processes, momentum,
                          block partitioning by layer) with fit / predict / score
    DigitsCNN             the reference network: a LeNet-like CNN for 8x8 digits

Data for them: :func:`sgd_shm.data.load_digits_split` and
:func:`sgd_shm.data.make_digits_augmented`. Importing this package imports torch;
``import sgd_shm`` does not.

Example::

    from sgd_shm.data import load_digits_split
    from sgd_shm.torch import DigitsCNN, HogwildNetClassifier
    X, X_test, y, y_test = load_digits_split()
    clf = HogwildNetClassifier(DigitsCNN(seed=0), n_workers=2, lr=0.05, momentum=0.9,
                               max_epochs=10, random_state=0).fit(X, y)
    clf.score(X_test, y_test)
"""
import importlib as _importlib

#: the public names, each imported from its module on first use (PEP 562)
_LAZY = {"TorchModel": "sgd_shm.torch.model", "HogwildNetClassifier": "sgd_shm.torch.hogwild",
         "DigitsCNN": "sgd_shm.torch.nets"}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'sgd_shm.torch' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["TorchModel", "HogwildNetClassifier", "DigitsCNN"]
