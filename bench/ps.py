"""Parameter server with one straggler (``python -m bench ps``), on shared memory, on
Ray, or both side by side (``--backend shm|ray|both``).

Policies: BSP, ASP, SSP and SaPS on the same problem, worker 0 slowed 4x. Each
repetition runs every policy once on every backend (interleaved: policy by policy,
the backends in turn, their order alternating between repetitions) for ``seconds``,
plus a SaPS control run with no slowdown per backend (nobody should be flagged);
the problem's last ``holdout`` rows are held out and scored as the runs go. Reported
per backend: the time to a loose, the main and a tight target held-out accuracy
(from the history), the final held-out accuracy and training loss, updates and
updates/s, mean push staleness, minibatches stolen, the epochs of the straggler's
partition against the others', and detections. Medians.

Transport: in the same repetitions, each backend's pull and push alone, through the
link the worker loop talks to (:class:`sgd_shm.ps.shm_backend.ShmLink` on a
:class:`sgd_shm.ps.ParameterStore`, in worker processes forked as the backend forks
them; :class:`sgd_shm.ps.ray_backend.RayLink` on the backend's own shard and hub
actors, from worker actors): 1 worker, then ``n_workers`` at once, each repeating
``pull`` + ``push`` of a dense gradient of the problem's dimension for
``transport_seconds``. Reported: the median pull, push and pull+push latency and the
pushes per second (summed over the workers). Medians over the repetitions.
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np
from tqdm import tqdm

from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import POLICIES, curves_of, plot_losses, train
from sgd_shm.ps.transport import Push

BACKENDS = ("shm", "ray")
N_SHARDS = 8                 # train()'s default, used by every run of the scenario
TRANSPORT_LR = 1e-9          # the transport pushes move the weights by next to nothing


def backends_of(choice: str) -> list[str]:
    """``--backend`` -> the backends to run, in order."""
    return list(BACKENDS) if choice == "both" else [choice]


def ensure_ray(n_workers):
    """The bench's Ray session: the running Ray instance, or a local one declaring at
    least ``n_workers`` CPUs (one per worker actor) started for the bench."""
    from sgd_shm.ps.ray_session import LOCAL_SYSTEM_CONFIG, RaySession
    import ray
    if not ray.is_initialized():     # actors at nice 0, as the shm backend's processes
        ray.init(num_cpus=max(os.cpu_count(), n_workers), include_dashboard=False,
                 configure_logging=False, log_to_driver=False,
                 _system_config=LOCAL_SYSTEM_CONFIG)
    return RaySession()


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---- transport ------------------------------------------------------------------------

def pull_push_loop(link, k, g, seconds):
    """Worker k repeats a pull (``link.exchange(k)``) then a push of ``g``
    (``link.exchange(k, Push(v, 1.0, grad=g), pull=False)``) for ``seconds``;
    returns the count, the seconds it took and its latency medians (µs)."""
    perf = time.perf_counter
    pulls, pushes = [], []
    t0 = perf()
    end = t0 + seconds
    while True:
        a = perf()
        _, v = link.exchange(k)
        b = perf()
        link.exchange(k, Push(v, 1.0, grad=g), pull=False)
        c = perf()
        pulls.append(b - a)
        pushes.append(c - b)
        if c >= end:
            break
    pl, ps = np.array(pulls), np.array(pushes)
    rt = pl + ps
    return {"pushes": int(rt.size), "seconds": c - t0,
            "pull_us": 1e6 * float(np.median(pl)), "push_us": 1e6 * float(np.median(ps)),
            "roundtrip_us": 1e6 * float(np.median(rt)),
            "roundtrip_p90_us": 1e6 * float(np.percentile(rt, 90))}


def _shm_main(link, k, g, seconds, barrier, queue):
    barrier.wait()
    queue.put((k, pull_push_loop(link, k, g, seconds)))


def transport_shm(d, n_shards, n, seconds, g):
    """``n`` forked processes pulling and pushing on one :class:`ParameterStore`."""
    import multiprocess as mp

    from sgd_shm.ps.server import ServerState
    from sgd_shm.ps.shm_backend import ShmLink, warm_up
    from sgd_shm.ps.store import ParameterStore, WaitPolicy
    warm_up()                                    # the kernels compiled before the fork
    with ParameterStore(d, n_shards=n_shards, n_workers=n) as store:
        link = ShmLink(ServerState(store, None), TRANSPORT_LR, WaitPolicy(), os.getpid())
        ctx = mp.get_context("fork")
        barrier, queue = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_shm_main, args=(link, k, g, seconds, barrier, queue),
                             daemon=True) for k in range(n)]
        for p in procs:
            p.start()
        try:
            out = dict(queue.get(timeout=seconds + 120) for _ in range(n))
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
        assert store.version == sum(r["pushes"] for r in out.values())
    return [out[k] for k in range(n)]


def transport(backend, d, n_shards, n, seconds, g):
    """One transport measurement: per-worker dicts of :func:`pull_push_loop` (shared
    memory; on Ray a worker's pull and push are the same loads and stores on its
    node's replica, so Ray's own cost is measured by :func:`ray_calls`)."""
    return transport_shm(d, n_shards, n, seconds, g)


def ray_calls(seconds):
    """Ray's own 1:1 actor-call rates on this machine (sync, and 32 calls in flight),
    measured in the same repetition as the runs they are compared with."""
    from bench.ray_calls import actor_call_rate
    return actor_call_rate(seconds)


def _transport_rows(tr, d, n_shards, seconds):
    rows = []
    for (b, n), reps in tr.items():
        # per repetition: the latencies of the median worker, pushes/s summed over workers
        lat = {key: [statistics.median(w[key] for w in rep) for rep in reps]
               for key in ("pull_us", "push_us", "roundtrip_us", "roundtrip_p90_us")}
        rate = [sum(w["pushes"] / w["seconds"] for w in rep) for rep in reps]
        rows.append({"backend": b, "workers": n, "features": d, "n_shards": n_shards,
                     "seconds": seconds,
                     **{f"{key}_median": statistics.median(v) for key, v in lat.items()},
                     "roundtrip_us_range": [min(lat["roundtrip_us"]),
                                            max(lat["roundtrip_us"])],
                     "pushes_per_s_median": statistics.median(rate),
                     "pushes_per_s_range": [min(rate), max(rate)],
                     "pushes_per_s": rate, "roundtrip_us": lat["roundtrip_us"]})
    return rows


# ---- the runs -------------------------------------------------------------------------

def _policy_row(pol, backend, rs, n_workers, slow, targets):
    ttt = {name: [r.time_to_score(t) for r in rs] for name, t in targets.items()}
    tau = [r.mean_staleness for r in rs]
    ep0 = [r.batches["epochs"][0] / max(1, statistics.median(r.batches["epochs"][1:]))
           for r in rs] if n_workers > 1 else [1.0] * len(rs)
    return {"policy": pol, "backend": backend, "workers": n_workers, "slowdown_worker0": slow,
            "time_to_target_median": _median(ttt["target"]),
            "reached": sum(t is not None for t in ttt["target"]), "runs": len(rs),
            "time_to_target": ttt["target"],
            "time_to_tight_median": _median(ttt["tight"]),
            "reached_tight": sum(t is not None for t in ttt["tight"]),
            "time_to_tight": ttt["tight"],
            "time_to_loose_median": _median(ttt["loose"]),
            "reached_loose": sum(t is not None for t in ttt["loose"]),
            "time_to_loose": ttt["loose"],
            "final_loss_median": statistics.median(r.final_loss for r in rs),
            "val_score_median": statistics.median(r.val_score for r in rs),
            "val_scores": [r.val_score for r in rs],
            "updates_median": statistics.median(r.updates for r in rs),
            "updates_per_s_median": statistics.median(r.updates / r.seconds for r in rs),
            "mean_staleness_median": statistics.median(tau),
            "stolen_median": statistics.median(sum(r.batches["stolen_by_worker"]) for r in rs),
            "straggler_epochs_ratio_median": statistics.median(ep0),
            "lost_batches": [r.batches["lost"] for r in rs],
            "staleness_hist": np.sum([np.sum(r.staleness_hist, axis=0) for r in rs],
                                     axis=0).tolist(),
            "detections": [[w for _, w in r.detections] for r in rs],
            "first_detection_s": [r.detections[0][0] if r.detections else None for r in rs],
            "dropped_worker0": [r.workers[0]["dropped"] for r in rs]}


def run(n_workers, reps, seed, *, samples=20_000, features=2_000, seconds=4.0,
        target=0.935, tight=0.94, loose=0.93, slow=4.0, backends=("shm",),
        transport_seconds=1.0, progress=True, holdout=5_000, warmup=True):
    backends = list(backends)
    X, y = make_rcv1_like(samples + holdout, features, random_state=seed)
    X, y, held = X[:samples], y[:samples], (X[samples:], y[samples:])
    session = ensure_ray(n_workers) if "ray" in backends else None
    counts = sorted({1, n_workers})
    g = np.random.default_rng(seed).standard_normal(features)
    acc = {(b, p): [] for b in backends for p in POLICIES}
    control = {b: [] for b in backends}
    tr = {("shm", n): [] for n in counts if "shm" in backends}    # (Ray: see ray_calls)
    calls = []
    rates = {(b, n): [] for b in backends for n in sorted({2, n_workers})}
    first = {b: {} for b in backends}
    first_rep = 0 if warmup else 1                   # rep 0 is the warm-up
    bar = tqdm(total=(reps + 1 - first_rep) * len(backends) * (len(POLICIES) + 1 + len(counts)),
               desc="ps", leave=False, disable=not progress)
    for rep in range(first_rep, reps + 1):
        order = backends if rep % 2 else backends[::-1]
        for pol in POLICIES:
            for b in order:
                # one seed for every repetition: the same partitions and evaluation
                # rows, so the targets mean the same; repetitions differ in timing only
                r = train(X, y, n_workers=n_workers, policy=pol, slowdown={0: slow},
                          max_seconds=seconds, seed=seed, backend=b, eval_set=held,
                          session=session if b == "ray" else None)
                if rep:
                    acc[b, pol].append(r)
                    first[b].setdefault(pol, r)
                bar.update()
        for b in order:
            r = train(X, y, n_workers=n_workers, policy="saps", max_seconds=seconds,
                      seed=seed, backend=b, session=session if b == "ray" else None)
            if rep:
                control[b].append([w for _, w in r.detections])
            bar.update()
        for (b, n) in sorted(rates, key=lambda bn: (order.index(bn[0]), bn[1])):
            r = train(X, y, n_workers=n, policy="asp", max_seconds=seconds / 2, seed=seed,
                      backend=b, session=session if b == "ray" else None)
            if rep:
                rates[b, n].append(r.updates / r.seconds)
        for b in order:
            if b == "ray":
                res = ray_calls(3 * transport_seconds)
                if rep:
                    calls.append(res)
                bar.update(len(counts))
                continue
            for n in counts:
                res = transport(b, features, N_SHARDS, n, transport_seconds, g)
                if rep:
                    tr[b, n].append(res)
                bar.update()
    bar.close()
    targets = {"target": target, "tight": tight, "loose": loose}
    rows = [_policy_row(pol, b, acc[b, pol], n_workers, slow, targets)
            for b in backends for pol in POLICIES]
    problem = {"samples": samples, "holdout": holdout, "target_kind": "held-out accuracy",
               "features": features, "seconds": seconds, "target": target,
               "tight_target": tight, "loose_target": loose, "backends": backends,
               "reps": reps, "n_shards": N_SHARDS, "transport_seconds": transport_seconds}
    extra = {"asp_pushes_per_s": [
        {"backend": b, "workers": n, "seconds": seconds / 2,
         "median": statistics.median(v), "range": [min(v), max(v)], "runs": v}
        for (b, n), v in rates.items()]}
    if session is not None:
        import ray
        problem["ray_version"] = ray.__version__
        session.close()
        extra["ray_calls"] = {
            f"{k}_median": statistics.median(c[k] for c in calls)
            for k in ("sync_calls_per_s", "pipelined_calls_per_s")} | {"runs": calls}
    return rows, {"problem": problem,
                  "curves": {b: curves_of(first[b]) for b in backends},
                  "control_detections": control,
                  "transport": _transport_rows(tr, features, N_SHARDS, transport_seconds),
                  **extra}


def ratios(rows):
    """Per backend: BSP's time to each target over SaPS's, SaPS's final loss minus
    ASP's and its final held-out accuracy minus ASP's and BSP's. ({backend: {...}};
    rows without a backend are shared memory's.)"""
    out = {}
    for b in dict.fromkeys(r.get("backend", "shm") for r in rows):
        by = {r["policy"]: r for r in rows if r.get("backend", "shm") == b}
        o = out[b] = {}
        for name in ("target", "tight", "loose"):
            key = f"time_to_{name}_median"
            if by["bsp"].get(key) and by["saps"].get(key):
                o[f"bsp_over_saps_time_to_{name}"] = by["bsp"][key] / by["saps"][key]
        o["saps_minus_asp_final_loss"] = (by["saps"]["final_loss_median"]
                                          - by["asp"]["final_loss_median"])
        if "val_score_median" in by["saps"]:
            for other in ("asp", "bsp"):
                o[f"saps_minus_{other}_val_score"] = (by["saps"]["val_score_median"]
                                                      - by[other]["val_score_median"])
        o["saps_over_bsp_updates"] = (by["saps"]["updates_median"]
                                      / max(1, by["bsp"]["updates_median"]))
    return out


