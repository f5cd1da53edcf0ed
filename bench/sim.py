"""The kit's cluster-scale claims, simulated (``python -m bench sim``): the virtual-time
simulator :mod:`sgd_shm.sim` runs the real policies, collectives, compressors and
linear model at 16-1,024 workers on this box; the seconds are virtual (a cluster's,
by the simulator's compute and network models), the losses and accuracies real.

Parts (``--sim-parts``, all by default):

* ``saps``: SaPS against BSP, ASP and SSP (staleness: ps.train's default, n_workers)
  at 32 and 128 workers of a heterogeneous cluster (a quarter of the workers 4x
  slower, 1 ms steps, 10 Gb/s links): time to a held-out accuracy, final accuracy
  and loss, and whether SaPS flagged exactly the slow class (SaPS: Yu et al., HPCC
  2019).
* ``eager``: solo and majority allreduce against sync at 64 ranks under the kit's
  model of the eager-SGD paper's imbalance (each round 4 ranks, drawn from the shared
  seed, sleep twice a step): time to the held-out target, speed-up over sync, final
  loss against sync (the paper's claim: 1.27x, Li et al., PPoPP 2020).
* ``rps``: RPS at 64 workers (16-row minibatches, 10 epochs: 200 rounds), the final
  loss's gap to the reliable run of the same seed against the number of servers S in
  {1, ..., 32} and the drop rate p (the claim of Yu et al., ICML 2019: the influence
  of p diminishes as S grows).
* ``topk``: TopK (k/n = 0.001, error feedback) against dense gradients, sync
  allreduce at 64 ranks on 1, 10 and 100 Gb/s links (5 us latency), a 50,000-feature
  problem: time to the held-out target; the compressor's own time per message is
  measured on the benchmarking machine (``compress_s``) and charged to every step.
* ``speed``: the simulator's own wall time for 10 epochs of a 20,000 x 2,000 problem at
  1,024 workers, every policy and collective (the issue's target: at most 60 s).
* ``calibrate``: the simulator against this box. At 2 and 4 workers, the compute model
  is fitted to short real runs of another seed before each repetition's real runs
  (:func:`sgd_shm.calibrate.calibrate`: ASP and BSP runs of the parameter server with worker 0
  slowed 4x; sync runs of eager-SGD without and with the imbalance), and the median of
  those calibrations (:meth:`Calibration.median`) predicts every repetition: every
  policy (BSP, ASP, SSP, SaPS, worker 0 slowed 4x) and every collective (one rank a
  round sleeping 2 ms) runs for real and is simulated from the same seed; the times at
  which the training loss crosses a target (interpolated between the records around
  it, which come every 20-50 ms) are compared: the median simulated time over the
  seeds against the median measured one (the bar: within 25%), and seed by seed.
  Wall-clock measurements on a shared 2-core box: the ratios move with the load.

Repetitions are seeds (the data stay; the partitions, orders and draws change);
medians are reported. Each part writes its plot: sim_saps.png, sim_eager.png,
sim_rps.png, sim_topk.png in bench/results.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
from tqdm import tqdm

from sgd_shm.data import make_rcv1_like
from sgd_shm.sim import Cluster, Network, simulate

PARTS = ("saps", "eager", "rps", "topk", "speed", "calibrate")
POLICIES = ("bsp", "asp", "ssp", "saps")
COLLECTIVES = ("sync", "solo", "majority")
KINDS = ("asp", "bsp", "ssp", "saps", "rps", "sync", "solo", "majority")
STEP = 1e-3                                     # virtual seconds of a step at factor 1
SLOW = [(0.75, 1.0), (0.25, 4.0)]               # the heterogeneous cluster's classes
SAPS_WORKERS = (32, 128)
EAGER_RANKS, IMBALANCE = 64, (4, 2 * STEP)
RPS_WORKERS, RPS_SHARDS, RPS_DROPS, RPS_LR = 64, (1, 2, 4, 8, 16, 32), (0.0, 0.1, 0.2, 0.3), 4.0
RPS_BATCH, RPS_EPOCHS = 16, 10                  # 200 rounds: the model trains
TOPK_RANKS, TOPK_RATIO, GBPS = 64, 0.001, (1, 10, 100)
SPEED_WORKERS, SPEED_EPOCHS = 1024, 10
TARGET, TOPK_TARGET = 0.92, 0.88
CLAIM_SPEEDUP, CLAIM_LOSS = 1.27, 0.01
SPEED_LIMIT_S = 60.0


def _problem(samples, features, density, seed, holdout):
    X, y = make_rcv1_like(samples + holdout, features, density=density, random_state=seed)
    return X[:samples], y[:samples], (X[samples:], y[samples:])


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _curve(r, n=60):
    """(virtual seconds, held-out accuracy) of a run, thinned to about n points."""
    h = r.history[::max(1, len(r.history) // n)] + [r.history[-1]]
    return {"seconds": [x["seconds"] for x in h], "val_score": [x["val_score"] for x in h]}


# ---- the parts ------------------------------------------------------------------------------
def part_saps(reps, seed, quick, bar):
    X, y, ev = _problem(*((4000, 500, 0.05) if quick else (20000, 2000, 0.02)), 0,
                        1000 if quick else 5000)
    rows, curves = [], {}
    for P in ((16,) if quick else SAPS_WORKERS):
        slow = set(range(P - P // 4, P))
        for pol in POLICIES:
            runs = []
            for rep in range(reps):
                runs.append(simulate(X, y, n_workers=P, policy=pol, epochs=1 if quick else 5,
                                     cluster=Cluster(STEP, classes=SLOW),
                                     network=Network.gbps(10), eval_set=ev, seed=seed + rep))
                bar.update()
            r0 = runs[0]
            curves[f"{P}/{pol}"] = _curve(r0)
            rows.append({"part": "saps", "workers": P, "policy": pol,
                         "time_to_target": _med([r.time_to_score(TARGET) for r in runs]),
                         "reached": sum(r.time_to_score(TARGET) is not None for r in runs),
                         "seconds": _med([r.seconds for r in runs]),
                         "val_score": _med([r.val_score for r in runs]),
                         "final_loss": _med([r.final_loss for r in runs]),
                         "flagged_slow_class": [sorted(k for _, k in r.detections) ==
                                                sorted(slow) for r in runs],
                         "flagged": [len(r.detections) for r in runs],
                         "wall_s": _med([r.wall_seconds for r in runs])})
    return rows, {"saps_curves": curves}


def part_eager(reps, seed, quick, bar):
    X, y, ev = _problem(*((4000, 500, 0.05) if quick else (20000, 2000, 0.02)), 0,
                        1000 if quick else 5000)
    P = 16 if quick else EAGER_RANKS
    rows, curves = [], {}
    for c in COLLECTIVES:
        runs = []
        for rep in range(reps):
            runs.append(simulate(X, y, n_workers=P, collective=c, epochs=2 if quick else 5,
                                 cluster=Cluster(STEP, imbalance=IMBALANCE),
                                 network=Network.gbps(10), eval_set=ev, seed=seed + rep,
                                 lr=8.0, batch_size=16))
            bar.update()
        curves[c] = _curve(runs[0])
        rows.append({"part": "eager", "ranks": P, "collective": c,
                     "time_to_target": _med([r.time_to_score(TARGET) for r in runs]),
                     "seconds": _med([r.seconds for r in runs]),
                     "val_score": _med([r.val_score for r in runs]),
                     "final_loss": _med([r.final_loss for r in runs]),
                     "mean_contributors": _med([r.mean_contributors for r in runs]),
                     "rounds": runs[0].rounds})
    sync = next(r for r in rows if r["collective"] == "sync")
    for r in rows:
        t, s = r["time_to_target"], sync["time_to_target"]
        r["speedup"] = s / t if s and t else None
        r["final_vs_sync"] = r["final_loss"] / sync["final_loss"] - 1.0
    return rows, {"eager_curves": curves}


def part_rps(reps, seed, quick, bar):
    X, y, _ = _problem(*((4000, 500, 0.05) if quick else (20000, 2000, 0.02)), 0, 1)
    P = 16 if quick else RPS_WORKERS
    shards = (1, 4) if quick else RPS_SHARDS
    drops = (0.0, 0.2) if quick else RPS_DROPS
    rows = []
    for S in shards:
        base = {}
        for p in drops:
            losses, gaps = [], []
            for rep in range(reps):
                r = simulate(X, y, n_workers=P, policy="rps", drop=p, n_shards=S,
                             epochs=1 if quick else RPS_EPOCHS, lr=RPS_LR, seed=seed + rep,
                             batch_size=RPS_BATCH)
                bar.update()
                if p == 0.0:
                    base[rep] = r.final_loss
                losses.append(r.final_loss)
                gaps.append(r.final_loss / base[rep] - 1.0)
            rows.append({"part": "rps", "workers": P, "shards": S, "drop": p,
                         "final_loss": _med(losses), "gap_median": _med(gaps),
                         "gaps": gaps})
    return rows, {}


def _compress_seconds(d, ratio, seed, reps=30):
    """The median wall seconds of one TopK message (with its error feedback) on a
    d-vector, measured on the machine that runs the bench."""
    from sgd_shm.compress import TopK
    mem = TopK(ratio=ratio).memory(d)
    g = np.random.default_rng(seed).normal(size=d)
    mem.step(g)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        mem.step(g)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def part_topk(reps, seed, quick, bar):
    shape = (8000, 5000, 0.01) if quick else (100000, 50000, 0.0015)
    X, y, ev = _problem(*shape, 0, 1000 if quick else 5000)
    d = X.shape[1]
    P = 16 if quick else TOPK_RANKS
    c_s = _compress_seconds(d, TOPK_RATIO, seed)
    rows, curves = [], {}
    for g in GBPS:
        for name, comp, extra in (("dense", None, 0.0), ("topk", f"topk:{TOPK_RATIO}", c_s)):
            runs = []
            for rep in range(reps):
                runs.append(simulate(X, y, n_workers=P, collective="sync",
                                     epochs=1 if quick else 3, compress=comp,
                                     cluster=Cluster(STEP, compress_s=extra),
                                     network=Network.gbps(g), eval_set=ev, seed=seed + rep,
                                     lr=8.0))
                bar.update()
            curves[f"{g}/{name}"] = _curve(runs[0])
            rows.append({"part": "topk", "gbps": g, "gradients": name, "ranks": P,
                         "time_to_target": _med([r.time_to_score(TOPK_TARGET) for r in runs]),
                         "seconds": _med([r.seconds for r in runs]),
                         "val_score": _med([r.val_score for r in runs]),
                         "final_loss": _med([r.final_loss for r in runs]),
                         "bytes_sent": _med([r.bytes_sent for r in runs]),
                         "compress_s": extra})
    return rows, {"topk_curves": curves, "topk_problem": {"samples": shape[0], "features": d,
                                                          "compress_s": c_s}}


def part_speed(reps, seed, quick, bar):
    X, y, _ = _problem(*((4000, 500, 0.05) if quick else (20000, 2000, 0.02)), 0, 1)
    P = 64 if quick else SPEED_WORKERS
    epochs = 1 if quick else SPEED_EPOCHS
    cl, net = Cluster(STEP, classes=SLOW), Network.gbps(10)
    simulate(X, y, n_workers=4, epochs=1, cluster=cl, network=net)          # warm-up
    rows = []
    for kind in KINDS:
        arg = {"collective": kind} if kind in COLLECTIVES else {"policy": kind}
        walls, updates = [], 0
        for rep in range(reps):
            r = simulate(X, y, n_workers=P, epochs=epochs, cluster=cl, network=net,
                         seed=seed + rep, **arg)
            walls.append(r.wall_seconds)
            updates = r.updates
            bar.update()
        rows.append({"part": "speed", "workers": P, "epochs": epochs, "kind": kind,
                     "wall_s_median": _med(walls), "wall_s_max": max(walls),
                     "updates": updates, "samples": X.shape[0], "features": X.shape[1]})
    return rows, {}


CAL_WORKERS, CAL_SECONDS, CAL_FIT_S, CAL_BAR = (2, 4), 4.0, 1.5, 0.25
#: the training-loss targets of the calibration's runs: where the loss still falls
#: steeply, so that a time to them is well defined (the held-out accuracy of this
#: problem creeps towards its plateau, and a time to 0.93 moves by seconds with noise),
#: and late enough that the fastest policy takes a few tenths of a second to them (a
#: run's start-up would weigh on a shorter one)
CAL_LOSS = {"ps": 0.38, "collective": 0.38}
CAL_SLEEP = (1, 0.002)
#: the calibration's runs use the predicted run's seed plus this
CAL_SEED_SHIFT = 1000


def part_calibrate(reps, seed, quick, bar):
    from sgd_shm.eager import train as eager_train
    from sgd_shm.ps import train as ps_train
    from sgd_shm.calibrate import Calibration, calibrate
    X, y, _ = _problem(20000, 2000, 0.0015, 0, 1)
    secs = 1.0 if quick else CAL_SECONDS
    fit = 0.5 if quick else CAL_FIT_S
    rows = []
    for P in ((2,) if quick else CAL_WORKERS):
        # each repetition: a calibration on another seed, then the real runs of this one;
        # the predictions use the median of the calibrations, which thus sample the
        # same stretches of the box's time as the runs they predict
        cals, calcs, reals = [], [], []
        for rep in range(reps):
            s = seed + rep
            cals.append(calibrate(X, y, n_workers=P, seconds=fit, seed=s + CAL_SEED_SHIFT,
                                  slowdown="straggler"))
            calcs.append(calibrate(X, y, n_workers=P, seconds=fit, seed=s + CAL_SEED_SHIFT,
                                   collective=True, lr=8.0, imbalance=CAL_SLEEP))
            for pol in POLICIES:
                kw = dict(policy=pol, max_seconds=secs, seed=s, target_loss=CAL_LOSS["ps"])
                reals.append(("ps", pol, s, kw, ps_train(
                    X, y, n_workers=P, slowdown="straggler", progress=False, **kw)))
                bar.update()
            for c in COLLECTIVES:
                kw = dict(collective=c, max_seconds=secs, seed=s, lr=8.0,
                          target_loss=CAL_LOSS["collective"])
                reals.append(("collective", c, s, kw, eager_train(
                    X, y, n_workers=P, imbalance=CAL_SLEEP, progress=False, **kw)))
                bar.update()
        cal, calc = Calibration.median(cals), Calibration.median(calcs)
        for kind, name, s, kw, real in reals:
            if kind == "ps":
                # SaPS's window as the real run's default (the simulator's own scales
                # with the step); the other policies take none
                sim = cal.simulate(X, y, slowdown="straggler",
                                   window=0.5 if name == "saps" else None, **kw)
                rows.append(_cal_row(kind, P, name, s, cal, real, sim))
            else:
                sim = calc.simulate(X, y, imbalance=CAL_SLEEP, **kw)
                rows.append(_cal_row(kind, P, name, s, calc, real, sim))
    return rows, {"calibrate_problem": {"samples": 20000, "features": 2000,
                                        "target_loss": CAL_LOSS, "fit_seconds": fit,
                                        "max_seconds": secs, "sleep": CAL_SLEEP}}


def crossing(history, target):
    """When the loss crossed ``target``: linear in time between the last record above it
    and the first at or below it (None: never). The records come every sample period
    (20-50 ms), as long as the fastest runs here take to the target, so the first
    record at or below it alone would be off by up to a whole period."""
    prev = None
    for h in history:
        if h["loss"] <= target:
            if prev is None or prev["loss"] <= h["loss"]:
                return h["seconds"]
            f = (prev["loss"] - target) / (prev["loss"] - h["loss"])
            return prev["seconds"] + f * (h["seconds"] - prev["seconds"])
        prev = h
    return None


def _cal_row(kind, P, name, seed, cal, real, sim):
    t_real, t_sim = crossing(real.history, CAL_LOSS[kind]), crossing(sim.history, CAL_LOSS[kind])
    err = (t_sim / t_real - 1.0) if t_real and t_sim else None
    return {"part": "calibrate", "kind": kind, "workers": P, "name": name, "seed": seed,
            "step_s": cal.step_s, "slow_extra_s": cal.slow_extra_s, "wake_s": cal.wake_s,
            "sleep_extra_s": cal.sleep_extra_s, "gate_s": cal.gate_s, "start_s": cal.start_s,
            "target_loss": CAL_LOSS[kind],
            "time_real": t_real, "time_sim": t_sim, "error": err,
            "updates_real": real.history[-1]["step"], "updates_sim": sim.updates}


# ---- the scenario -----------------------------------------------------------------------------
def _runs_of(part, reps, quick):
    n = {"saps": (1 if quick else len(SAPS_WORKERS)) * len(POLICIES),
         "eager": len(COLLECTIVES),
         "rps": (2 * 2) if quick else len(RPS_SHARDS) * len(RPS_DROPS),
         "topk": 2 * len(GBPS), "speed": len(KINDS),
         "calibrate": (1 if quick else len(CAL_WORKERS)) * (len(POLICIES) + len(COLLECTIVES))
         }[part]
    return n * reps


def run(reps, seed, parts=PARTS, quick=False):
    """Every part of ``parts``: (rows, extra), extra with the curves, the claims and
    the findings; draws the parts' plots into bench/results."""
    from bench import common
    rows, extra = [], {"parts": list(parts), "quick": quick}
    steps = {"saps": part_saps, "eager": part_eager, "rps": part_rps, "topk": part_topk,
             "speed": part_speed, "calibrate": part_calibrate}
    bar = tqdm(total=sum(_runs_of(p, reps, quick) for p in parts), desc="sim", unit="run",
               leave=False)
    for p in parts:
        r, e = steps[p](reps, seed, quick, bar)
        rows += r
        extra.update(e)
    bar.close()
    rows, extra = _keep_other_parts(rows, extra, parts)
    d = {"results": rows, **extra}
    extra["findings"] = findings(d)
    extra["plots"] = [str(x) for x in plot(d, common.results_dir())]
    return rows, extra


