"""Parameter server with one straggler (``python -m bench ps``): BSP, ASP, SSP and
SaPS on the same problem, worker 0 slowed 4x. Each repetition runs every policy
once (interleaved) for ``seconds``, plus a SaPS control run with no slowdown
(nobody should be flagged); reported: the time to the target training loss and
to a tighter one (from the loss history), the final loss, updates, mean push
staleness, minibatches stolen, the epochs of the straggler's partition against
the others', and detections. Medians.
"""
from __future__ import annotations

import statistics

import numpy as np
from tqdm import tqdm

from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import POLICIES, curves_of, plot_losses, train


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def run(n_workers, reps, seed, *, samples=20_000, features=2_000, seconds=4.0,
        target=0.53, tight=0.521, slow=4.0, progress=True):
    X, y = make_rcv1_like(samples, features, random_state=seed)
    acc = {p: [] for p in POLICIES}
    control = []
    first = {}
    bar = tqdm(total=(reps + 1) * (len(POLICIES) + 1), desc="ps", leave=False,
               disable=not progress)
    for rep in range(reps + 1):                      # rep 0 is the warm-up
        for pol in POLICIES:
            # one seed for every repetition: the same partitions and evaluation
            # rows, so the targets mean the same; repetitions differ in timing only
            r = train(X, y, n_workers=n_workers, policy=pol, slowdown={0: slow},
                      max_seconds=seconds, seed=seed)
            if rep:
                acc[pol].append(r)
                first.setdefault(pol, r)
            bar.update()
        r = train(X, y, n_workers=n_workers, policy="saps", max_seconds=seconds, seed=seed)
        if rep:
            control.append([w for _, w in r.detections])
        bar.update()
    bar.close()
    rows = []
    for pol in POLICIES:
        rs = acc[pol]
        ttts = [r.time_to(target) for r in rs]
        tights = [r.time_to(tight) for r in rs]
        reached = [t for t in ttts if t is not None]
        tau = [r.mean_staleness for r in rs]
        ep0 = [r.batches["epochs"][0] / max(1, statistics.median(r.batches["epochs"][1:]))
               for r in rs] if n_workers > 1 else [1.0] * len(rs)
        rows.append({"policy": pol, "workers": n_workers, "slowdown_worker0": slow,
                     "time_to_target_median": _median(ttts),
                     "reached": len(reached), "runs": len(rs), "time_to_target": ttts,
                     "time_to_tight_median": _median(tights),
                     "reached_tight": sum(t is not None for t in tights),
                     "time_to_tight": tights,
                     "final_loss_median": statistics.median(r.final_loss for r in rs),
                     "updates_median": statistics.median(r.updates for r in rs),
                     "mean_staleness_median": statistics.median(tau),
                     "stolen_median": statistics.median(sum(r.batches["stolen_by_worker"])
                                                        for r in rs),
                     "straggler_epochs_ratio_median": statistics.median(ep0),
                     "lost_batches": [r.batches["lost"] for r in rs],
                     "staleness_hist": np.sum([np.sum(r.staleness_hist, axis=0)
                                               for r in rs], axis=0).tolist(),
                     "detections": [[w for _, w in r.detections] for r in rs],
                     "first_detection_s": [r.detections[0][0] if r.detections else None
                                           for r in rs],
                     "dropped_worker0": [r.workers[0]["dropped"] for r in rs]})
    problem = {"samples": samples, "features": features, "seconds": seconds, "target": target,
               "tight_target": tight}
    return rows, {"problem": problem, "curves": curves_of(first),
                  "control_detections": control}


def ratios(rows):
    by = {r["policy"]: r for r in rows}
    out = {}
    if by["bsp"]["time_to_target_median"] and by["saps"]["time_to_target_median"]:
        out["bsp_over_saps_time_to_target"] = (by["bsp"]["time_to_target_median"]
                                               / by["saps"]["time_to_target_median"])
    if by["bsp"]["time_to_tight_median"] and by["saps"]["time_to_tight_median"]:
        out["bsp_over_saps_time_to_tight"] = (by["bsp"]["time_to_tight_median"]
                                              / by["saps"]["time_to_tight_median"])
    out["saps_minus_asp_final_loss"] = (by["saps"]["final_loss_median"]
                                        - by["asp"]["final_loss_median"])
    return out


def plot(d, path):
    r0 = d["results"][0]
    return plot_losses(d["curves"], d["problem"]["target"], path,
                       f"parameter server, {r0['workers']} workers, worker 0 slowed "
                       f"{r0['slowdown_worker0']:g}x (dotted: SaPS detection; first "
                       f"repetition)", n_workers=r0["workers"])


def summary_markdown(d):
    p = d["problem"]
    rows = d["results"]
    lines = [f"RCV1-like {p['samples']:,} × {p['features']:,}, {rows[0]['workers']} worker "
             f"processes, worker 0 slowed {rows[0]['slowdown_worker0']:g}×, {p['seconds']:g} s "
             f"per run, target loss {p['target']} (tight target {p['tight_target']}):", "",
             "| policy | time to target (s) | reached | time to tight target (s) | reached | "
             "final loss | updates | mean τ | stolen | straggler epochs / others' | "
             "SaPS detections |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]

    def sec(x):
        return f"{x:.2f}" if x is not None else "–"
    for r in rows:
        det = "; ".join(",".join(map(str, x)) or "none" for x in r["detections"]) \
            if r["policy"] == "saps" else ""
        lines.append(f"| {r['policy']} | {sec(r['time_to_target_median'])} | "
                     f"{r['reached']}/{r['runs']} | {sec(r['time_to_tight_median'])} | "
                     f"{r['reached_tight']}/{r['runs']} | {r['final_loss_median']:.4f} | "
                     f"{r['updates_median']:,.0f} | {r['mean_staleness_median']:.2f} | "
                     f"{r['stolen_median']:,.0f} | {r['straggler_epochs_ratio_median']:.2f} | "
                     f"{det} |")
    rt = d.get("ratios", {})
    if "bsp_over_saps_time_to_target" in rt:
        lines.append(f"\nSaPS reaches the target {rt['bsp_over_saps_time_to_target']:.2f}× sooner "
                     f"than BSP" + (f" ({rt['bsp_over_saps_time_to_tight']:.2f}× for the tight "
                                    "target)" if "bsp_over_saps_time_to_tight" in rt else "")
                     + f"; its final loss minus ASP's: {rt['saps_minus_asp_final_loss']:+.4f}.")
    ctl = d.get("control_detections")
    if ctl is not None:
        lines.append(f"Control, SaPS with no slowdown: workers flagged per run: "
                     f"{'; '.join(','.join(map(str, x)) or 'none' for x in ctl)}.")
    h = d["header"]
    lines.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
                 f"medians of {h['reps']} interleaved repetitions after a warm-up</sub>")
    return "\n".join(lines)