# ---- reading the JSON (this layout, and the single-backend one before it) ------------

def _backend_of(r):
    return r.get("backend", "shm")


def _normalised(d):
    """(backends, curves {backend: {policy: curve}}, controls {backend: [...]},
    ratios {backend: {...}}) of a results dict, old layouts included."""
    rows = d["results"]
    backends = list(dict.fromkeys(_backend_of(r) for r in rows))
    curves = d.get("curves") or {}
    if curves and set(curves) <= set(POLICIES):
        curves = {"shm": curves}
    ctl = d.get("control_detections")
    if isinstance(ctl, list):
        ctl = {"shm": ctl}
    rt = d.get("ratios") or {}
    if rt and not all(isinstance(v, dict) for v in rt.values()):
        rt = {"shm": rt}
    return backends, curves, ctl or {}, rt


# ---- plot -----------------------------------------------------------------------------

_STYLE = {"shm": "-", "ray": "--"}
_LABEL = {"shm": "shared memory", "ray": "Ray"}


def _loss_panels(a_t, a_u, a_h, backends, curves, p):
    """Held-out accuracy (the training loss in files from before held-out data)
    against time, the training loss against updates, and the staleness histograms,
    per backend."""
    from matplotlib.lines import Line2D
    color = {pol: f"C{i}" for i, pol in enumerate(POLICIES)}
    held = p.get("target_kind") == "held-out accuracy"
    for b in backends:
        for pol, c in curves.get(b, {}).items():
            kw = dict(color=color.get(pol), ls=_STYLE.get(b, ":"), lw=1.4)
            top = c["val_score"] if held else c["loss"]
            a_t.plot(c["seconds"], top, **kw)
            for t, _ in c["detections"][:1]:      # SaPS's first detection, on its curve
                i = int(np.searchsorted(c["seconds"], t))
                if i < len(top):
                    a_t.plot([c["seconds"][i]], [top[i]], marker="v", ms=7,
                             color=color.get(pol), mec="k")
            if c.get("updates"):
                u = np.maximum(c["updates"], 1)
                a_u.plot(u, c["loss"], **kw)
            h = np.asarray(c.get("staleness_hist") or [], dtype=float)
            if h.sum() > 0:
                last = int(np.flatnonzero(h)[-1]) + 1
                a_h.step(np.arange(last), h[:last] / h.sum(), where="mid", **kw)
    for ax, xl, yl in ((a_t, "seconds" + (" (log)" if len(backends) > 1 else ""),
                        "held-out accuracy" if held else "training loss"),
                       (a_u, "updates applied (log)", "training loss")):
        for t, ls in ((p["target"], "--"), (p.get("loose_target"), ":")):
            if t is not None and (ax is a_t or not held):
                ax.axhline(t, color="grey", ls=ls, lw=1)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
    if held:
        a_t.set_ylim(max(0.5, p["loose_target"] - 0.05), None)
    a_u.set_xscale("log")
    if len(backends) > 1:
        a_t.set_xscale("log")                     # the transports differ by orders of magnitude
    handles = [Line2D([], [], color=color[pol], label=pol) for pol in POLICIES] + \
              [Line2D([], [], ls="", marker="v", color="grey", mec="k",
                      label="SaPS flags a worker")] + \
              [Line2D([], [], color="k", ls=_STYLE.get(b, ":"), label=_LABEL.get(b, b))
               for b in backends] + \
              [Line2D([], [], color="grey", ls="--", lw=1, label=f"target {p['target']}")]
    if p.get("loose_target") is not None:
        handles.append(Line2D([], [], color="grey", ls=":", lw=1,
                              label=f"loose target {p['loose_target']}"))
    a_t.legend(handles=handles, fontsize=8, ncol=2)
    a_t.set_title(("held-out accuracy" if held else "loss") + " against time (first "
                  "repetition)", fontsize=9)
    a_u.set_title("loss against updates: the same algorithm on both transports", fontsize=9)
    a_h.set_xlabel("push staleness τ, log2 bins (0: τ=0; i: 2^(i-1) ≤ τ < 2^i)")
    a_h.set_ylabel("fraction of pushes")
    a_h.grid(alpha=0.3)
    a_h.set_title("staleness of the pushes (all repetitions)", fontsize=9)