#: the extra keys each part writes
_EXTRA = {"saps": ("saps_curves",), "eager": ("eager_curves",),
          "topk": ("topk_curves", "topk_problem"), "calibrate": ("calibrate_problem",)}


def _keep_other_parts(rows, extra, parts):
    """A run of some parts keeps the other parts' results of the last sim.json (so
    ``--sim-parts rps`` reruns RPS alone)."""
    from bench import common
    old = common.load_results("sim")
    if old is None or extra.get("quick") != old.get("quick"):
        return rows, extra
    kept = [r for r in old["results"] if r["part"] not in parts]
    for p in set(old.get("parts", [])) - set(parts):
        for k in _EXTRA.get(p, ()):
            if k in old:
                extra[k] = old[k]
    extra["parts"] = sorted(set(parts) | {r["part"] for r in kept}, key=PARTS.index)
    return kept + rows, extra


def _part(d, name):
    return [r for r in d["results"] if r["part"] == name]


def findings(d):
    """The findings of every part that has results, one line each."""
    out = []
    for name, f in _FINDINGS.items():
        out += f(_part(d, name))
    return out


def _findings_saps(rows):
    out = []
    for P in sorted({r["workers"] for r in rows}):
        by = {r["policy"]: r for r in rows if r["workers"] == P}
        s = by["saps"]
        others = {k: v["time_to_target"] for k, v in by.items() if k != "saps"}
        reached = {k: t for k, t in others.items() if t is not None}
        fastest = min(reached, key=reached.get) if reached else None
        line = (f"saps, {P} workers: SaPS flagged exactly the slow class in "
                f"{sum(s['flagged_slow_class'])} of {len(s['flagged_slow_class'])} runs; ")
        if s["time_to_target"] is None:
            line += f"it did not reach {TARGET:g} held-out accuracy in every run."
        else:
            line += (f"time to {TARGET:g} held-out {s['time_to_target']:.4g} s (virtual), "
                     + ", ".join(f"{by[k]['time_to_target'] / s['time_to_target']:.2f}x that "
                                 f"of {k}" if by[k]["time_to_target"] else f"{k} not reached"
                                 for k in others)
                     + (f"; the fastest other policy is {fastest}." if fastest else "."))
        out.append(line)
    return out


