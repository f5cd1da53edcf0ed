"""Transactional conflict delays: empirical competitive ratios of relaxed.conflict policies.

Scenario. Every policy (abort at once, wait forever, exponential backoff with 6 probes,
wait-B, the ski-rental density, and the requestor-wins deterministic and randomized policies
tuned for the model's k) meets conflicts whose holder releases after T drawn from four
workloads (abort cost B = 1; T in the same unit):

  exponential(mean=0.5)   short holders (most conflicts are worth waiting out)
  exponential(mean=2)     long holders
  pareto(alpha=1.5, ...)  heavy-tailed Lomax holders with mean B (infinite variance)
  adversarial             the worst T for the policy: exact supremum over a grid of
                          [1e-3 B, 10 B] plus its critical points, and a Monte Carlo
                          re-estimate at that T

under three cost models: requestor-aborts (ski rental), requestor-wins with one stalled
requestor (k = 1) and with four (k = 4). Reported: the ratio of means E[cost]/E[OPT] over
``n`` conflicts, min/median/max over ``reps`` repetitions (seeds seed, seed+1, ...; all
policies of a repetition face the same holder times), after one small warm-up run that
compiles the Numba kernels; the exact adversarial ratio; the documented (closed-form) ratio.
The plot shows the exact E[cost(T)]/OPT(T) of each policy against T/B for each model.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from relaxed import conflict as C

MODELS = (("requestor-aborts", None), ("requestor-wins", 1.0), ("requestor-wins", 4.0))


def _settings(reps, seed, quick):
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps must be an int >= 1, got {reps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    return {"reps": reps, "seed": seed, "quick": bool(quick), "B": 1.0,
            "n": 20_000 if quick else 200_000,
            "adversarial_points": 121 if quick else 241,
            "adversarial_mc_per_point": 5_000 if quick else 20_000,
            "models": [[m, k] for m, k in MODELS]}


def _workloads(s):
    B = s["B"]
    return (C.Exponential(0.5 * B), C.Exponential(2.0 * B), C.Pareto(1.5, 0.5 * B),
            C.Adversarial(points=s["adversarial_points"],
                          mc_per_point=s["adversarial_mc_per_point"]))


def _finite(x):
    """JSON has no inf/nan: write them as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else ("-inf" if x < 0 else "nan")
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _curves(B=1.0, points=160):
    """Exact E[cost(T)]/OPT(T) for every policy, T/B in [1e-2, 10], under each model."""
    t = np.geomspace(1e-2, 10.0, points) * B
    out = []
    for model, k in MODELS:
        for spec in C.DEFAULT_POLICIES:
            p = C.policy(spec, B=B, k=(k or 1.0)) if spec.startswith("rw-") else C.policy(spec, B=B)
            out.append({"model": model, "k": 1.0 if k is None else k, "policy": p.name,
                        "T_over_B": list(t / B),
                        "ratio": list(C.expected_ratio(p, t, model, k))})
    return out


def run(reps: int, seed: int, out_dir: Path, quick: bool = False) -> dict:
    """Compute the tables, write ``out_dir/conflict.json`` and ``out_dir/conflict.png``,
    return the JSON dict (``header``, ``results``, ``curves``, ``timings_s``).

    Prints nothing (the caller prints the header and :func:`summary_markdown`)."""
    from bench import common
    s = _settings(reps, seed, quick)
    out_dir = Path(out_dir)
    hdr = common.header(SimpleNamespace(**s))
    workloads = _workloads(s)
    # warm-up: compile (or load from cache) every kernel on a tiny table
    C.competitive_table(workloads=(C.Exponential(1.0), C.Adversarial(points=11, mc_per_point=10)),
                        models=MODELS, n=100, seed=seed)
    per_rep, timings = [], []
    for r in range(reps):
        t0 = time.perf_counter()
        per_rep.append(C.competitive_table(workloads=workloads, models=MODELS, B=s["B"],
                                           n=s["n"], seed=seed + r))
        timings.append(time.perf_counter() - t0)
    rows = []
    for i, first in enumerate(per_rep[0]):
        ratios = sorted(rep[i]["ratio"] for rep in per_rep)
        rows.append({"model": first["model"], "k": first["k"], "policy": first["policy"],
                     "workload": first["workload"], "n": s["n"],
                     "min": ratios[0], "median": statistics.median(ratios), "max": ratios[-1],
                     "ratios": ratios, "exact": first["exact"], "worst_T": first["worst_T"],
                     "documented": first["documented"],
                     "mc_sup": [rep[i]["mc_sup"] for rep in per_rep]
                     if first["mc_sup"] is not None else None})
    result = _finite({"header": hdr, "results": rows, "curves": _curves(s["B"]),
                      "timings_s": {"table_per_rep": timings,
                                    "table_median": statistics.median(timings)}})
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "conflict.json"
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)
    plot(result, out_dir / "conflict.png")
    return result


