"""docs/benchmarks.md from bench/results/*.json (written by ``python -m bench plot``).

The page is the one place for figures: for every scenario that has results it gives the
definition (below, beside the code that runs it), the machine and command from the run's
header, the tables computed from the JSON and the plot. Nothing on it is typed by hand, so
it never disagrees with the results it shows.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from bench import common
from bench.common import fmt_rate, load_results as _load

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Scenario:
    name: str                   # bench/results/<name>.json, `python -m bench <name>`
    title: str
    definition: str             # what is run and what is reported
    plots: tuple = ()           # PNG files in the results folder
    notes: str = ""             # how to read the results (mechanisms, never figures)


def _rate_table(data):
    rows = data["results"]
    ws = sorted({r["workers"] for r in rows})
    out = ["| competitor | " + " | ".join(f"{w} worker{'s' if w > 1 else ''}" for w in ws) + " |",
           "|---|" + "---:|" * len(ws)]
    for c in dict.fromkeys(r["competitor"] for r in rows):
        cells = []
        for w in ws:
            r = next((r for r in rows if r["competitor"] == c and r["workers"] == w), None)
            cells.append(f"{fmt_rate(r['median'])} ({fmt_rate(r['min'])}–{fmt_rate(r['max'])})"
                         if r else "–")
        out.append(f"| {c} | " + " | ".join(cells) + " |")
    out.append(_footer(data, f"median (min–max) of {data['header']['reps']} after a warm-up"))
    ranked = [r for r in rows if r.get("rank_error_mean") is not None]
    if ranked:
        out += ["", "Rank error of the same configurations (mean over the pops of a logged run; "
                "median over the runs in which no thread paused over 1 ms, their count in "
                "brackets; every run's mean beside it):", "",
                "| competitor | workers | queues | stickiness | rank error | all runs |",
                "|---|---:|---:|---:|---:|---|"]
        out += [f"| {r['competitor']} | {r['workers']} | {r['queues']} | {r['stickiness']} | "
                f"{r['rank_error_mean']:.2f} ({r.get('rank_error_undisturbed_runs', '–')}) | "
                + ", ".join(f"{m:.2f}" for m in r["rank_error_runs"]) + " |" for r in ranked]
    return "\n".join(out)


def _footer(data, method):
    h = data["header"]
    return (f"\n<sub>`{h['command']}` · {h['date']} · {h['cpu']}, {h['cpu_count']} CPUs · "
            f"python {h['python']}, numpy {h['numpy']} · {method}</sub>")


def _quality_table(d):
    lines = ["| threads | queues | stickiness | rank error mean (all runs) | undisturbed runs | "
             "p99 | max | theory 5/6·n−1+1/(6n) | delay mean |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d["results"]:
        calm = (f"{r['undisturbed_rank_mean']:.2f} ({r['undisturbed_runs']})"
                if r.get("undisturbed_rank_mean") is not None else "– (0)")
        lines.append(f"| {r['threads']} | {r['queues']} | {r['stickiness']} | "
                     f"{r['rank_mean']:.2f} | {calm} | {r['rank_p99']:.0f} | "
                     f"{r['rank_max']:.0f} | {r['theory_rank_mean']:.2f} | "
                     f"{r['delay_mean']:.2f} |")
    lines.append(_footer(d, f"medians over {d['header']['reps']} runs; 'undisturbed' = runs in "
                            "which no thread's log shows a pause over 1 ms (count in brackets)"))
    return "\n".join(lines)


def _hogwild_speed(d):
    sk = next(r for r in d["results"] if r["competitor"] == "sklearn")
    p = d["problem"]
    lines = [f"{p['n_samples']:,} × {p['n_features']:,} RCV1-like ({p['nnz'] / 1e6:.1f}M "
             "nonzeros), log loss:", "",
             "| competitor | workers | s / epoch | speed vs sklearn | vs 1 worker, paired "
             f"(range) | held-out accuracy after {d['results'][0]['epochs']} epochs | "
             "train loss | time to target (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d["results"]:
        ttt = f"{r['time_to_target_s']:.3f}" if r["time_to_target_s"] is not None else "–"
        sp1 = (f"{r['speedup_vs_1']:.2f}× ({r['speedup_vs_1_range'][0]:.2f}–"
               f"{r['speedup_vs_1_range'][1]:.2f})" if "speedup_vs_1" in r and r["workers"] > 1
               else "–")
        lines.append(f"| {r['competitor']} | {r['workers']} | {r['epoch_s_median']:.3f} | "
                     f"{sk['epoch_s_median'] / r['epoch_s_median']:.2f}× | {sp1} | "
                     + (f"{r['final_val_accuracy']:.4f}" if "final_val_accuracy" in r else "–")
                     + f" | {r['final_train_loss']:.4f} | {ttt} |")
    target = (f"sklearn's final held-out accuracy − {d['target_gap']:g} "
              f"({d['target_val_accuracy']:.4f}), on {p['n_held_out']:,} held-out rows"
              if "target_val_accuracy" in d else
              f"1.01 × sklearn's final training loss ({d['target_train_loss']:.4f})")
    lines.append(_footer(d, f"median of {d['header']['reps']} runs after a warm-up; epoch time "
                            f"= median of epochs 2..E; target = {target}"))
    return lines


def _hogwild_fits(d):
    """The whole fits' table (bench/hogwild.py: run_fits)."""
    staged = any(r["competitor"].endswith("-fresh") for r in d["fits"])
    lines = ["\nWhole fits as a user waits for them (`fit(X, y)`, `tol=None`" + (
             "; `fresh`: the first fit on the matrix, which builds the hot-first rows; "
             "`reused`: a refit on the same matrix, whose kept layout is checked and reused"
             if staged else "") + "):\n",
             "| competitor | workers | max_iter | fit s | vs 1 worker, paired (range) | "
             "cores near / far (reps) | vs sklearn | held-out accuracy | train loss |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d["fits"]:
        v1 = (f"{r['speedup_vs_1']:.2f}× ({r['speedup_vs_1_range'][0]:.2f}–"
              f"{r['speedup_vs_1_range'][1]:.2f})" if r["workers"] > 1 else "–")
        nf = " / ".join(f"{r[f'speedup_vs_1_{p}']:.2f}× ({r[f'reps_{p}']})"
                        if f"speedup_vs_1_{p}" in r else "–" for p in ("near", "far"))
        vs = f"{r['speedup_vs_sklearn']:.2f}×" if "speedup_vs_sklearn" in r else "–"
        lines.append(f"| {r['competitor']} | {r['workers']} | {r['max_iter']} | "
                     f"{r['fit_s_median']:.3f} | {v1} | {nf if r['workers'] > 1 else '–'} | "
                     f"{vs} | {r.get('val_accuracy', float('nan')):.4f} | "
                     f"{r['train_loss']:.4f} |")
    hs = [h for pair in d.get("handoff_ns_fits", []) for h in pair if h is not None]
    if hs:
        lines.append(f"\nCores near / far: the repetitions in which a cache line's handoff "
                     f"between two threads, measured before and after, was under / over "
                     f"{common.FAR_HANDOFF_NS:.0f} ns (cores sharing a cache or not; here "
                     f"{min(hs):.0f}–{max(hs):.0f} ns). A VM's two vCPUs can move between "
                     "such placements while it runs.")
    return lines


def _hogwild_sweep(d):
    """What hot_features="auto" chooses between (bench/hogwild.py: hot_sweep)."""
    lines = ["\nWhich features two workers buffer (threads; `hot_features` 0: plain, "
             "the H most frequent in a hot-first copy of the rows: top H, or every feature "
             "with the rows read in place), on this problem and on one ten times wider with "
             "about as many nonzeros; ★: what `hot_features='auto'` picks for a fit of 10 "
             "epochs; epoch time the median of epochs 2..4:\n",
             "| problem | features | nonzeros per feature | buffered | workers | s / epoch "
             "| vs 1 worker, paired | train loss after the last epoch | held-out accuracy |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in d["hot_sweep"]:
        star = " ★" if r["auto"] else ""
        lines.append(f"| {r['problem']} | {r['n_features']:,} | "
                     f"{r['nnz'] / r['n_features']:.0f} | {r['variant']}{star} | "
                     f"{r['workers']} | {r['epoch_s']:.3f} | {r['speedup_vs_1']:.2f}× | "
                     f"{r['train_loss']:.4f} | {r.get('val_accuracy', float('nan')):.4f} |")
    return lines


def _hogwild_table(d):
    lines = _hogwild_speed(d)
    if d.get("fits"):
        lines += _hogwild_fits(d)
    if d.get("hot_sweep"):
        lines += _hogwild_sweep(d)
    hl = d.get("hot_layout_s")
    n_features = d.get("problem", {}).get("n_features")
    if hl and hl["hot_features"] and hl["hot_features"] == n_features:
        lines.append(f"\nBuilding the rows the kernels read, once per fit: every feature "
                     f"buffered with several workers, the rows read in place (no copy) "
                     f"{hl['hot_s']:.3f} s; the plain rows {hl['plain_s']:.3f} s.")
    elif hl and hl["hot_features"]:
        lines.append(f"\nOne-time cost per fit, not in the epoch times: the hot-first copy "
                     f"of the rows ({hl['hot_features']} hot features, used with several "
                     f"workers) {hl['hot_s']:.3f} s (a refit, which reuses the kept layout "
                     f"after checking its fingerprint: {hl.get('hot_reused_s', float('nan')):.3f}"
                     f" s); the plain rows {hl['plain_s']:.3f} s.")
    st = d.get("staleness", {})
    if st:
        lines += ["\nStaleness (updates applied by other workers between a worker's read "
                  "and its write; instrumented runs, 2 epochs):\n",
                  "| backend-workers | mean tau | share with tau = 0 | largest tau seen |",
                  "|---|---:|---:|---:|"]
        for k, v in st.items():
            top = v["max_tau_bin"]
            plus = "+" if top == len(v["hist"]) - 1 else ""
            lines.append(f"| {k} | {v['mean_tau']:.2f} | {100 * v['frac_tau0']:.1f}% | "
                         f"{top}{plus} |")
    tr = d.get("torch")
    if tr:
        lines.append(f"\nPyTorch {tr['version']} Hogwild in the style of its mnist_hogwild "
                     f"example (`--torch`: shared `nn.Linear`, sparse CSR minibatches of "
                     f"{tr['batch']}, SGD lr {tr['lr']}, one epoch, one run): " +
                     "; ".join(f"{x['workers']} process{'es' if x['workers'] > 1 else ''} "
                               f"{x['epoch_s']:.2f} s per epoch" for x in tr["runs"]) + ".")
    return "\n".join(lines)


def _counter_table(d):
    lines = [_rate_table(d), "", "`read()` error while two threads increment:", "",
             "| counters m | stickiness | mean \\|read−exact\\|/m | p99 | max | "
             "error_bound()/m |", "|---:|---:|---:|---:|---:|---:|"]
    for e in d["read_error"]:
        lines.append(f"| {e['n_counters']} | {e.get('stickiness', 1)} | {e['mean']:.2f} | "
                     f"{e['p99']:.2f} | {e['max']:.2f} | {e['bound_per_counter']:.1f} |")
    return "\n".join(lines)


#: tables written here; the other scenarios' modules write their own (summary_markdown)
_TABLES = {"pq-threads": _rate_table, "pq-processes": _rate_table, "quality": _quality_table,
           "hogwild": _hogwild_table, "counter": _counter_table,
           "mq-harness": lambda d: importlib.import_module("bench.mq_harness").summary_markdown(d)}


SCENARIOS = (
    Scenario("pq-threads", "Hold model, threads (operations/s)", (
        "Prefill 1M keys uniform in [0, 2^32); each worker repeats *pop, then push the key + "
        "U[0, 2^32)*; a pop and a push count as two operations. `mq-nogil`: the MultiQueue's "
        "compiled hold loop (`mq._hold`, nogil, 2 queues per worker); `mq1-nogil`: the same "
        "with one queue (one lock); `mq-sticky`: the same with `stickiness` (`--stickiness`, "
        "default 8: a thread keeps one random pair of queues for that many operations, "
        "popping the smaller top and pushing to either); `mq-bulk`: `pop_many(256)` + `push_many` from Python; "
        "`mq-python`: Python-level `pop()` + `push()`; `heapq+lock`: `heapq` behind a "
        "`threading.Lock`; `queue.PriorityQueue`; `cxx-mq` (with `--cxx-mq PATH`): the C++ "
        "MultiQueue of Williams, Sanders and Dementiev running the same loop "
        "(`bench/cxx/mq_hold.cpp`) with its default policy, and `cxx-mq-sticky`: its "
        "StickRandom policy at the same stickiness as `mq-sticky`. After the timings, the "
        "kit's hold-loop configurations are run again with every operation logged, and the "
        "rank error of their pops is reported (see the quality section)."), ("pq-threads.png",)),
    Scenario("mq-harness", "Hold model in the C++ MultiQueue's own harness (operations/s)", (
        "The `monotonic` benchmark of the C++ MultiQueue's harness (multiqueue_experiments, "
        "Williams, Sanders and Dementiev, ESA 2021): threads pinned by the harness, keys "
        "prefilled uniform in [1, 2^20], batches of iterations from a shared counter, each "
        "*pop, push the key + an update uniform in [0, 2^20]*, the updates drawn before the "
        "clock starts. `cxx-harness`: built with its `mq_random` queue (two-choice pops, random "
        "pushes, 8-ary heaps with 16-element buffers, 2 queues per thread, `-O3 -DNDEBUG "
        "-march=native`); `kit-harness`: the same harness source with only its queue swapped "
        "for the kit's compiled core (`bench/cxx/kit_mq.hpp`), called from the harness's "
        "threads. Needs checkouts of both (`--harness`, `--mq-lib`); not part of `all`. On a "
        "small VM, each two-thread process lands in a fast or a slow regime that slows both "
        "threads evenly and both queues alike. The threads keep running in the slow one (their "
        "CPU time rises, steal time stays near zero), and two threads that share no cache line "
        "scale 2x run after run; the cache-line handoff between the vCPUs, measured inside the "
        "process just before and just after its run, can differ between the two ends of one "
        "process (whatever sets the regime can change while a process runs); huge pages and "
        "the data's seed do not tell the regimes apart. A run's two-thread figures thus rest "
        "on how many of its rounds drew the slow regime, a share that changes from hour to "
        "hour: the quartiles of the paired ratios show the spread. A heap that stays in cache "
        "(`incache16k`: `--prefill-total 16384`) shows the regimes without the heap's misses: "
        "there, two threads of either queue run anywhere from under half to 1.7 times one thread's "
        "rate. On a 16-CPU Intel Xeon VM (`device16c`: 21 rounds; `device16cw8`: 1 to 8 "
        "threads, 7 rounds; both made before the kit moved its journal out of the guard's "
        "line) the two-thread rounds are steady: the kit's core is level with the C++ at one "
        "thread and trails it at two in nearly every round, and both scale from one thread "
        "to two by well under 1.8x; a `-march=native` build of the kit (`RELAXED_NATIVE=1`) "
        "and transparent huge pages switched off for both binaries did not move that gap in "
        "earlier runs.")),
    Scenario("pq-processes", "Hold model, processes sharing one queue (operations/s)", (
        "The hold model with worker processes attached to one shared MultiQueue; "
        "`manager-pq`: a `queue.PriorityQueue` served by a `multiprocess` Manager (10k "
        "prefill: a million operations through a proxy take minutes)."), ("pq-processes.png",)),
    Scenario("quality", "Relaxation quality: rank error of pops", (
        "The hold loop with every operation logged (a TSC stamp taken while the queue's lock "
        "is held), replayed afterwards by `relaxed.quality.replay`: the rank error of a pop is "
        "how many present keys were smaller than the one popped; its delay is how many pops "
        "returned a larger key while an element waited. Theory for two-choice pops: "
        "5/6·n − 1 + 1/(6n) (Walzer and Williams 2025). A thread descheduled while it holds "
        "a queue's lock freezes that queue, so runs with such a pause are shown apart."),
        ("quality-rank-cdf.png",)),
    Scenario("counter", "MultiCounter increments (increments/s) and read error", (
        "`increment_many` on a MultiCounter with 4 counters per worker (`multicounter`: a "
        "fresh two-choice every increment; `multicounter-sticky`: `stickiness=1024`, the "
        "choice kept for up to 1,024 increments, each still one atomic add of 1, and given up "
        "at once when another handle adds to the same counter), on threads and on processes "
        "sharing one segment, beside a single atomic counter (`MultiCounter(1)`) and an int "
        "behind a `threading.Lock`; the `read()` error is measured while two threads "
        "increment, each read bracketed by two exact sums."), ("counter.png",), (
        "A textbook MultiCounter increment reads two random counters that the other cores "
        "keep writing, so on a few cores a single contended atomic, whose line stays with one "
        "core for bursts, can be faster. The sticky variant pays those reads once per 1,024 "
        "increments, and two handles that meet on one counter part at once, so each thread "
        "mostly adds to a line it alone holds; its price is a "
        "wider read error (`error_bound()` is s times the textbook one: run by run it is "
        "two-choice with balls of weight s). `read()` must stay "
        "within `error_bound()`.")),
    Scenario("hogwild", "Hogwild SGD", (
        "`make_rcv1_like(220_000, 50_000)`: 200,000 training rows and 20,000 held out; log "
        "loss, alpha 1e-4, 'optimal' learning rate, 5 epochs; after every epoch the training "
        "log loss and the held-out accuracy; the target: scikit-learn's final held-out "
        "accuracy minus half a point. Competitors: scikit-learn's `SGDClassifier` (one epoch per `partial_fit`); "
        "the kit's Hogwild on threads and on processes (the calling process is worker 0, "
        "the others are forked per fit) as a `fit` of 10 or more epochs runs "
        "it (`hot_features='auto'`: with several workers every feature buffered per "
        "worker, the rows read in place; on wider data the most frequent ones, in a copy "
        "of the rows timed apart); "
        "`hogwild-plain` (threads, `hot_features=0`: textbook Hogwild); `locked` (the plain "
        "kernel with a spinlock around every sample's read-modify-write); with `--cxx`, a "
        "plain C++ Hogwild (`bench/cxx/hogwild.cpp`, `g++ -O3 -march=native`, the same "
        "algorithm with `std::thread`, no prefetching, no hot buffers); with `--torch`, "
        "PyTorch Hogwild in the style of its mnist_hogwild example. Epochs run back to back "
        "as in a fit; training losses and held-out accuracies are computed afterwards from "
        "copies of the weights taken after every epoch, outside the timed region. Speed-ups against one worker are "
        "paired: a competitor's T-worker run follows its 1-worker run in every repetition, "
        "and the median of the per-repetition ratios is reported."), ("hogwild.png",), (
        "`hogwild-plain` against `hogwild-threads` shows what the per-worker buffers "
        "save: in textbook Hogwild the cache lines of the most frequent "
        "features move between the cores on almost every sample. `locked` shows the price of "
        "serialising the updates instead.")),
    Scenario("mis", "Greedy MIS and matching", (
        "Wasted iterations of MIS on one thread (a sequential simulation of the scheduler; "
        "MultiQueue with `batch=1`) over 10 seeds at n = 10^4, 10^5, 10^6 (Erdős–Rényi, "
        "average degree 10) against q and k, with log-log slopes; then time per call on a "
        "1M-vertex, 10M-edge Erdős–Rényi graph with random priorities: sequential greedy in "
        "Numba with the same priorities (order given, and with `np.argsort` computing it), "
        "the kit's default prefix engine and the MultiQueue scheduler on 1..T threads (whole "
        "calls, and the engine alone) and the exact scheduler, every answer checked equal to "
        "the sequential one; with `--pbbs PATH`, PBBS's incremental (deterministic "
        "reservations) and serial MIS and matching binaries on the same graph and "
        "priorities, relabelled by priority as PBBS reads them; networkx's "
        "`maximal_independent_set` at 100k vertices (one run)."),
        ("mis.png",), (
        "With q = 2 the two random choices are always both queues, so that MultiQueue is "
        "exact (nothing wasted). The MultiQueue engine pays a scheduler pop for every task; "
        "the prefix engine serves the ranks in order and pays only for the tasks a thread "
        "must keep because it runs ahead of the others.")),
    Scenario("delay", "The price of asynchrony: SGD on stale weights", (
        "A deterministic serial simulation (Numba) of SGD whose step t takes its gradient at "
        "the weights of step t − τ (\"max\": every step as stale as the bound allows) or "
        "t − u, u uniform in [0, τ], for τ = 0..64, with heavy-ball momentum 0, 0.5, 0.9 at "
        "the same effective step; log loss and squared loss on a dense 20,000 × 50 problem, "
        "with 5,000 more rows of it held out; reported: the final training loss minus the "
        "loss at τ = 0 and, beside it, the final weights on the held-out rows: the held-out "
        "accuracy and its gap to τ = 0 in points (log loss) and the held-out loss minus "
        "that at τ = 0 (squared loss, a regression); findings: up to which τ the held-out "
        "accuracy stays within one binomial standard error of τ = 0. The delay is set, not "
        "left to the scheduler, so the figures do not depend on the machine."), ("delay.png",)),
    Scenario("mf", "Hogwild matrix factorization", (
        "`make_ratings(100_000, 10_000, 2_000_000)` split 90/10, 20 factors, 3 epochs, "
        "threads and processes at 1..T workers; the whole fit is timed (process start-up and "
        "shared-factor setup included) and divided by the epochs; train and test RMSE."),
        ("mf.png",)),
    Scenario("ps", "Parameter server with a straggler: policies and transports", (
        "Two parts, run in the same repetitions. *Policies*: `make_rcv1_like(25_000, 2_000)`: "
        "20,000 training rows, the last 5,000 held out; 4 workers, worker 0 slowed 4×, 8 "
        "weight shards; each policy run for 4 s per "
        "repetition on each transport (`--backend shm|ray|both`: worker processes on shared "
        "memory; on Ray worker actors of 1 CPU on one node sharing a node-local replica in "
        "shared memory, its agent syncing with the global server actors, on a local Ray "
        "instance declaring max(CPU count, workers) CPUs, its actors at nice 0 as the "
        "worker processes), interleaved policy by policy with the transports in turn, plus "
        "a SaPS control run with no slowdown per transport; the "
        "time to a loose (0.93), the main (0.935) and a tight (0.94) target held-out accuracy "
        "from the coordinator's history (sampled every 20 ms on 4096 held-out rows), the "
        "final held-out accuracy (all 5,000 rows) and training loss, "
        "updates and updates/s, mean push staleness, minibatches stolen, the straggler "
        "partition's epochs over the others', SaPS detections. *Rates*: dense ASP with no "
        "slowdown, 2 and 4 workers, 2 s per run on each transport: pushes/s; and Ray's own 1:1 "
        "actor-call rate on the same machine (a trivial method of one actor, called one at a "
        "time, and with 32 calls in flight; medians of three 1 s loops). *Transport*: the "
        "store verbs alone on shared memory (`ShmLink` on a `ParameterStore`, from processes "
        "forked as the backend forks them; a Ray worker's verbs are the same loads and stores "
        "on its node's replica): 1 worker, then 4 at once, each repeating `pull` and `push` "
        "(a dense 2,000-float gradient) for 1 s; median latencies and pushes/s summed over "
        "the workers. Ray's actors are started by the warm-up repetition and reused by the "
        "later ones (one `RaySession`), so start-up is not timed."),
        ("ps.png",), (
        "The loss-against-updates panel shows that both transports run the same algorithm; "
        "the loss-against-time panel shows what the transport costs. On Ray a worker's step "
        "is the shared-memory step on its node's replica, so within a node Ray trains at "
        "shared-memory speed; only the node's agent makes actor calls, one round trip per "
        "sync to each global server. On a box with few cores Ray's own processes (the "
        "raylet, the agent, the servers) compete with the workers for the CPU.")),
    Scenario("eager", "eager-SGD: collectives and partial-collective training", (
        "Two parts, in one run. *Collectives*: a float64 allreduce of 1, 4 and 16 MB among 2 "
        "and 4 ranks on shared memory (`ShmGroup`, forked processes; per round the slowest "
        "rank's median over 20 rounds) beside `np.copyto` of the same bytes in one process "
        "(`memcpy`) and, under `mpiexec -n P` (MPICH from PyPI), the kit's `MPICommunicator` "
        "(`mpi`) and a bare in-place `MPI_Allreduce` (`mpi-bare`); then the round latency of "
        "an 8-element buffer (2000 rounds) for sync, solo and majority. *Trainer*: "
        "`make_rcv1_like(25_000, 2_000)` (20,000 training rows, the last 5,000 held out), 4 "
        "ranks, batch 64 per rank, lr 8, late gradients "
        "carried, averaged over the 4 ranks; each round one rank drawn from the shared seed "
        "sleeps before its gradient (the paper's imbalance model); sync, solo and majority "
        "interleaved, each run for the same wall time, on shared memory and under `mpiexec -n "
        "4`; the time to the target held-out accuracy (0.935) from rank 0's history (every "
        "50 ms, 4096 held-out rows), the final held-out accuracy (all rows) and training loss, "
        "rounds per second, share of the ranks' gradients that made their own round. Medians "
        "over the repetitions."), ("eager.png",), (
        "Under the paper's model a synchronous round lasts as long as its sleeping rank; a "
        "solo round closes at the first arrival and a majority round at its initiator's, so "
        "they run more rounds per second with fewer fresh gradients in each (the others "
        "follow in a later round, carried). The 4 ranks share 2 cores here, so sleeping ranks "
        "also lend their core to the others. On MPI every round also pays the hand-off "
        "between each rank's training thread and its progress thread, and the 4 ranks run 8 "
        "threads on the 2 cores, so a round's own cost is a large part of the sleep it saves; "
        "the majority round, which still waits whenever its initiator sleeps, gains least "
        "there.")),
    Scenario("compress", "Sparsified gradients: TopK with error feedback, QSGD, DGC", (
        "Three parts, in one run. *Selection*: the k largest |g| of 1M float32 values "
        "(Gaussian and Cauchy) for k/n from 0.01% to 10%: the kit's `TopK.compress` (the "
        "whole call) and its selection kernel beside `np.argpartition` of |g| (selection "
        "alone, unordered) and DGC's sampled threshold; interleaved rounds, medians. "
        "*What top-k leaves out*: ||G - TopK(G)|| / ||G|| against k/n for minibatch "
        "gradients of the large problem at w = 0 and after one epoch, the accumulator "
        "of a top-0.1% run with error feedback, and a Gaussian vector, beside the "
        "worst-case bound sqrt(1 - k/n). *Training*, 2 workers, batch 64, 10 epochs, on the "
        "parameter server (asp, shared memory) and the eager trainer (sync allreduce, "
        "shared memory, and under `mpiexec -n 2` for dense and top-0.1%): a small problem, "
        "`make_rcv1_like(25_000, 2_000)` split into 20,000 training and 5,000 held-out rows "
        "(lr 8, alpha 1e-4), dense against TopK at k/n = 0.01%, 0.1%, 1%, 10% with and "
        "without error feedback, QSGD (16 levels, no feedback) and DGC's threshold (0.1%, "
        "with feedback) on the parameter server; a large one, `make_rcv1_like(220_000, "
        "50_000)` split 200,000 / 20,000 (lr 8, alpha 1e-6), dense against top-0.1% with "
        "and without error feedback. 3 seeds, interleaved; the problems are drawn once "
        "(the `mpiexec` runs draw theirs from each run's seed, through `python -m sgd_shm "
        "eager`). Per configuration, against the dense run of the same seed: the final "
        "held-out accuracy (all held-out rows) and its gap in points (median and range), "
        "the time to within 1 point of that dense run's final held-out accuracy (on the "
        "trainer's 4,096-row held-out sample), the final training loss (4,096 training "
        "rows) and its gap, bytes sent against dense (8 bytes per weight per gradient), "
        "bytes per step, seconds. *Error feedback*: for each k, the held-out accuracy of "
        "TopK with minus without error feedback, paired by seed, against the run-to-run "
        "spread (the larger range over the seeds of either's held-out accuracy): "
        "measurable when every seed's difference exceeds it. Times are wall clock on a "
        "2-core machine shared with other jobs: noisy."), ("compress.png",), (
        "A sparse message holds k int32 indices and k float64 values, so top-0.1% sends "
        "1/667 of the dense bytes. Without error feedback the entries below the top k are "
        "lost, and on sparse data most coordinates are never the largest of a minibatch "
        "gradient: the weights of the rarer features barely move, and the held-out rows "
        "that rest on them are misclassified more often. With error feedback they "
        "accumulate until they are sent, so every coordinate's total update is kept, only "
        "delayed, which costs epochs at the start and little at the end. The larger k, "
        "the more of each minibatch gradient is sent anyway, so the two converge. On "
        "shared memory moving bytes is cheap, so the time a compressed run saves is small "
        "or negative (selecting, accumulating and decoding cost more than the copy); the "
        "bytes are what a network would carry.")),
    Scenario("unreliable", "Training over unreliable links: RPS against drop rate and servers", (
        "The Robust Parameter Server (Yu et al., ICML 2019) on `make_rcv1_like(25_000, "
        "2_000)` split into 20,000 training and 5,000 held-out rows, `train(policy=\"rps\", "
        "drop=p, n_shards=S, epochs=5, lr=8, eval_set=...)`, p in {0, 0.01, 0.05, 0.1, 0.2, "
        "0.3}, S in {1, 2, 4, 8, 16}, with 4 workers and with as many workers as servers; "
        "ASP with the same losses (8 shards) beside it. Every message between a worker and "
        "a server, both directions, is lost with probability p. Each run at p is compared "
        "with the run at p = 0 of the same seed (the repetitions are 5 seeds): the median "
        "and range over the seeds of the gap of the final held-out accuracy (all held-out "
        "rows, in points) and, beside it, of the relative gap of the final training loss "
        "(4,096 training rows); rounds per second; held-out accuracy against epochs (first "
        "seed); findings on the paper's claims, each gap beside the seeds' spread."),
        ("unreliable.png",), (
        "An RPS run is determined by its seed, so its accuracies and losses do not depend "
        "on the machine's load; its rounds per second do. More servers split a lost message "
        "into smaller pieces; with the workers fixed every block is still averaged over the "
        "same replicas. A gap whose seeds fall on both sides of 0 is run-to-run noise, not "
        "an effect of the losses.")),
    Scenario("nonconvex", "Non-convex training: an MLP by Hogwild, blocks and synchronous SGD", (
        "A one-hidden-layer ReLU network (64 units, softmax output, alpha 1e-4) on "
        "`load_digits` (30% held out, minibatch 32, 30 epochs) and on a generated non-linear "
        "problem (20,000 Gaussian rows of 100 features labelled by a random ReLU network, 20% "
        "held out, minibatch 64, 12 epochs), lr 0.1 x (1 - momentum): "
        "`MLPClassifier(solver=\"sgd\")`; Hogwild (`HogwildTrainer`, threads) without and "
        "with block partitioning (arXiv:1905.11845; layers x workers times the epochs, since "
        "an iteration moves one block); synchronous minibatch SGD (the eager trainer's "
        "allreduce, heavy-ball momentum); momentum 0 and 0.9, 1 and 2 workers; the parameter "
        "server (ASP, 2 workers) without and with blocks. Per setting: held-out accuracy "
        "against epochs and training seconds, the final held-out accuracy and its gap in "
        "points to MLPClassifier's at the same momentum (paired by seed: median and range), "
        "seconds per epoch, and the time to MLPClassifier's final held-out accuracy minus "
        "1.5 points, MLPClassifier's own beside it; medians over 5 seeds, interleaved; "
        "findings state each MLP trainer against MLPClassifier as that time and that gap, "
        "and the paper's ~1.2x speed-up from partitioning. Scaling: `HogwildMLPClassifier` "
        "on 50,000 x 200 Gaussian rows (5,000 more held out; hidden (256, 128), minibatch "
        "200, lr 0.01, momentum 0.9), 1 worker against 2 threads and 2 processes, per epoch "
        "and per whole `fit` of 3 and 10 epochs, training and held-out accuracy of each "
        "fit, at least 6 repetitions, with a cache-line handoff between two threads "
        "measured around each (cores sharing a cache or not). Times are wall clock on a "
        "2-core machine shared with other jobs: noisy."), ("nonconvex.png",), (
        "A partitioned iteration computes the gradient of one block only (the backward pass "
        "stops at the block's layer) and writes only that block, so workers never write the "
        "same weights; it also moves fewer weights per minibatch, so it needs more epochs "
        "for the same accuracy, and whether the cheaper iterations win depends on how much "
        "of the network's cost the skipped layers carry. On 2 cores shared with the "
        "coordinator, the parameter server and the synchronous trainer pay for messages "
        "and rounds that Hogwild's threads do not.")),
    Scenario("stm", "TL2 STM: commits/s (abort rate)", (
        "Each worker runs the nogil bank driver (a transaction reads two random accounts and "
        "moves up to 10 between them; 100k per worker) on 64 accounts (contended) and 4096, "
        "for both clocks and every requestor-aborts policy, on threads and on processes; and "
        "the integer-set driver (sorted linked list of 256 keys, 20% updates). The sum of all "
        "accounts is checked after every run."), ("stm.png",), (
        "With the MultiCounter clock a transaction's start sums all counters, which other "
        "cores keep writing; it pays off when many threads contend on the global clock's one "
        "line.")),
    Scenario("clock", "The parameter server's version clock: exact vs MultiCounter (pushes/s)", (
        "1 and 2 processes push a fixed gradient to one 8-weight store of one shard as fast "
        "as they can (`push`: pull, then push, as a worker does without the gradient), with "
        "`clock=\"exact\"` (one atomic word) and `clock=\"multicounter\"` (4 counters per "
        "process); `clock`: only the clock's part of a push (a read and an increment, through "
        "the same calls the store makes). Every setting runs in each repetition, in a random "
        "order; the ratio is the median of the per-repetition ratios."), ("clock.png",), (
        "A push from Python costs tens of microseconds (argument checks, the shard's lock, the "
        "slot counters); the global version's atomic add is one of many writes to shared "
        "lines in it, so with 2 processes the one clock line is not what limits pushes/s and "
        "the MultiCounter clock cannot pay here: its gain, if any, needs many cores writing "
        "the clock at once. The `clock` rows compare the clocks' calls alone (the exact "
        "clock's add goes through a Numba dispatcher from Python, the MultiCounter's through "
        "Cython methods), which is why they can differ where the pushes do not. See "
        "docs/parameter-server.md, \"Clocks\".")),
    Scenario("sim", "At cluster scale, simulated: policies, collectives and compression at "
             "32-1,024 workers", (
        "The virtual-time simulator (`sgd_shm.sim`, see docs/sim.md) runs the kit's own "
        "policy objects, collective rules, compressors and linear model on "
        "`make_rcv1_like` problems with held-out rows; the seconds are virtual (a cluster's, "
        "by the simulator's compute and network models), the losses and held-out accuracies "
        "real. Parts: SaPS against BSP, ASP and SSP at 32 and 128 workers of a heterogeneous "
        "cluster (a quarter of the workers 4× slower); solo and majority against sync at 64 "
        "ranks under the eager-SGD imbalance model; RPS's final-loss gap to the reliable run "
        "against servers and drop rate at 64 workers; TopK 0.1% against dense at 1, 10 and "
        "100 Gb/s; the simulator's own wall time at 1,024 workers; and calibration against "
        "real runs at 2 and 4 workers on this box. Repetitions are seeds; medians."),
        ("sim_saps.png", "sim_eager.png", "sim_rps.png", "sim_topk.png"), (
        "The simulator's time is its models', not a measurement: the at-scale parts show what "
        "the policies and collectives do under the stated cluster and network, and the "
        "calibration part shows how far those models are from this box's real runs.")),
    Scenario("torch_nets", "Hogwild on a PyTorch CNN: 1 and 2 workers beside mnist_hogwild", (
        "`HogwildNetClassifier` on `DigitsCNN` (the kit's LeNet-like reference network) and "
        "50,000 augmented digits (`make_digits_augmented`; held-out accuracy on the 360 "
        "untouched held-out digits): 1 and 2 workers on threads and on processes, block "
        "partitioning on and off, beside a loop written the way PyTorch's `mnist_hogwild` "
        "example writes it (`model.share_memory()`, P processes each with its own "
        "`DataLoader` and `torch.optim.SGD`), from the same initial weights, the same total "
        "work, one torch thread per worker. Per run: training samples per second (start-up "
        "excluded for every competitor), CPU seconds per 1,000 samples, final held-out "
        "accuracy; repetitions interleaved after a warm-up; medians."), ("torch_nets.png",), (
        "On a machine that other jobs share, a 2-worker run's wall clock depends on getting "
        "two cores at once; its CPU time per sample shows whether a worker does more work "
        "per sample than alone (on two free cores the speed-up is at most 2 / that ratio).")),
    Scenario("torch_ddp", "PyTorch DDP communication hooks on a CNN: partial allreduce "
             "and TopK", (
        "`DigitsCNN` (the kit's LeNet-like reference network) on scikit-learn's digits "
        "(`load_digits_split`: held-out images untouched), P = 2 processes of an unchanged "
        "PyTorch DDP loop (gloo on the CPU, one intra-op thread per rank, `torch.optim.SGD`). "
        "*Imbalance*: before each step one rank, drawn from a seed all ranks share, sleeps "
        "(the eager-SGD paper's model); DDP's own allreduce against "
        "`sgd_shm.torch.hooks.partial_allreduce_hook` with solo and majority rounds on the "
        "kit's shared-memory communicator (late gradients dropped, the mean over a round's "
        "contributors), the same epochs: seconds to the target held-out accuracy, final "
        "held-out accuracy, steps/s, contributors per round. *Compression*: "
        "`compression_hook` with TopK at 0.1% of each bucket, with and without error "
        "feedback, against dense allreduce, the same epochs: final held-out accuracy and "
        "bytes. Repetitions interleaved after a warm-up; medians. Runs kept with `--label` "
        "(the 50,000-image augmented set; momentum 0.9 with DGC's momentum correction) are "
        "shown under the main one."), ("torch_ddp.png",), (
        "With 2 ranks a solo round holds one gradient and a majority round one or two, so "
        "the faster rounds are paid for with fewer gradients per round: the partial "
        "collectives' gain needs many ranks of which few are slow, which a 2-core box "
        "cannot run (see `python -m bench sim` for 64 ranks). A TopK message without error "
        "feedback loses every entry below the top k for good; with it they are sent late.")),
    Scenario("schedules", "Step-size schedules near a network's stable edge", (
        "`DigitsCNN` (the kit's LeNet-like reference network, weights from the seed) on "
        "scikit-learn's digits (`load_digits_split(0.2)`: 1,437 training images, 360 held "
        "out), minibatches of 32, 2 workers, step 0.1 held constant against "
        "`Cosine(0.1, total=N)` (N: the constant run's updates or rounds, so the step "
        "falls to 0.001 by the last one): the parameter server with ASP (5 epochs, no "
        "momentum) and the eager trainer's allreduce, solo and majority allreduce (8 "
        "epochs, heavy-ball momentum 0.9, late gradients carried). Repetitions are seeds, "
        "both steps back to back within a seed; per trainer and step: the final training "
        "loss (median, worst) and the last model's held-out accuracy (median, quartiles, "
        "lowest), and the paired held-out difference cosine − constant."),
        ("schedules.png",), (
        "At a constant step near the edge of stability, stale gradients (asynchronous "
        "pushes, late gradients carried into a later round, where a streak of them lands "
        "at once) and momentum throw the model off now and then, and the last model is "
        "whatever the last such burst left; a step that falls towards the end of the run "
        "settles it. The spread of the constant step's runs is the point here, so read "
        "the lowest and the quartiles beside the medians.")),
    Scenario("conflict", "Conflict policies: empirical competitive ratios (simulator)", (
        "Each policy against exponential, heavy-tailed (Lomax) and adversarial holder times "
        "under requestor-aborts and requestor-wins (k = 1, 4), 200k conflicts per cell, 5 "
        "repetitions; the exact worst case by numerical integration beside Monte Carlo. No "
        "timing: the figures do not depend on the machine."), ("conflict.png",)),
)


def _tables(sc: Scenario, d: dict) -> str:
    if sc.name in _TABLES:
        return _TABLES[sc.name](d)
    return importlib.import_module(f"bench.{sc.name}").summary_markdown(d)


def _machines(loaded) -> list[str]:
    """One row per distinct machine and software stack found in the results' headers
    (``loaded``: (scenario name as listed, results) pairs)."""
    seen = {}
    for name, d in loaded:
        h = d["header"]
        key = (h["cpu"], h["cpu_count"], h.get("platform", "?"), h["python"], h["numpy"],
               h.get("numba", "?"))
        seen.setdefault(key, []).append(name)
    lines = ["| CPU | CPUs | platform | python | numpy | numba | scenarios |",
             "|---|---:|---|---|---|---|---|"]
    for (cpu, n, plat, py, npv, nb), names in seen.items():
        lines.append(f"| {cpu} | {n} | {plat} | {py} | {npv} | {nb} | {', '.join(names)} |")
    return lines


INTRO = """\
# Benchmarks

<!-- generated by `python -m bench plot` from bench/results/*.json: edit bench/report.py,
     not this file -->

Every figure of the kit is on this page, computed from the JSON files that the benchmark
runs write. To reproduce or extend them on your machine:

```bash
python -m bench all                           # every scenario at 1..CPU-count workers, 5 reps
python -m bench pq-threads --workers 1-16 --reps 7
python -m bench plot                          # PNGs and this page from the JSON
```

Method: every run prints and stores a header (command, versions, CPU, load, seed), does
one warm-up and `--reps` repetitions in which the competitors run interleaved (a noisy
neighbour hurts all of them alike), and writes `bench/results/<scenario>.json`. Tables give
the median and the min–max range. Figures from different runs, and above all from
different machines, are not comparable: compare within one table. `--label NAME` keeps a
run (another machine's, say) beside the main one: it writes `<scenario>@NAME.json`, whose
tables this page shows under the scenario's own.
"""


def _busy(h) -> list[str]:
    """A warning line when the run started on a machine far busier than its CPUs (the
    header's 1-minute load average above three times the CPU count: a run just before it,
    which the average still remembers, stays below): its timings are disturbed, its
    accuracies are not."""
    load = h.get("loadavg_at_start")
    if not load or load[0] <= 3 * h["cpu_count"]:
        return []
    return [f"*Run while the machine was busy (load average {load[0]:.1f} on "
            f"{h['cpu_count']} CPUs, from other jobs): its timings and speed ratios are "
            "disturbed; its accuracies, losses and counts are not.*", ""]


def page(md_dir: Path) -> str:
    """The markdown of the benchmarks page; image links are relative to ``md_dir``."""
    loaded = [(sc, d) for sc in SCENARIOS if (d := _load(sc.name))]
    kept = {sc.name: common.labelled_results(sc.name) for sc, _ in loaded}
    listed = [(sc.name, d) for sc, d in loaded]
    listed += [(f"{name}@{label}", d) for name, runs in kept.items() for label, d in runs]
    parts = [INTRO, "## Machines", "", *_machines(listed), ""]
    if not loaded:
        parts.append("No results yet: run `python -m bench all`.\n")
    for sc, d in loaded:
        parts += [f"## {sc.title}", "", f"`python -m bench {sc.name}`: {sc.definition}", "",
                  *_busy(d["header"]), _tables(sc, d), ""]
        for label, other in kept[sc.name]:
            parts += [f"### The same, kept as `{label}` ({other['header']['cpu']}, "
                      f"{other['header']['cpu_count']} CPUs)", "",
                      f"`{sc.name}@{label}.json` (`--label {label}`): a run kept beside "
                      "the one above; compare within its own tables.", "",
                      _tables(sc, other), ""]
        if sc.notes:
            parts += [sc.notes, ""]
        for png in sc.plots:
            path = common.results_dir() / png
            if path.exists():
                parts += [f"![{sc.title}]({os.path.relpath(path, md_dir)})", ""]
    return "\n".join(parts)


def page_path() -> Path:
    """docs/benchmarks.md for the default results folder; with ``--out DIR``,
    DIR/benchmarks.md, so a run into a scratch folder leaves the docs alone."""
    if common.results_dir().resolve() == common.RESULTS_DEFAULT.resolve():
        return ROOT / "docs" / "benchmarks.md"
    return common.results_dir() / "benchmarks.md"


def write_page() -> Path:
    path = page_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(path.parent))
    return path