def _findings_eager(rows):
    out = []
    for r in rows:
        if r["collective"] == "sync":
            continue
        holds = (r["speedup"] or 0) >= CLAIM_SPEEDUP and r["final_vs_sync"] <= CLAIM_LOSS
        sp = f"{r['speedup']:.2f}x" if r["speedup"] else "no speed-up (target not reached)"
        out.append(f"eager, {r['ranks']} ranks, {r['collective']}: {sp} sooner than sync to "
                   f"{TARGET:g} held-out, final loss {100 * r['final_vs_sync']:+.2f}% of sync's "
                   f"({r['mean_contributors']:.1f} contributors a round): the paper's claim "
                   f"({CLAIM_SPEEDUP}x, within {100 * CLAIM_LOSS:g}%) "
                   f"{'holds' if holds else 'does not hold'} here.")
    return out


def _findings_rps(rows):
    out = []
    for p in sorted({r["drop"] for r in rows} - {0.0}):
        gaps = [(r["shards"], r["gap_median"]) for r in sorted(rows, key=lambda r: r["shards"])
                if r["drop"] == p]
        shrinks = all(b[1] <= a[1] for a, b in zip(gaps, gaps[1:]))
        out.append(f"rps, p = {p:g}: gap " + ", ".join(f"S={s}: {100 * g:+.2f}%" for s, g in gaps)
                   + f"; it {'shrinks' if shrinks else 'does not shrink'} monotonically as S "
                   f"grows (first {100 * gaps[0][1]:+.2f}%, last {100 * gaps[-1][1]:+.2f}%).")
    return out


