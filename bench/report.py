"""Markdown tables from bench/results/*.json (written by ``python -m bench plot``
to bench/results/SUMMARY.md, and pasted into the README's benchmark section)."""
from __future__ import annotations

import importlib

from bench import common
from bench.common import fmt_rate, load_results as _load


# scenarios whose module writes its own markdown (and draws its own plot); heading
# None: the markdown has one
SCENARIO_TABLES = (("mis", None),
                   ("delay", "### The price of asynchrony: SGD on stale weights"),
                   ("mf", "### Hogwild matrix factorization"),
                   ("ps", "### Parameter server with a straggler"),
                   ("stm", "### TL2 STM: bank transfers, commits/s"),
                   ("conflict", "### Conflict policies: empirical competitive ratios (simulator)"))


def _rate_table(data, label):
    rows = data["results"]
    ws = sorted({r["workers"] for r in rows})
    out = [f"| {label} | " + " | ".join(f"{w} worker{'s' if w > 1 else ''}" for w in ws) + " |",
           "|---|" + "---:|" * len(ws)]
    for c in dict.fromkeys(r["competitor"] for r in rows):
        cells = []
        for w in ws:
            r = next((r for r in rows if r["competitor"] == c and r["workers"] == w), None)
            cells.append(f"{fmt_rate(r['median'])} ({fmt_rate(r['min'])}–{fmt_rate(r['max'])})"
                         if r else "–")
        out.append(f"| {c} | " + " | ".join(cells) + " |")
    h = data["header"]
    out.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
               f"python {h['python']}, numpy {h['numpy']} · median (min–max) of {h['reps']} "
               f"after a warm-up</sub>")
    return "\n".join(out)


def summary() -> str:
    parts = []
    d = _load("pq-threads")
    if d:
        parts += ["### Hold model, threads (ops/s)", _rate_table(d, "competitor")]
    d = _load("pq-processes")
    if d:
        parts += ["### Hold model, processes sharing one queue (ops/s)", _rate_table(d, "competitor")]
    d = _load("quality")
    if d:
        lines = ["### Relaxation quality (rank error of pops)", "",
                 "| threads | queues | stickiness | rank error mean (all runs) | undisturbed runs | "
                 "p99 | max | theory 5/6·n−1+1/(6n) | delay mean |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in d["results"]:
            calm = (f"{r['undisturbed_rank_mean']:.2f} ({r['undisturbed_runs']})"
                    if r.get("undisturbed_rank_mean") is not None else "– (0)")
            lines.append(f"| {r['threads']} | {r['queues']} | {r['stickiness']} | "
                         f"{r['rank_mean']:.2f} | {calm} | {r['rank_p99']:.0f} | "
                         f"{r['rank_max']:.0f} | {r['theory_rank_mean']:.2f} | "
                         f"{r['delay_mean']:.2f} |")
        h = d["header"]
        lines.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
                     f"medians over {h['reps']} runs; 'undisturbed' = runs in which no thread's "
                     f"log shows a pause over 1 ms (count in brackets)</sub>")
        parts.append("\n".join(lines))
    d = _load("hogwild")
    if d:
        sk = next(r for r in d["results"] if r["competitor"] == "sklearn")
        p = d["problem"]
        lines = [f"### Hogwild SGD, {p['n_samples']:,} × {p['n_features']:,} RCV1-like "
                 f"({p['nnz'] / 1e6:.1f}M nonzeros), log loss", "",
                 "| competitor | workers | s / epoch | speed vs sklearn | vs 1 worker, paired "
                 f"(range) | train loss after {d['results'][0]['epochs']} epochs | "
                 "time to target (s) |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        for r in d["results"]:
            ttt = f"{r['time_to_target_s']:.3f}" if r["time_to_target_s"] is not None else "–"
            sp1 = (f"{r['speedup_vs_1']:.2f}× ({r['speedup_vs_1_range'][0]:.2f}–"
                   f"{r['speedup_vs_1_range'][1]:.2f})" if "speedup_vs_1" in r and r["workers"] > 1
                   else "–")
            lines.append(f"| {r['competitor']} | {r['workers']} | {r['epoch_s_median']:.3f} | "
                         f"{sk['epoch_s_median'] / r['epoch_s_median']:.2f}× | {sp1} | "
                         f"{r['final_train_loss']:.4f} | {ttt} |")
        h = d["header"]
        lines.append(f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
                     f"median of {h['reps']} runs after a warm-up; epoch time = median of epochs "
                     f"2..E; target = 1.01 × sklearn's final training loss "
                     f"({d['target_train_loss']:.4f})</sub>")
        hl = d.get("hot_layout_s")
        if hl and hl["hot_features"]:
            lines.append(f"\nOne-time cost per fit, not in the epoch times: the hot-first copy "
                         f"of the rows ({hl['hot_features']} hot features, used with several "
                         f"workers) {hl['hot_s']:.3f} s; the plain rows {hl['plain_s']:.3f} s.")
        st = d.get("staleness", {})
        if st:
            lines.append("\nStaleness (updates applied by other workers between a worker's read "
                         "and its write; instrumented runs, 2 epochs):\n")
            lines.append("| backend-workers | mean tau | share with tau = 0 | largest tau seen |")
            lines.append("|---|---:|---:|---:|")
            for k, v in st.items():
                lines.append(f"| {k} | {v['mean_tau']:.2f} | {100 * v['frac_tau0']:.1f}% | "
                             f"{v['max_tau_bin']}{'+' if v['max_tau_bin'] == len(v['hist']) - 1 else ''} |")
        tr = d.get("torch")
        if tr:
            lines.append(f"\nPyTorch {tr['version']} Hogwild in the style of its mnist_hogwild "
                         f"example (`--torch`: shared `nn.Linear`, sparse CSR minibatches of "
                         f"{tr['batch']}, SGD lr {tr['lr']}, one epoch, measured once): " +
                         "; ".join(f"{x['workers']} process{'es' if x['workers'] > 1 else ''} "
                                   f"{x['epoch_s']:.2f} s per epoch" for x in tr["runs"]) + ".")
        parts.append("\n".join(lines))
    d = _load("counter")
    if d:
        parts += ["### Counter increments (increments/s)", _rate_table(d, "competitor")]
        lines = ["| counters m | mean \\|read−exact\\|/m | p99 | max | error_bound()/m |",
                 "|---:|---:|---:|---:|---:|"]
        for e in d["read_error"]:
            lines.append(f"| {e['n_counters']} | {e['mean']:.2f} | {e['p99']:.2f} | {e['max']:.2f} "
                         f"| {e['bound_per_counter']:.1f} |")
        parts.append("read() error while two threads increment:\n\n" + "\n".join(lines))
    for name, heading in SCENARIO_TABLES:
        d = _load(name)
        if d:
            md = importlib.import_module(f"bench.{name}").summary_markdown(d)
            parts.append(f"{heading}\n\n{md}" if heading else md)
    return "\n\n".join(parts) + "\n"


def write_summary():
    path = common.results_dir() / "SUMMARY.md"
    path.write_text(summary())
    return path