def _transport_panels(a_l, a_r, tr, backends):
    """Bars of pull + push latency and pushes/s per backend and worker count."""
    counts = sorted({t["workers"] for t in tr})
    width = 0.8 / max(1, len(backends))
    for ax, key, rng, yl in ((a_l, "roundtrip_us_median", "roundtrip_us_range",
                              "pull + push latency, µs (log)"),
                             (a_r, "pushes_per_s_median", "pushes_per_s_range",
                              "pushes / s, all workers (log)")):
        for i, b in enumerate(backends):
            rows = {t["workers"]: t for t in tr if t["backend"] == b}
            xs = np.arange(len(counts)) + (i - (len(backends) - 1) / 2) * width
            med = [rows[n][key] if n in rows else np.nan for n in counts]
            lo = [rows[n][key] - rows[n][rng][0] if n in rows else 0 for n in counts]
            hi = [rows[n][rng][1] - rows[n][key] if n in rows else 0 for n in counts]
            bars = ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=_LABEL.get(b, b),
                          color="C7" if b == "shm" else "C9",
                          hatch="" if b == "shm" else "//", edgecolor="k")
            for bar_, m, up in zip(bars, med, hi):       # above the bar's error bar
                if np.isfinite(m):
                    ax.annotate(_short(m), (bar_.get_x() + bar_.get_width() / 2, m + up),
                                ha="center", va="bottom", fontsize=7,
                                xytext=(0, 2), textcoords="offset points")
        ax.set_yscale("log")
        ax.set_xticks(range(len(counts)))
        ax.set_xticklabels([f"{n} worker{'s' if n > 1 else ''}" for n in counts])
        ax.set_ylabel(yl, fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        ax.margins(y=0.2)
        ax.legend(fontsize=7)


def plot(d, path):
    r0 = d["results"][0]
    backends, curves, _, _ = _normalised(d)
    if "transport" not in d:                     # a single-backend file of the old layout
        plot_losses(curves["shm"], d["problem"]["target"], path,
                    f"parameter server, {r0['workers']} workers, worker 0 slowed "
                    f"{r0['slowdown_worker0']:g}x (dotted: SaPS detection; first "
                    f"repetition)", n_workers=r0["workers"])
        return path
    from matplotlib.figure import Figure
    p = d["problem"]
    fig = Figure(figsize=(12, 8))
    gs = fig.add_gridspec(2, 4)
    a_t, a_u = fig.add_subplot(gs[0, :2]), fig.add_subplot(gs[0, 2:])
    a_h, a_l, a_r = fig.add_subplot(gs[1, :2]), fig.add_subplot(gs[1, 2]), \
        fig.add_subplot(gs[1, 3])
    _loss_panels(a_t, a_u, a_h, backends, curves, p)
    if d["transport"]:
        _transport_panels(a_l, a_r, d["transport"], backends)
    else:                                        # a Ray-only run: Ray's calls are in the text
        for ax in (a_l, a_r):
            ax.text(0.5, 0.5, "shared-memory transport not run", ha="center", va="center",
                    fontsize=8, transform=ax.transAxes)
            ax.set_axis_off()
    a_l.set_title(f"transport: d = {p['features']:,}, {p.get('n_shards', N_SHARDS)} shards",
                  fontsize=9)
    fig.suptitle(f"parameter server, {r0['workers']} workers, worker 0 slowed "
                 f"{r0['slowdown_worker0']:g}×, " + " vs ".join(_LABEL.get(b, b)
                                                               for b in backends), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _short(x):
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    if x >= 1e4:
        return f"{x / 1e3:.0f}k"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


# ---- tables ---------------------------------------------------------------------------

def _sec(x):
    return f"{x:.2f}" if x is not None else "–"


def _reach(r, name):
    key = "" if name == "target" else f"_{name}"
    med = r.get(f"time_to_{name}_median")
    n = r.get(f"reached{key}")
    if n is None:
        return "n/a"
    return f"{_sec(med)} ({n}/{r['runs']})"


def _us(x):
    return f"{x:,.0f} µs" if x >= 100 else f"{x:.1f} µs"


def _policy_table(d, loose):
    p, rows = d["problem"], d["results"]
    lines = [f"RCV1-like {p['samples']:,} × {p['features']:,}, {rows[0]['workers']} workers, "
             f"worker 0 slowed {rows[0]['slowdown_worker0']:g}×, {p['seconds']:g} s per run; "
             f"time to a target {_kind(p)}, median (runs that reached it) — "
             + (f"loose {loose}, " if loose is not None else "")
             + f"target {p['target']}, tight {p['tight_target']}:", "",
             "| backend | policy | " + ("time to loose (s) | " if loose is not None else "")
             + "time to target (s) | time to tight (s) | held-out accuracy | final loss | "
             "updates | updates/s | mean τ | stolen | straggler epochs / others' | "
             "SaPS detections |",
             "|---|---|" + ("---:|" if loose is not None else "")
             + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        det = "; ".join(",".join(map(str, x)) or "none" for x in r["detections"]) \
            if r["policy"] == "saps" else ""
        ups = r.get("updates_per_s_median")
        lines.append(f"| {_backend_of(r)} | {r['policy']} | "
                     + (f"{_reach(r, 'loose')} | " if loose is not None else "")
                     + f"{_reach(r, 'target')} | {_reach(r, 'tight')} | "
                     + (f"{r['val_score_median']:.4f}" if "val_score_median" in r else "–")
                     + f" | {r['final_loss_median']:.4f} | {r['updates_median']:,.0f} | "
                     + (f"{ups:,.0f}" if ups is not None else "–") + " | "
                     f"{r['mean_staleness_median']:.2f} | {r['stolen_median']:,.0f} | "
                     f"{r['straggler_epochs_ratio_median']:.2f} | {det} |")
    return lines


def _transport_table(p, tr):
    lines = ["", f"Transport: pull + push of a dense {p['features']:,}-float gradient "
             f"over {p.get('n_shards', N_SHARDS)} shards, each worker repeating them for "
             f"{p.get('transport_seconds', 1):g} s; latencies of the median worker, "
             "pushes/s summed over the workers, median (min–max) over the repetitions:",
             "", "| backend | workers | pull | push | pull + push | pull + push p90 | "
             "pushes/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for t in tr:
        lo, hi = t["pushes_per_s_range"]
        lines.append(f"| {t['backend']} | {t['workers']} | {_us(t['pull_us_median'])} | "
                     f"{_us(t['push_us_median'])} | {_us(t['roundtrip_us_median'])} | "
                     f"{_us(t['roundtrip_p90_us_median'])} | "
                     f"{t['pushes_per_s_median']:,.0f} ({lo:,.0f}–{hi:,.0f}) |")
    return lines


def _kind(p):
    return p.get("target_kind", "training loss")


def _policy_finding(p, b, o, mine, names):
    """One sentence per backend: targets reached, BSP over SaPS, updates, final
    held-out accuracy and loss."""
    s = f"On {_LABEL.get(b, b)}, "
    if not any(r["reached"] for r in mine):
        s += (f"no policy reaches the target {_kind(p)} {p['target']} within the "
              f"{p['seconds']:g} s runs; ")
    both = [n for n in ("target", "tight", "loose") if f"bsp_over_saps_time_to_{n}" in o]
    if both:
        first, rest = both[0], both[1:]
        s += (f"BSP takes {o[f'bsp_over_saps_time_to_{first}']:.2f}× as long as SaPS to "
              f"reach {names[first]}")
        if rest:
            s += " (" + ", ".join(f"{o[f'bsp_over_saps_time_to_{n}']:.2f}× for {names[n]}"
                                  for n in rest) + ")"
        s += "; "
    else:
        s += "SaPS and BSP reach no target in common; "
    if "saps_over_bsp_updates" in o:
        s += f"SaPS applies {o['saps_over_bsp_updates']:.2f}× BSP's updates"
    if "saps_minus_asp_val_score" in o:
        s += (f"; its final held-out accuracy minus ASP's is "
              f"{100 * o['saps_minus_asp_val_score']:+.2f} points and minus BSP's "
              f"{100 * o['saps_minus_bsp_val_score']:+.2f} points")
    if "saps_minus_asp_final_loss" in o:
        s += f", and its final training loss minus ASP's is {o['saps_minus_asp_final_loss']:+.4f}"
    return s.rstrip("; ") + "."


def _ray_finding(d):
    """Dense ASP's pushes/s (no slowdown) on each backend beside Ray's own actor-call
    rates, measured in the same repetitions."""
    calls, rates = d.get("ray_calls"), d.get("asp_pushes_per_s") or []
    ray_rates = [r for r in rates if r["backend"] == "ray"]
    if not calls or not ray_rates:
        return None
    pipe = calls["pipelined_calls_per_s_median"]
    shm = {r["workers"]: r["median"] for r in rates if r["backend"] == "shm"}
    parts = []
    for r in ray_rates:
        t = (f"{r['workers']} workers {r['median']:,.0f}/s ({r['median'] / pipe:.1f}× the "
             "pipelined actor-call rate")
        if r["workers"] in shm:
            t += f"; shared memory {shm[r['workers']]:,.0f}/s"
        parts.append(t + ")")
    return (f"Ray's own 1:1 actor calls on this machine, in the same repetitions: "
            f"{calls['sync_calls_per_s_median']:,.0f}/s one at a time, {pipe:,.0f}/s with "
            f"32 in flight. Dense ASP on one Ray node, no slowdown, pushes per second: "
            + "; ".join(parts) + ". A worker's step is loads and stores on its node's "
            "replica; only the node's agent makes actor calls.")


def summary_markdown(d):
    p = d["problem"]
    rows = d["results"]
    backends, _, ctl, rt = _normalised(d)
    h = d["header"]
    reps = p.get("reps", h["reps"])
    loose = p.get("loose_target")
    lines = _policy_table(d, loose)
    tr = d.get("transport")
    if tr:
        lines += _transport_table(p, tr)
    lines.append("")
    kind = "held-out accuracy " if _kind(p) == "held-out accuracy" else ""
    names = {"target": f"{kind or 'the target '}{p['target']}",
             "tight": f"the tight target {kind}{p['tight_target']}",
             "loose": f"the loose target {kind}{loose}"}
    for b in backends:
        lines.append(_policy_finding(p, b, rt.get(b, {}),
                                     [r for r in rows if _backend_of(r) == b], names))
    s = _ray_finding(d)
    if s:
        lines.append(s)
    for b in backends:
        if b in ctl:
            lines.append(f"Control, SaPS with no slowdown on {_LABEL.get(b, b)}: workers "
                         f"flagged per run: "
                         f"{'; '.join(','.join(map(str, x)) or 'none' for x in ctl[b])}.")
    lines.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
                 f"{h.get('platform', '')} · python {h['python']}"
                 + (f", Ray {p['ray_version']}" if p.get("ray_version") else "")
                 + f" · medians of {reps} interleaved repetitions after a warm-up</sub>")
    return "\n".join(lines)