def _findings_topk(rows):
    out = []
    for g in sorted({r["gbps"] for r in rows}):
        by = {r["gradients"]: r for r in rows if r["gbps"] == g}
        td, tk = by["dense"]["time_to_target"], by["topk"]["time_to_target"]
        if td and tk:
            verdict = (f"TopK is {td / tk:.2f}x sooner" if tk < td
                       else f"dense is {tk / td:.2f}x sooner")
        else:
            verdict = f"dense {'reached' if td else 'missed'}, TopK {'reached' if tk else 'missed'}"
        ratio = by["dense"]["bytes_sent"] / max(by["topk"]["bytes_sent"], 1)
        out.append(f"topk, {g} Gb/s: {verdict} to {TOPK_TARGET:g} held-out (bytes sent "
                   f"{ratio:.0f}x fewer with TopK).")
    return out


def _findings_speed(rows):
    out = []
    if rows:
        worst = max(rows, key=lambda r: r["wall_s_median"])
        ok = all(r["wall_s_max"] <= SPEED_LIMIT_S for r in rows)
        out.append(f"speed, {rows[0]['workers']} workers, {rows[0]['epochs']} epochs of "
                   f"{rows[0]['samples']:,} x {rows[0]['features']:,}: every kind within "
                   f"{SPEED_LIMIT_S:g} s of wall time: {'yes' if ok else 'no'} (slowest: "
                   f"{worst['kind']}, median {worst['wall_s_median']:.1f} s; other processes "
                   "shared the CPUs).")
    return out


