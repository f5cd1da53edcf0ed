"""PyTorch Hogwild in the style of its ``mnist_hogwild`` example, as a reference point
for ``python -m bench hogwild --torch`` (optional: needs ``torch``, not a dependency).

As in the example: one ``nn.Linear`` model whose parameters are put in shared memory
(``model.share_memory()``), ``n_workers`` processes each running plain SGD
(``torch.optim.SGD``) over its part of a shuffled epoch in minibatches, without locks,
one intra-op thread per process. The data stay sparse: each minibatch is a
``torch.sparse_csr_tensor`` times the weights. Log loss (``BCEWithLogitsLoss``) with
weight decay ``alpha`` and a constant learning rate.
"""
from __future__ import annotations

import time

import multiprocess as mp
import numpy as np

from bench.hogwild import train_loss


def _train_part(model, X, y, rows, batch, lr, alpha, seed):
    import warnings

    import torch
    warnings.filterwarnings("ignore", message="Sparse")     # CSR support is "beta"
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=alpha)
    lossf = torch.nn.BCEWithLogitsLoss()
    yt = torch.from_numpy((y > 0).astype(np.float32))
    for lo in range(0, len(rows), batch):
        idx = rows[lo:lo + batch]
        sub = X[idx]
        xb = torch.sparse_csr_tensor(torch.from_numpy(sub.indptr.astype(np.int64)),
                                     torch.from_numpy(sub.indices.astype(np.int64)),
                                     torch.from_numpy(sub.data.astype(np.float32)),
                                     size=sub.shape)
        opt.zero_grad()
        out = torch.sparse.mm(xb, model.weight.t()).squeeze(1) + model.bias
        loss = lossf(out, yt[idx])
        loss.backward()
        opt.step()


def epoch_seconds(X, y, n_workers, *, batch=32, epochs=1, lr=0.1, alpha=1e-4, seed=0):
    """Seconds per epoch (median of ``epochs``) of the PyTorch Hogwild reference with
    ``n_workers`` processes, and its final training log loss."""
    import torch
    torch.manual_seed(seed)
    model = torch.nn.Linear(X.shape[1], 1)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    model.share_memory()
    rng = np.random.default_rng(seed)
    ctx = mp.get_context("fork")
    times = []
    for e in range(epochs):
        order = rng.permutation(X.shape[0])
        parts = np.array_split(order, n_workers)
        t0 = time.perf_counter()
        procs = [ctx.Process(target=_train_part,
                             args=(model, X, y, parts[w], batch, lr, alpha, seed + 97 * e + w))
                 for w in range(n_workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
            if p.exitcode != 0:
                raise RuntimeError(f"PyTorch worker exited with code {p.exitcode}")
        times.append(time.perf_counter() - t0)
    w = model.weight.detach().numpy().ravel().astype(np.float64)
    b = float(model.bias.detach().numpy()[0])
    return float(np.median(times)), train_loss(X, np.where(y > 0, 1.0, -1.0), w, b)
