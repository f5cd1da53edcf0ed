"""Parameter server with one straggler (``python -m bench ps``): BSP, ASP, SSP and
SaPS on the same problem, worker 0 slowed 4x. Each repetition runs every policy
once (interleaved) for ``seconds``; reported: the time to a target training loss
(from the loss history), the final loss, updates and detections. Medians.
"""
from __future__ import annotations

import statistics

from tqdm import tqdm

from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import train
from sgd_shm.ps.train import plot_losses

POLICIES = ("bsp", "asp", "ssp", "saps")


def _ttt(history, target):
    return next((h["seconds"] for h in history if h["loss"] <= target), None)


def run(n_workers, reps, seed, *, samples=20_000, features=2_000, seconds=6.0,
        target=0.53, slow=4.0, progress=True):
    X, y = make_rcv1_like(samples, features, random_state=seed)
    acc = {p: [] for p in POLICIES}
    curves = {}
    bar = tqdm(total=(reps + 1) * len(POLICIES), desc="ps", leave=False, disable=not progress)
    for rep in range(reps + 1):                      # rep 0 is the warm-up
        for pol in POLICIES:
            r = train(X, y, n_workers=n_workers, policy=pol, slowdown={0: slow},
                      max_seconds=seconds, seed=seed + rep)
            if rep:
                acc[pol].append(r)
                if rep == 1:
                    curves[pol] = {"seconds": [h["seconds"] for h in r.history],
                                   "loss": [h["loss"] for h in r.history],
                                   "detections": r.detections}
            bar.update()
    bar.close()
    rows = []
    for pol in POLICIES:
        rs = acc[pol]
        ttts = [_ttt(r.history, target) for r in rs]
        reached = [t for t in ttts if t is not None]
        rows.append({"policy": pol, "workers": n_workers, "slowdown_worker0": slow,
                     "time_to_target_median": statistics.median(reached) if reached else None,
                     "reached": len(reached), "runs": len(rs), "time_to_target": ttts,
                     "final_loss_median": statistics.median(r.final_loss for r in rs),
                     "updates_median": statistics.median(r.updates for r in rs),
                     "detections": [[w for _, w in r.detections] for r in rs],
                     "first_detection_s": [r.detections[0][0] if r.detections else None
                                           for r in rs],
                     "dropped_worker0": [r.workers[0]["dropped"] for r in rs]})
    problem = {"samples": samples, "features": features, "seconds": seconds, "target": target}
    return rows, {"problem": problem, "curves": curves}


def ratios(rows):
    by = {r["policy"]: r for r in rows}
    out = {}
    if by["bsp"]["time_to_target_median"] and by["saps"]["time_to_target_median"]:
        out["bsp_over_saps_time_to_target"] = (by["bsp"]["time_to_target_median"]
                                               / by["saps"]["time_to_target_median"])
    out["saps_minus_asp_final_loss"] = (by["saps"]["final_loss_median"]
                                        - by["asp"]["final_loss_median"])
    return out


def plot(d, path):
    r0 = d["results"][0]
    return plot_losses(d["curves"], d["problem"]["target"], path,
                       f"parameter server, {r0['workers']} workers, worker 0 slowed "
                       f"{r0['slowdown_worker0']:g}x (dotted: SaPS detection)")


def summary_markdown(d):
    p = d["problem"]
    rows = d["results"]
    lines = [f"RCV1-like {p['samples']:,} × {p['features']:,}, {rows[0]['workers']} worker "
             f"processes, worker 0 slowed {rows[0]['slowdown_worker0']:g}×, {p['seconds']:g} s "
             f"per run, target loss {p['target']}:", "",
             "| policy | time to target (s) | reached | final loss | updates | SaPS detections |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        ttt = (f"{r['time_to_target_median']:.2f}" if r["time_to_target_median"] is not None
               else "–")
        det = "; ".join(",".join(map(str, x)) or "none" for x in r["detections"]) \
            if r["policy"] == "saps" else ""
        lines.append(f"| {r['policy']} | {ttt} | {r['reached']}/{r['runs']} | "
                     f"{r['final_loss_median']:.4f} | {r['updates_median']:,.0f} | {det} |")
    rt = d.get("ratios", {})
    if "bsp_over_saps_time_to_target" in rt:
        lines.append(f"\nSaPS reaches the target {rt['bsp_over_saps_time_to_target']:.2f}× sooner "
                     f"than BSP; its final loss minus ASP's: "
                     f"{rt['saps_minus_asp_final_loss']:+.4f}.")
    h = d["header"]
    lines.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
                 f"medians of {h['reps']} interleaved repetitions after a warm-up</sub>")
    return "\n".join(lines)