def _findings_calibrate(rows):
    """Per worker count and policy or collective: the median simulated time to the
    target against the median measured one over the seeds (the claim: within
    CAL_BAR), and how many single seeds came within it (a real run's own scatter from
    seed to seed is of the same order)."""
    out = []
    for P in sorted({r["workers"] for r in rows}):
        for name in dict.fromkeys(r["name"] for r in rows):
            rs = [r for r in rows if r["workers"] == P and r["name"] == name]
            if not rs:
                continue
            both = [r for r in rs if r["time_real"] and r["time_sim"]]
            within = sum(abs(r["error"]) <= CAL_BAR for r in both)
            text = f"calibrate, {P} workers, {name}: "
            if both:
                real = _med([r["time_real"] for r in both])
                sim = _med([r["time_sim"] for r in both])
                err = sim / real - 1.0
                text += (f"median simulated time to the target {sim:.3f} s against the "
                         f"measured {real:.3f} s ({100 * err:+.0f}%: "
                         f"{'within' if abs(err) <= CAL_BAR else 'not within'} "
                         f"{100 * CAL_BAR:g}%); ")
                upd = _med([abs(r["updates_sim"] / r["updates_real"] - 1.0) for r in both])
                rate = [r["updates_real"] / r["time_real"] for r in both]
                spread = (max(r["time_real"] for r in both) / min(r["time_real"] for r in both)
                          - 1.0)
            text += f"single seeds within {100 * CAL_BAR:g}% in {within} of {len(rs)}"
            if both:
                text += (f" (median |error| {100 * _med([abs(r['error']) for r in both]):.0f}%); "
                         f"updates to the target within {100 * upd:.0f}% (median); the real "
                         f"runs' times ranged {100 * spread:.0f}% over the seeds, their "
                         f"updates per second {min(rate):.0f}-{max(rate):.0f}.")
            out.append(text)
    return out