def plot(result: dict, path: Path) -> Path:
    """One panel per model: exact E[cost(T)]/OPT(T) against T/B, documented optima dashed."""
    from matplotlib.figure import Figure      # no pyplot: the backend is left alone

    panels = list(dict.fromkeys((c["model"], c["k"]) for c in result["curves"]))
    fig = Figure(figsize=(5.2 * len(panels), 4.4))
    axes = fig.subplots(1, len(panels), sharey=True)
    for ax, (model, k) in zip(np.atleast_1d(axes), panels):
        for c in result["curves"]:
            if (c["model"], c["k"]) == (model, k):
                ax.plot(c["T_over_B"], c["ratio"], label=c["policy"],
                        lw=2.2 if c["policy"].startswith(("randomized", "rw-randomized")) else 1.4)
        if model == "requestor-aborts":
            marks = {"2 (deterministic)": 2.0, "e/(e-1)": C.E_RATIO}
        else:
            marks = {f"2+1/k = {C.rw_deterministic_ratio(k):.3g}": C.rw_deterministic_ratio(k),
                     f"1/(1-(k/(k+1))^k) = {C.rw_randomized_ratio(k):.3g}":
                         C.rw_randomized_ratio(k)}
        for label, y in marks.items():
            ax.axhline(y, ls="--", lw=0.8, color="grey")
            ax.text(10.0, y, label, fontsize=7, ha="right", va="bottom", color="dimgrey")
        ax.set_xscale("log")
        ax.set_ylim(0.9, 5.0)
        ax.set_xlabel("holder's remaining time T / B")
        ax.set_title(f"{model}" + ("" if model == "requestor-aborts" else f", k = {k:g}"),
                     fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("E[cost(T)] / OPT(T)  (exact)")
    np.atleast_1d(axes)[0].legend(fontsize=7, loc="upper left")
    h = result["header"]
    fig.suptitle(f"relaxed.conflict: competitive ratio vs holder time "
                 f"({h['cpu']}, {h['date'][:10]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return Path(path)


def _fmt(x, digits=3):
    if x is None:
        return "–"
    if isinstance(x, str):
        return "∞" if x == "inf" else x
    return f"{x:.{digits}f}"


def summary_markdown(result: dict) -> str:
    """Markdown tables: one per model, policies by workload (median ratio of means over the
    repetitions; adversarial: exact supremum, Monte Carlo median in brackets)."""
    rows = result["results"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    out = []
    for model, k in dict.fromkeys((r["model"], r["k"]) for r in rows):
        title = model if model == "requestor-aborts" else f"{model}, k = {k:g}"
        out.append(f"**{title}** (E[cost]/E[OPT], B = 1, n = {rows[0]['n']:,} conflicts, "
                   f"median of {len(rows[0]['ratios'])} reps)\n")
        out.append("| policy | " + " | ".join(workloads) + " | documented |")
        out.append("|---|" + "---:|" * (len(workloads) + 1))
        for pol in dict.fromkeys(r["policy"] for r in rows
                                 if (r["model"], r["k"]) == (model, k)):
            cells = []
            for w in workloads:
                r = next(r for r in rows if (r["model"], r["k"], r["policy"], r["workload"])
                         == (model, k, pol, w))
                if r["exact"] is not None:
                    cells.append(f"{_fmt(r['exact'])} ({_fmt(r['median'])})")
                else:
                    cells.append(_fmt(r["median"]))
            doc = next(r["documented"] for r in rows
                       if (r["model"], r["k"], r["policy"]) == (model, k, pol))
            out.append(f"| {pol} | " + " | ".join(cells) + f" | {_fmt(doc)} |")
        out.append("")
    out.append("Adversarial: the worst holder time on a grid of [1e-3·B, 10·B] plus the "
               "policy's critical points, so the unbounded baselines show 1/1e-3 (abort), "
               "10·k (wait) and b/1e-3 with b = B/63 (backoff).")
    return "\n".join(out)
