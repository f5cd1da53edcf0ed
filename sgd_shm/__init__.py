"""sgd_shm: lock-free shared-memory SGD built on the ``relaxed`` structures.

This package holds the training side of the kit (Hogwild SGD, estimators and the
parameter server). Nothing is exported yet: see the issue tracker for the
planned pieces. It exists now so that the import direction of the kit
(``sgd_shm`` may use ``relaxed``, never the other way) is fixed from the start.
"""
__all__: list[str] = []
