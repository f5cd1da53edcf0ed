"""Plots of parameter-server runs (outside the training path: matplotlib is imported
only when a plot is drawn). The plots draw on a ``matplotlib.figure.Figure`` (the
caller's, or a new one that no pyplot state knows of) and return it: no backend is
chosen or switched, so they work the same in a script, a notebook or a server.

Example::

    from sgd_shm.ps import curves_of, plot_losses
    fig = plot_losses(curves_of(results), target=0.94)      # a Figure; nothing written
    fig.savefig("ps.png")                                   # or plot_losses(..., path=)
    # in a notebook: draw into a pyplot figure to show it inline
    # import matplotlib.pyplot as plt; plot_losses(curves, 0.94, fig=plt.figure())
"""
from __future__ import annotations

import numpy as np

from sgd_shm.core.results import figure

__all__ = ["plot_losses", "curves_of"]

def _flag_intervals(events, end):
    """{worker: [(start, length), ...]} flagged intervals from flag events."""
    out, since = {}, {}
    for t, k, on in events:
        if on:
            since[k] = t
        elif k in since:
            out.setdefault(k, []).append((since[k], t - since.pop(k)))
    for k, t in since.items():
        out.setdefault(k, []).append((t, end - t))
    return out


def plot_losses(curves, target, path=None, title="", n_workers=None, *, fig=None):
    """Four panels: held-out accuracy (runs given ``eval_set``; else the training
    loss) against seconds, with SaPS detections dotted and ``target`` dashed; the
    training loss against updates, one line per policy; the staleness histogram of
    each policy's pushes; SaPS's detection timeline (which worker was flagged when).

    ``curves``: {policy: {"seconds": [...], "loss": [...], "val_score": [...]
    (optional), "updates": [...] (optional), "detections": [(seconds, worker)],
    "events": [(seconds, worker, flagged)] (optional), "staleness_hist": [counts per
    log2 bin] (optional)}}. ``target``: a held-out accuracy when the curves have
    ``val_score``, else a training loss.
    Draws on ``fig`` (a matplotlib Figure, e.g. ``plt.figure()`` to show it in a
    notebook; default: a new ``Figure`` outside pyplot) and returns it; with ``path``
    it also writes the figure there (PNG, 100 dpi). Never touches the backend."""
    fig = figure(fig, (11, 7.5))
    axes = fig.subplots(2, 2)
    (a_t, a_u), (a_h, a_d) = axes
    colors = {}
    held = bool(curves) and all(c.get("val_score") for c in curves.values())
    for pol, c in curves.items():
        line, = a_t.plot(c["seconds"], c["val_score"] if held else c["loss"], label=pol)
        colors[pol] = line.get_color()
        for t, _ in c["detections"]:
            a_t.axvline(t, color=line.get_color(), ls=":", lw=1)
        if c.get("updates"):
            a_u.plot(c["updates"], c["loss"], label=pol, color=colors[pol])
        h = np.asarray(c.get("staleness_hist") or [], dtype=float)
        if h.sum() > 0:
            last = int(np.flatnonzero(h)[-1]) + 1
            a_h.step(np.arange(last), h[:last] / h.sum(), where="mid", label=pol,
                     color=colors[pol])
    a_t.axhline(target, color="grey", ls="--", lw=1, label="target")
    if not held:
        a_u.axhline(target, color="grey", ls="--", lw=1, label="target")
    for ax, xl, yl in ((a_t, "seconds", "held-out accuracy" if held else "training loss"),
                       (a_u, "updates applied", "training loss")):
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    a_h.set_xlabel("push staleness τ, log2 bins (0: τ=0; i: 2^(i-1) ≤ τ < 2^i)")
    a_h.set_ylabel("fraction of pushes")
    a_h.grid(alpha=0.3)
    a_h.legend(fontsize=8)
    sa = curves.get("saps")
    a_d.set_title("SaPS: workers flagged as stragglers", fontsize=9)
    a_d.set_xlabel("seconds")
    a_d.set_ylabel("worker")
    if sa is not None:
        end = sa["seconds"][-1] if sa["seconds"] else 0.0
        ev = sa.get("events") or [(t, k, True) for t, k in sa["detections"]]
        spans = _flag_intervals(ev, end)
        nw = n_workers or (max(spans) + 1 if spans else 1)
        for k, iv in spans.items():
            a_d.broken_barh(iv, (k - 0.35, 0.7), color=colors.get("saps"))
        a_d.set_ylim(-0.6, nw - 0.4)
        a_d.set_yticks(range(nw))
        a_d.set_xlim(0, max(end, 1e-9))
    a_d.grid(alpha=0.3, axis="x")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def curves_of(results):
    """The ``plot_losses`` input for {policy: TrainResult}."""
    return {pol: {"seconds": [h["seconds"] for h in r.history],
                  "loss": [h["loss"] for h in r.history],
                  "val_score": [h["val_score"] for h in r.history if "val_score" in h],
                  "updates": [h["step"] for h in r.history],
                  "detections": r.detections, "events": r.events,
                  "staleness_hist": np.sum(r.staleness_hist, axis=0).tolist()}
            for pol, r in results.items()}