_FINDINGS = {"saps": _findings_saps, "eager": _findings_eager, "rps": _findings_rps,
             "topk": _findings_topk, "speed": _findings_speed,
             "calibrate": _findings_calibrate}

def summary_markdown(d):
    lines = ["Virtual seconds (the simulator's cluster), real losses and held-out accuracy; "
             "medians over the seeds."]
    rows = _part(d, "saps")
    if rows:
        lines += ["", "SaPS against BSP/ASP/SSP, a quarter of the workers 4x slower, 10 Gb/s:",
                  "", "| workers | policy | to {:g} held-out (s) | held-out | loss | flagged |"
                  .format(TARGET), "|---:|---|---:|---:|---:|---:|"]
        for r in rows:
            t = f"{r['time_to_target']:.4g}" if r["time_to_target"] else "-"
            lines.append(f"| {r['workers']} | {r['policy']} | {t} | {r['val_score']:.4f} | "
                         f"{r['final_loss']:.4f} | {_med(r['flagged'])} |")
    rows = _part(d, "eager")
    if rows:
        lines += ["", f"eager-SGD, {rows[0]['ranks']} ranks, {IMBALANCE[0]} sleeping "
                  f"{IMBALANCE[1] * 1e3:g} ms per round:", "",
                  "| collective | to target (s) | speed-up | held-out | loss vs sync | "
                  "contributors |", "|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            t = f"{r['time_to_target']:.4g}" if r["time_to_target"] else "-"
            sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
            lines.append(f"| {r['collective']} | {t} | {sp} | {r['val_score']:.4f} | "
                         f"{100 * r['final_vs_sync']:+.2f}% | {r['mean_contributors']:.1f} |")
    rows = _part(d, "rps")
    if rows:
        drops = sorted({r["drop"] for r in rows} - {0.0})
        lines += ["", f"RPS at {rows[0]['workers']} workers, gap of the final loss to p = 0:",
                  "", "| S | loss at p = 0 | " + " | ".join(f"p = {p:g}" for p in drops) + " |",
                  "|---:|---:|" + "---:|" * len(drops)]
        for S in sorted({r["shards"] for r in rows}):
            by = {r["drop"]: r for r in rows if r["shards"] == S}
            lines.append(f"| {S} | {by[0.0]['final_loss']:.4f} | " +
                         " | ".join(f"{100 * by[p]['gap_median']:+.2f}%" for p in drops) + " |")
    rows = _part(d, "topk")
    if rows:
        lines += ["", f"TopK ({TOPK_RATIO:g}) against dense, sync allreduce, {rows[0]['ranks']} "
                  "ranks:", "", "| Gb/s | gradients | to target (s) | held-out | bytes sent |",
                  "|---:|---|---:|---:|---:|"]
        for r in rows:
            t = f"{r['time_to_target']:.4g}" if r["time_to_target"] else "-"
            lines.append(f"| {r['gbps']} | {r['gradients']} | {t} | {r['val_score']:.4f} | "
                         f"{r['bytes_sent']:.3g} |")
    rows = _part(d, "speed")
    if rows:
        lines += ["", f"The simulator's wall time, {rows[0]['workers']} workers:", "",
                  "| kind | wall s (median) | wall s (max) | updates |", "|---|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['kind']} | {r['wall_s_median']:.2f} | {r['wall_s_max']:.2f} | "
                         f"{r['updates']} |")
    rows = _part(d, "calibrate")
    if rows:
        lines += ["", "Calibrated on this box: measured against simulated time to the "
                  f"training-loss target ({CAL_LOSS['ps']:g} ps, {CAL_LOSS['collective']:g} "
                  "collectives; seconds, wall vs virtual):", "",
                  "| workers | run | seed | step (ms) | start (ms) | gate (ms) | measured | "
                  "simulated | error | updates (real / sim) |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            f = (lambda t: f"{t:.3g}" if t is not None else "-")
            e = f"{100 * r['error']:+.0f}%" if r["error"] is not None else "-"
            lines.append(f"| {r['workers']} | {r['name']} | {r['seed']} | "
                         f"{1e3 * r['step_s']:.3f} | {1e3 * r.get('start_s', 0.0):.1f} | "
                         f"{1e3 * r.get('gate_s', 0.0):.3f} | {f(r['time_real'])} | "
                         f"{f(r['time_sim'])} "
                         f"| {e} | {r['updates_real']} / {r['updates_sim']} |")
    lines += ["", "Findings:", "", *[f"- {f}" for f in d.get("findings", findings(d))]]
    return "\n".join(lines)


# ---- plots ------------------------------------------------------------------------------------
def _curves_plot(ax, curves, keys, labels, target):
    for i, (k, lab) in enumerate(zip(keys, labels)):
        if k in curves:
            c = curves[k]
            ax.plot(c["seconds"], c["val_score"], color=f"C{i}", lw=1.3, label=lab)
    ax.axhline(target, color="grey", ls="--", lw=1, label="target")
    ax.set_xlabel("virtual seconds")
    ax.set_ylabel("held-out accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot(d, folder):
    """The parts' PNGs (those with results) in ``folder``; their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = []
    folder.mkdir(parents=True, exist_ok=True)

    def save(fig, name):
        fig.tight_layout()
        path = folder / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

    if "saps_curves" in d:
        Ps = sorted({int(k.split("/")[0]) for k in d["saps_curves"]})
        fig, axes = plt.subplots(1, len(Ps), figsize=(6 * len(Ps), 4), squeeze=False)
        for ax, P in zip(axes[0], Ps):
            _curves_plot(ax, d["saps_curves"], [f"{P}/{p}" for p in POLICIES], POLICIES, TARGET)
            ax.set_title(f"{P} workers, a quarter 4x slower (simulated)", fontsize=9)
        save(fig, "sim_saps.png")
    if "eager_curves" in d:
        fig, ax = plt.subplots(figsize=(6, 4))
        _curves_plot(ax, d["eager_curves"], COLLECTIVES, COLLECTIVES, TARGET)
        ax.set_title(f"eager-SGD, {_part(d, 'eager')[0]['ranks']} ranks, imbalance "
                     f"{IMBALANCE} (simulated)", fontsize=9)
        save(fig, "sim_eager.png")
    rows = _part(d, "rps")
    if rows:
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, p in enumerate(sorted({r["drop"] for r in rows} - {0.0})):
            rs = sorted((r for r in rows if r["drop"] == p), key=lambda r: r["shards"])
            ax.plot([r["shards"] for r in rs], [100 * r["gap_median"] for r in rs], marker="o",
                    color=f"C{i}", label=f"p = {p:g}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("servers S")
        ax.set_ylabel("final loss gap to p = 0 (%)")
        ax.set_title(f"RPS, {rows[0]['workers']} workers (simulated)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "sim_rps.png")
    if "topk_curves" in d:
        fig, axes = plt.subplots(1, len(GBPS), figsize=(5 * len(GBPS), 4), squeeze=False)
        for ax, g in zip(axes[0], GBPS):
            _curves_plot(ax, d["topk_curves"], [f"{g}/dense", f"{g}/topk"],
                         ["dense", f"TopK {TOPK_RATIO:g}"], TOPK_TARGET)
            ax.set_title(f"{g} Gb/s links (simulated)", fontsize=9)
        save(fig, "sim_topk.png")
    return paths
